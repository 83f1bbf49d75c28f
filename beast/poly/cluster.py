"""Starting or joining Ray, and leaving nothing behind.

Without `--ray_address`, polybeast starts a private Ray instance for the run
(`address="local"`), bound to 127.0.0.1: Ray's GCS, raylet, object store
and workers listen on loopback only, so a run on a laptop or a shared
server opens no port to the network. Ray resolves 127.0.0.1 to the
machine's outward address unless it is told the machine is not part of a
multi-node cluster (its RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER switch, which
also governs Linux despite the name), so that switch is set to 0 before
Ray starts; the processes Ray spawns inherit it. A user who wants a
cluster asks for one: `ray start --head` on the learner machine, `ray
start --address=HEAD:6379` on the others, then `--ray_address HEAD:6379`
(docs/polybeast.md says how to keep that cluster on a private network).

`ray_session` shuts Ray down however the run ends: for a private instance
that stops every Ray process it started (GCS, raylet, workers); for a
joined cluster it disconnects, and the actors this run created die with
their owner, the driver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

from beast.config import ConfigError
from beast.poly.config import PolyConfig

__all__ = ["ray_session", "LOOPBACK_SWITCH"]

# Ray's switch between "this machine may join a multi-node cluster" (1, its
# default on Linux: node addresses resolve to the outward interface) and
# "single machine" (0: node addresses stay 127.0.0.1, every server binds there).
LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _keep_local() -> None:
    os.environ[LOOPBACK_SWITCH] = "0"
    if "ray" in sys.modules:  # imported already: its constant was read at import
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False


def _private_cpus(config: PolyConfig) -> int:
    """Logical CPUs the private instance offers: room for every server and learner.

    Ray's CPUs are a placement count, not a limit; env servers beyond the cores
    share them, as monobeast's actors do.
    """
    needed = config.servers * config.cpus_per_env_server
    if config.num_learners > 1:
        needed += config.num_learners
    return max(os.cpu_count() or 1, int(needed + 0.999))


@contextlib.contextmanager
def ray_session(config: PolyConfig) -> Iterator[str]:
    """Start (or join) Ray for one run; yields a description of the cluster. ConfigError
    when Ray is not installed."""
    if config.ray_address is None:
        _keep_local()
    try:
        import ray
    except ImportError:
        raise ConfigError("polybeast needs Ray: pip install -e '.[ray]'") from None

    kwargs = dict(
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=True,
        configure_logging=True,
    )
    if config.ray_address is None:
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            num_cpus=_private_cpus(config),
            # Ray starts its workers at nice 15; env servers are the run's actors and
            # must not yield to everything else on the machine (monobeast's actors run
            # at the learner's priority). On a loaded 2-core machine, servers at nice 15
            # starved. A cluster sets this with `RAY_worker_niceness=0 ray start ...`.
            _system_config={"worker_niceness": 0},
            **kwargs,
        )
        where = "a private Ray instance on 127.0.0.1"
    else:
        ray.init(address=config.ray_address, **kwargs)
        nodes = [node for node in ray.nodes() if node["Alive"]]
        where = f"the Ray cluster at {config.ray_address} ({len(nodes)} nodes)"
    try:
        yield where
    finally:
        ray.shutdown()
