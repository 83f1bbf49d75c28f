"""PolyBeast: IMPALA across machines on Ray, with one or more learners.

    python polybeast.py --env PongNoFrameskip-v4                 # private Ray on 127.0.0.1
    python polybeast.py --env PongNoFrameskip-v4 --ray_address HEAD:6379 --num_env_servers 16
    python polybeast.py --mode test --xpid <run>

Flags: `python polybeast.py --help` (monobeast's, plus the cluster's). This
file only parses flags and hands over to beast.poly.trainer /
beast.evaluate; bad input exits with status 2 and one line saying what is
wrong. See docs/polybeast.md.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

PROG = "polybeast.py"


def main(argv: Sequence[str] | None = None) -> int:
    from beast.checkpoint import CheckpointError
    from beast.config import ConfigError
    from beast.envs import EnvError
    from beast.poly.config import parse_poly_args

    try:
        config = parse_poly_args(argv, prog=PROG)
        if config.mode == "test":
            from beast.evaluate import test

            test(config)
        else:
            try:
                import ray  # noqa: F401
            except ImportError:
                print(
                    f"{PROG}: error: polybeast needs Ray: pip install -e '.[ray]'",
                    file=sys.stderr,
                )
                return 2
            from beast.poly.trainer import train
            from beast.runner import TrainingError

            try:
                train(config)
            except (TrainingError, CheckpointError) as error:
                print(f"{PROG}: error: {error}", file=sys.stderr)
                return 1
    except (ConfigError, EnvError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
