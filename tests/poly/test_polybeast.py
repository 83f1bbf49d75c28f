"""polybeast on Ray: env servers, whole-rollout commits, several learners, clusters.

Units run without Ray (EnvServer and the rollout commit are plain Python; the
two-learner check uses torch.distributed in spawned processes). End-to-end
tests run polybeast.py as a user would, with a unique marker in the
environment: every process of the run (driver, Ray's GCS, raylet, workers)
carries it, so leftovers and listening sockets can be found. The cluster
tests build a multi-node Ray cluster on this machine with
ray.cluster_utils.Cluster and run polybeast.py against it.
"""

import functools
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import torch

# Every Ray process these tests start stays on loopback (beast.poly.cluster).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")

from beast.algos.base import LearnerContext  # noqa: E402
from beast.algos.build import config_for  # noqa: E402
from beast.algos.impala import ActorCriticUpdate, impala_loss  # noqa: E402
from beast.algos.policies import CategoricalPolicy, EpsilonGreedyPolicy  # noqa: E402
from beast.config import ConfigError  # noqa: E402
from beast.experience.replay_sink import SequenceSink  # noqa: E402
from beast.experience.rollout_slots import (  # noqa: E402
    RolloutBuffers,
    check_rollout,
    commit,
    rollout_spec,
)
from beast.experience.rollout_source import RolloutSource  # noqa: E402
from beast.experience.sequence_replay import PrioritizedReplay, sequence_spec  # noqa: E402
from beast.fields import box_obs  # noqa: E402
from beast.learning.learner import Learner, Stepper, TrainingProgress  # noqa: E402
from beast.models import build_model  # noqa: E402
from beast.poly.config import PolyConfig, parse_poly_args  # noqa: E402
from beast.poly.env_server import EnvServer, Incarnation  # noqa: E402
from beast.poly.feeders import ServerPool  # noqa: E402
from beast.train_step.optim import build_optimizer  # noqa: E402
from tests.support.runs import (  # noqa: E402
    ROOT,
    best_mean_of_100,  # noqa: E402
    processes_with_marker,
    read_csv,
    wait_until_gone,
)
from tests.support.runs import start as start_script  # noqa: E402

POLYBEAST = os.path.join(ROOT, "polybeast.py")

CARTPOLE_SMALL = [
    "--env",
    "CartPole-v1",
    "--num_env_servers",
    "2",
    "--num_envs_per_server",
    "2",
    "--unroll_length",
    "10",
    "--batch_size",
    "2",
    "--log_interval",
    "1",
    "--num_threads",
    "1",
]


def start(argv, marker):
    return start_script(argv, marker, script=POLYBEAST, stderr=subprocess.STDOUT)


def finish(proc, timeout):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(
            f"polybeast.py still running after {timeout} s:\n{out[-4000:]}"
        ) from None
    return out


def wait_for_rows(log, count, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(read_csv(log)) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{log} did not reach {count} rows")


def listening_addresses(pids: list[int]) -> set[str]:
    """Local addresses of the TCP sockets in LISTEN state that `pids` hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            next(f)
            for line in f:
                parts = line.split()
                local, state, inode = parts[1], parts[3], parts[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    address = local.split(":")[0]
                    if width == 8:
                        found.add(".".join(str(b) for b in bytes.fromhex(address)[::-1]))
                    else:
                        found.add(address)
    return found


LOOPBACK = {"127.0.0.1", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


# --- Config -----------------------------------------------------------------------


def test_env_servers_default_to_the_actor_layout_of_the_config():
    config = parse_poly_args(["--env", "CartPole-v1"])  # configs/impala/classic.yaml
    assert isinstance(config, PolyConfig)
    assert (config.num_env_servers, config.num_envs_per_server) == (2, 4)
    assert config.learning_rate == 0.0015  # the tuned file applies, as in monobeast
    config = parse_poly_args(["--env", "CartPole-v1", "--num_env_servers", "3"])
    assert config.num_env_servers == 3 and config.num_buffers >= 4 + config.batch_size


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--num_learners", "0"], "--num_learners must be positive"),
        (["--num_env_servers", "1", "--num_learners", "2"], "each learner needs"),
        (["--ray_address", "not an address"], "--ray_address must be HOST:PORT"),
        (["--num_buffers", "5"], "--num_buffers 5 is too small"),
        (["--num_env_splits", "2"], "polybeast's env servers step their envs as one batch"),
    ],
)
def test_bad_combinations_are_config_errors(argv, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        parse_poly_args(["--env", "CartPole-v1", *argv])


def test_bad_flags_exit_2_with_one_line():
    result = subprocess.run(
        [sys.executable, POLYBEAST, "--env", "CartPole-v1", "--num_learners", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "polybeast.py: error: --num_learners must be positive, got 0"


# --- Env servers and whole-rollout commits (no Ray) ------------------------------------


def small_config(algo="impala", **overrides) -> PolyConfig:
    values = dict(env="CartPole-v1", unroll_length=5, num_envs_per_server=3, num_env_servers=1)
    values.update(overrides)
    return config_for(algo, PolyConfig)(**values).finalize()


def impala_buffers(num_buffers: int, unroll_length: int = 5) -> RolloutBuffers:
    """Rollout slots laid out as an IMPALA learner's for CartPole (no LSTM)."""
    spec = rollout_spec(
        unroll_length=unroll_length,
        obs=box_obs((4,), np.float32),
        record=CategoricalPolicy(2).record_spec(),
    )
    return RolloutBuffers(spec, num_buffers)


def test_env_server_rollouts_are_contiguous_and_commit_whole():
    config = small_config()
    buffers = impala_buffers(8)
    server = EnvServer(config, 0, buffers.staging_recipe())
    server.load_weights(0, {k: v.numpy() for k, v in server.model.state_dict().items()})
    _, first, _ = server.rollout(0, [])
    first = {k: v.copy() for k, v in first.items()}
    _, second, times = server.rollout(0, [])
    k, steps = 3, config.unroll_length + 1
    assert first["obs"].shape == (k, steps, 4) and first["policy_logits"].shape == (k, steps, 2)
    # Step 0 of a rollout repeats step T of the previous one (the bootstrap step).
    for key in ("obs", "reward", "done", "terminated", "truncated", "action", "policy_logits"):
        np.testing.assert_array_equal(second[key][:, 0], first[key][:, -1])
    # One id per rollout and env, on every step; a new id for the next rollout.
    assert (first["rollout_id"] == first["rollout_id"][:, :1]).all()
    assert not np.intersect1d(first["rollout_id"], second["rollout_id"]).size
    assert 0 < times.env < times.total and 0 < times.policy < times.total

    assert check_rollout(buffers, second) is None
    stop = threading.Event()
    assert buffers.commit(second, stop, row=0)
    slots = [buffers.full_queue.get(timeout=1) for _ in range(k)]
    for env, slot in enumerate(slots):
        assert not buffers.is_torn(slot)
        np.testing.assert_array_equal(buffers.tensors["obs"][slot].numpy(), second["obs"][env])
    wrong = dict(second, obs=second["obs"][..., :3])
    assert "obs" in check_rollout(buffers, wrong)
    with pytest.raises(ValueError, match="does not fit"):
        buffers.commit(wrong, stop, row=0)
    server.close()


def test_env_server_cuts_sequences_for_a_replay_in_the_learner():
    """R2D2 on Ray: the server cuts its T steps into sequences, the learner adds them (and
    the env steps and episodes) to its replay."""
    config = small_config(
        "r2d2", seq_len=4, seq_overlap=2, burn_in=1, replay_size=100, min_replay_size=10
    )
    spec = sequence_spec(
        seq_len=4,
        obs=box_obs((4,), np.float32),
        record=EpsilonGreedyPolicy(2).record_spec(),
        core_state_shapes=[(1, 64), (1, 64)],
    )
    sink = SequenceSink(PrioritizedReplay(spec, 100), num_actors=1, seq_len=4, seq_overlap=2)
    server = EnvServer(config, 0, sink.staging_recipe())
    server.load_weights(0, {k: v.numpy() for k, v in server.model.state_dict().items()})
    stop = threading.Event()
    for _ in range(8):
        _, payload, _ = server.rollout(0, [])
        assert sink.commit(payload, stop, row=0)
    # 8 calls of T=5 steps of 3 envs; the first call's first write is the reset.
    assert sink.total_env_steps() == 8 * 5 * 3 - 3
    assert sink.total_inserted() == len(sink.replay) > 0
    batch = sink.replay.sample(8).batch
    assert batch["obs"].shape == (5, 8, 4) and batch["core_state_0"].shape == (1, 8, 64)
    server.close()


def test_commit_takes_nothing_when_stopped_without_free_slots():
    config = small_config()
    buffers = impala_buffers(4)  # 4 free slots, a rollout needs 3
    server = EnvServer(config, 0, buffers.staging_recipe())
    server.load_weights(0, {k: v.numpy() for k, v in server.model.state_dict().items()})
    _, rollout, _ = server.rollout(0, [])
    stop = threading.Event()
    assert commit(buffers, rollout, stop)
    stop.set()
    assert not commit(buffers, rollout, stop)  # 1 free slot: gives up, writes nothing
    assert buffers.full_queue.qsize() == 3 and buffers.free_queue.qsize() == 1
    server.close()


def test_central_step_ignores_actions_meant_for_another_process():
    config = small_config(policy="central")
    server = EnvServer(config, 0, impala_buffers(4).staging_recipe())
    info, out = server.step(None, None)
    obs = out["obs"].copy()
    assert out["done"].all()  # the first observation starts an episode
    _, out = server.step(np.zeros(3, dtype=np.int64), "a token of a process that died")
    np.testing.assert_array_equal(out["obs"], obs)  # not stepped
    _, out = server.step(np.zeros(3, dtype=np.int64), info.token)
    assert not np.array_equal(out["obs"], obs)
    server.close()


# --- Several learners (torch.distributed, gloo) ---------------------------------------

UNROLL, BATCH, UPDATES, OBS, ACTIONS = 6, 2, 3, 4, 2


def make_batches(seed: int, count: int) -> list[dict[str, torch.Tensor]]:
    """`count` random but well-formed rollouts, [T+1, ...] per field."""
    g = torch.Generator().manual_seed(seed)
    steps = UNROLL + 1
    rollouts = []
    for i in range(count):
        rollouts.append(
            {
                "obs": torch.randn(steps, OBS, generator=g),
                "reward": torch.randn(steps, generator=g),
                "done": (ends := torch.rand(steps, generator=g) < 0.2),
                "terminated": ends,
                "truncated": torch.zeros(steps, dtype=torch.bool),
                "last_action": torch.randint(ACTIONS, (steps,), generator=g),
                "action": torch.randint(ACTIONS, (steps,), generator=g),
                "policy_logits": torch.randn(steps, ACTIONS, generator=g),
                "baseline": torch.randn(steps, generator=g),
                "episode_end": torch.zeros(steps, dtype=torch.bool),
                "episode_return": torch.zeros(steps),
                "episode_step": torch.zeros(steps, dtype=torch.int32),
                "rollout_id": torch.full((steps,), seed * 1000 + i, dtype=torch.int64),
            }
        )
    return rollouts


def run_learner(rollouts, batch_size, reducer=None) -> Learner:
    """The unchanged beast Learner (IMPALA's update) on `rollouts`, in order, until they
    are used up."""

    torch.manual_seed(0)
    model = build_model("mlp", (OBS,), ACTIONS)
    config = PolyConfig(env="CartPole-v1", optimizer="rmsprop", learning_rate=0.01)
    buffers = impala_buffers(len(rollouts), UNROLL)
    for rollout in rollouts:
        slot = buffers.free_queue.get(timeout=1)
        for key, value in rollout.items():
            buffers.tensors[key][slot] = value
        buffers.full_queue.put(slot)
    total_steps = len(rollouts) * UNROLL
    progress = TrainingProgress()
    stepper = Stepper(
        # Small enough that clipping is active: the combined gradient must be clipped.
        grad_norm_clipping=0.0 if reducer is not None else 1.0,
        max_nonfinite_updates=10,
        lr_schedule=config.lr_schedule,
        total_steps=total_steps,
        progress=progress,
        reduce_gradients=reducer,
    )
    loss_fn = functools.partial(
        impala_loss,
        discounting=0.99,
        reward_clipping="abs_one",
        baseline_cost=0.5,
        entropy_cost=0.01,
    )
    context = LearnerContext(torch.device("cpu"), False, stepper, progress)
    learner = Learner(
        update=ActorCriticUpdate(model, context, build_optimizer(config, model), loss_fn),
        source=RolloutSource(buffers, batch_size=batch_size, device=torch.device("cpu")),
        stepper=stepper,
        progress=progress,
        total_steps=total_steps,
        num_learner_threads=1,
        publish=lambda: None,
        on_update=lambda stats: None,
    )
    learner.start()
    assert learner.finished.wait(60), "the learner did not finish"
    learner.stop()
    assert learner.error is None, learner.error
    return learner


def learner_rank(rank: int, world: int, store: str, result: str) -> None:
    from beast.poly.distributed import GradientReducer, broadcast_parameters, init_process_group

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    init_process_group(f"file://{store}", rank, world, torch.device("cpu"), 60)
    # Different initial weights per rank: the broadcast must make them rank 0's.
    torch.manual_seed(rank)
    probe = build_model("mlp", (OBS,), ACTIONS)
    broadcast_parameters(list(probe.state_dict().values()))
    reducer = GradientReducer(1.0, threading.Event(), lambda: None)
    learner = run_learner(make_batches(rank, UPDATES * BATCH), BATCH, reducer)
    torch.save(
        {
            "params": learner.update.model.state_dict(),
            "probe": probe.state_dict(),
            "updates": learner.progress.num_updates,
        },
        result,
    )
    torch.distributed.destroy_process_group()


def test_two_learners_stay_identical_and_match_one_learner_on_both_batches(tmp_path):
    ctx = mp.get_context("spawn")
    store = str(tmp_path / "store")
    results = [str(tmp_path / f"rank{r}.pt") for r in range(2)]
    procs = [
        ctx.Process(target=learner_rank, args=(r, 2, store, results[r]), daemon=True)
        for r in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    rank0, rank1 = (torch.load(path) for path in results)
    assert rank0["updates"] == rank1["updates"] == UPDATES
    for key in rank0["probe"]:  # the start: rank 0's weights everywhere
        assert torch.equal(rank0["probe"][key], rank1["probe"][key])
    for key in rank0["params"]:  # after k updates: bit-identical
        assert torch.equal(rank0["params"][key], rank1["params"][key]), key
    moved = [(rank0["params"][k] - rank0["probe"][k]).abs().max() for k in rank0["probe"]]
    assert max(moved) > 1e-3  # the updates did happen

    # One learner, batch 2B: update j sees rank 0's j-th batch and rank 1's j-th batch.
    mine, theirs = make_batches(0, UPDATES * BATCH), make_batches(1, UPDATES * BATCH)
    combined = []
    for j in range(UPDATES):
        combined += mine[j * BATCH : (j + 1) * BATCH] + theirs[j * BATCH : (j + 1) * BATCH]
    single = run_learner(combined, 2 * BATCH)
    for key, value in single.update.model.state_dict().items():
        # Float tolerance: the sum of two half-batch gradients vs one full-batch
        # backward differ in summation order (about 1e-7 relative), and RMSProp's
        # first steps move each weight by about lr, so errors stay far below 1e-5.
        torch.testing.assert_close(rank0["params"][key], value, rtol=1e-5, atol=1e-5)


# --- End to end: a private Ray instance -------------------------------------------------


def test_private_run_listens_on_loopback_only_and_leaves_nothing(tmp_path):
    marker = uuid.uuid4().hex
    proc = start(
        [*CARTPOLE_SMALL, "--total_steps", "6000", "--savedir", str(tmp_path), "--xpid", "run"],
        marker,
    )
    log = tmp_path / "run" / "logs.csv"
    wait_for_rows(log, 2, proc)
    pids = processes_with_marker(marker)
    assert len(pids) >= 4  # driver, GCS, raylet, env servers
    addresses = listening_addresses(pids)
    assert addresses and addresses <= LOOPBACK, addresses
    out = finish(proc, 180)
    assert proc.returncode == 0, out[-4000:]
    assert "reached total_steps 6,000" in out
    assert (tmp_path / "run" / "model.tar").is_file()
    assert int(read_csv(log)[-1]["step"]) >= 6000
    assert wait_until_gone(marker, timeout=15) == []
    tested = subprocess.run(
        [sys.executable, POLYBEAST, "--mode", "test", "--savedir", str(tmp_path), "--xpid", "run"]
        + ["--num_test_episodes", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert tested.returncode == 0, tested.stderr
    assert (tmp_path / "run" / "test.json").is_file()


@pytest.mark.parametrize("how", ["ctrl-c", pytest.param("sigterm", marks=pytest.mark.slow)])
def test_ctrl_c_or_sigterm_stop_the_run_with_a_checkpoint_and_no_ray_processes(tmp_path, how):
    marker = uuid.uuid4().hex
    proc = start(
        [*CARTPOLE_SMALL, "--total_steps", "10000000", "--savedir", str(tmp_path), "--xpid", "c"],
        marker,
    )
    wait_for_rows(tmp_path / "c" / "logs.csv", 3, proc)
    if how == "ctrl-c":  # at a terminal: SIGINT to the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    else:  # `kill PID`, as a scheduler stops a job
        os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc, 60)
    assert proc.returncode == 0, out[-4000:]
    assert "interrupted" in out and (tmp_path / "c" / "model.tar").is_file()
    assert wait_until_gone(marker, timeout=15) == []
    if how == "sigterm":  # the same xpid resumes from the checkpoint, as in monobeast
        step = int(read_csv(tmp_path / "c" / "logs.csv")[-1]["step"])
        argv = [*CARTPOLE_SMALL, "--total_steps", str(step + 400), "--savedir", str(tmp_path)]
        proc = start([*argv, "--xpid", "c"], marker)
        out = finish(proc, 120)
        assert proc.returncode == 0, out[-4000:]
        assert re.search(r"resuming c from .*model.tar at step", out), out[-4000:]
        assert int(read_csv(tmp_path / "c" / "logs.csv")[-1]["step"]) >= step + 400


def test_two_learners_train(tmp_path):
    # Central policies, and every algorithm, are in tests/end_to_end/test_matrix.py.
    extra, expected = ["--num_learners", "2"], "the learners agreed to stop|reached total_steps"
    marker = uuid.uuid4().hex
    proc = start(
        [
            *CARTPOLE_SMALL,
            *extra,
            "--total_steps",
            "4000",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "x",
        ],
        marker,
    )
    out = finish(proc, 240)
    assert proc.returncode == 0, out[-4000:]
    assert re.search(expected, out), out[-4000:]
    rows = read_csv(tmp_path / "x" / "logs.csv")
    assert int(rows[-1]["step"]) >= 4000
    assert rows[-1]["torn_rollouts"] == "0"  # whole rollouts only, step 0 included
    assert (tmp_path / "x" / "model.tar").is_file()
    assert wait_until_gone(marker, timeout=15) == []


def test_an_env_bug_in_a_server_stops_the_run_with_its_error(tmp_path):
    marker = uuid.uuid4().hex
    argv = ["--env", "tests.end_to_end.test_monobeast:CrashingEnv", "--num_env_servers", "1"]
    argv += ["--num_envs_per_server", "2", "--unroll_length", "10", "--batch_size", "2"]
    proc = start([*argv, "--savedir", str(tmp_path), "--xpid", "bug"], marker)
    out = finish(proc, 120)
    assert proc.returncode == 1, out[-4000:]
    assert "error: env server 0 failed: RuntimeError: boom: the environment broke" in out
    assert wait_until_gone(marker, timeout=15) == []


# --- End to end: a multi-node cluster on this machine ------------------------------------


@pytest.fixture
def cluster():
    """A head node with no CPUs (the driver's learner needs none) and 2 worker nodes
    of 2 CPUs, so env servers can only go to the workers."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            # Notice a lost node within a few seconds (default: about 30).
            "_system_config": {
                "health_check_initial_delay_ms": 0,
                "health_check_period_ms": 1000,
                "health_check_failure_threshold": 3,
            },
        },
    )
    workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, workers
    cluster.shutdown()


def server_nodes(out: str) -> dict[int, str]:
    """Env server -> node id prefix, from the run's placement lines."""
    return {int(i): node for i, node in re.findall(r"env server (\d+): node (\w+)", out)}


def cartpole_on_cluster(cluster, tmp_path, marker):
    return start(
        [
            "--env",
            "CartPole-v1",
            "--ray_address",
            cluster.address,
            "--num_threads",
            "1",
            "--log_interval",
            "10",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "cluster",
        ],
        marker,
    )


class Output:
    """A run's combined output, read by a thread so that tests can wait for lines."""

    def __init__(self, proc):
        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.text())
            if match:
                return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in the output:\n{self.text()[-4000:]}")

    def finish(self, timeout: float) -> str:
        self.proc.wait(timeout)
        self._thread.join(10)
        return self.text()


def test_cluster_places_servers_on_both_nodes_and_survives_losing_one(cluster, tmp_path):
    cluster, workers = cluster
    marker = uuid.uuid4().hex
    proc = start(
        [
            *CARTPOLE_SMALL,
            "--ray_address",
            cluster.address,
            "--total_steps",
            "100000000",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "lose",
        ],
        marker,
    )
    output = Output(proc)
    try:
        output.wait_for(r"env server 1: node", timeout=180)
        placed = server_nodes(output.text())
        assert set(placed.values()) == {worker.node_id[:12] for worker in workers}
        log = tmp_path / "lose" / "logs.csv"
        wait_for_rows(log, 5, proc)
        cluster.remove_node(workers[0], allow_graceful=False)
        lost = workers[0].node_id[:12]
        output.wait_for(rf"env server \d+ restarted by Ray: was node {lost}", timeout=120)
        rows = len(read_csv(log))
        wait_for_rows(log, rows + 5, proc)  # training goes on after the restart
    finally:
        os.killpg(proc.pid, signal.SIGINT)
    out = output.finish(60)
    assert proc.returncode == 0, out[-4000:]
    assert int(read_csv(log)[-1]["env_server_restarts"]) >= 1
    assert (tmp_path / "lose" / "model.tar").is_file()
    assert wait_until_gone(marker, timeout=15) == []


@pytest.mark.slow
def test_cluster_learns_cartpole_with_env_servers_on_both_worker_nodes(cluster, tmp_path):
    cluster, workers = cluster
    proc = cartpole_on_cluster(cluster, tmp_path, uuid.uuid4().hex)
    out = finish(proc, 900)
    assert proc.returncode == 0, out[-4000:]
    placed = set(server_nodes(out).values())
    assert placed == {worker.node_id[:12] for worker in workers}, out[:4000]
    assert best_mean_of_100(tmp_path / "cluster") >= 450


@pytest.mark.slow
def test_cluster_survives_losing_a_worker_node(cluster, tmp_path):
    cluster, workers = cluster
    proc = cartpole_on_cluster(cluster, tmp_path, uuid.uuid4().hex)
    wait_for_rows(tmp_path / "cluster" / "logs.csv", 200, proc)
    cluster.remove_node(workers[0], allow_graceful=False)
    out = finish(proc, 900)
    assert proc.returncode == 0, out[-4000:]
    lost = workers[0].node_id[:12]
    assert re.search(rf"env server \d+ restarted by Ray: was node {lost}", out), out[-4000:]
    assert int(read_csv(tmp_path / "cluster" / "logs.csv")[-1]["env_server_restarts"]) >= 1
    assert best_mean_of_100(tmp_path / "cluster") >= 450


def test_a_reply_from_a_servers_earlier_process_is_no_restart():
    """Each new process behind a server is one restart, logged and counted once; a late
    reply from a process it replaced (sent before the restart) counts as nothing, since
    restarts within a minute can stop the run."""
    lines = []
    pool = ServerPool(parse_poly_args(["--env", "CartPole-v1"]), [0], lines.append, None)
    first, second, third = (Incarnation(0, f"node{i}", "host", 100 + i, f"t{i}") for i in range(3))
    assert not pool.saw(first)  # the process the run started with
    assert pool.saw(second) and pool.known[0] == second
    assert not pool.saw(first) and pool.known[0] == second  # a late reply: no flip back
    assert not pool.saw(second)
    assert pool.saw(third)
    assert pool.total_restarts == 2 and len(pool.restarts) == 2
    assert sum("restarted by Ray" in line for line in lines) == 2
