"""monobeast.py end to end, as a user runs it: subprocesses on real envs.

Every run gets a unique marker in its environment; after it exits, no
process on the machine may still carry that marker (actors, forkserver),
and /dev/shm must hold no new segment.
"""

import contextlib
import csv
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import uuid

import gymnasium
import numpy as np
import pytest

from tests.support.in_process import run_monobeast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MONOBEAST = os.path.join(ROOT, "monobeast.py")

CARTPOLE_SMALL = [
    "--env",
    "CartPole-v1",
    "--num_actors",
    "1",
    "--num_envs_per_actor",
    "2",
    "--unroll_length",
    "10",
    "--batch_size",
    "2",
    "--log_interval",
    "0.5",
    "--num_threads",
    "1",
]


class CrashingEnv(gymnasium.Env):
    """Raises from step() after a few steps: an env bug inside an actor."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t > 30:
            raise RuntimeError("boom: the environment broke")
        return np.zeros(3, np.float32), 0.0, False, False, {}


def processes_with_marker(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def wait_until_gone(marker: str, timeout: float = 5.0) -> list[str]:
    """The processes still carrying `marker` after up to `timeout` seconds, each as
    `describe_process` says it (an empty list: all gone)."""
    deadline = time.monotonic() + timeout
    while (left := processes_with_marker(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [describe_process(pid) for pid in left]


def describe_process(pid: int) -> str:
    """'pid P (state S, parent Q): command line', for a failure message that says what
    was left behind."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state, parent = f.read().rsplit(b")", 1)[1].split()[:2]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"pid {pid} (gone)"
    return f"pid {pid} (state {state.decode()}, parent {parent.decode()}): {command[:300]}"


def shm_entries() -> set[str]:
    """The /dev/shm entries no live process holds (maps or has open): what a run that has
    exited left behind. Entries held by other processes on the machine (other runs'
    multiprocessing semaphores, alive while their run is) are not leaks.

    Held is by inode, not by name: glibc creates a named semaphore under a temporary
    name, maps it, links it into place and unlinks the temporary name, so its mapping
    reads "/dev/shm/sem.XXXXXX (deleted)" for as long as it lives; and multiprocessing's
    semaphores of the forkserver context keep their names as long (the suite's other
    xdist worker's in-process runs). A semaphore being created is unheld for a moment,
    so an entry counts only if it is still there, unheld, 0.2 s later."""
    unheld = _unheld_shm_entries()
    if unheld:
        time.sleep(0.2)
        unheld &= _unheld_shm_entries()
    return unheld


def _unheld_shm_entries() -> set[str]:
    if not os.path.isdir("/dev/shm"):
        return set()
    entries = {}
    for name in os.listdir("/dev/shm"):
        with contextlib.suppress(OSError):  # gone meanwhile
            entries[name] = os.stat(f"/dev/shm/{name}").st_ino
    held = set()  # inodes
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                # address perms offset device inode path
                held.update(int(line.split()[4]) for line in f if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                    held.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return {name for name, inode in entries.items() if inode not in held}


def start(argv, marker, script=MONOBEAST, stderr=subprocess.PIPE):
    """`script` (monobeast.py by default) in a new session, as a terminal would run it:
    Ctrl-C (SIGINT to the group) reaches every process of the run."""
    env = dict(os.environ, BEAST_TEST_MARKER=marker, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, script, *argv],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def run(argv, timeout=120, marker=None):
    env = dict(os.environ, BEAST_TEST_MARKER=marker or uuid.uuid4().hex, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, MONOBEAST, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_train_then_test_on_cartpole(tmp_path):
    marker = uuid.uuid4().hex
    before = shm_entries()
    result = run(
        [*CARTPOLE_SMALL, "--total_steps", "4000", "--savedir", str(tmp_path), "--xpid", "smoke"],
        marker=marker,
    )
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "smoke"
    rows = read_csv(run_dir / "logs.csv")
    assert int(rows[-1]["step"]) >= 4000
    assert {"total_loss", "pg_loss", "baseline_loss", "entropy_loss"} <= set(rows[0])
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["config"]["env"] == "CartPole-v1" and "git" in meta
    assert (run_dir / "model.tar").is_file()
    assert "SPS" in result.stdout and "return" in result.stdout
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()

    tested = run(
        [
            "--mode",
            "test",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "smoke",
            "--num_test_episodes",
            "3",
        ]
    )
    assert tested.returncode == 0, tested.stderr
    summary = json.loads((run_dir / "test.json").read_text())
    assert summary["episodes"] == 3 and summary["mean_return"] > 0


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--env", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["--env", "CartPole-v1", "--num_actors", "0"], "--num_actors must be positive"),
        (["--env", "CartPole-v1", "--unroll_length", "-3"], "--unroll_length must be positive"),
        (
            ["--env", "CartPole-v1", "--batch_size", "64", "--num_buffers", "32"],
            "--num_buffers 32 is too small",
        ),
        (["--mode", "test", "--xpid", "never-trained"], "no checkpoint at"),
        (
            ["--env", "CartPole-v1", "--replay_ratio", "1"],
            "--replay_ratio is a flag of --algo laser, not of impala",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, fragment):
    assert_refused_in_one_line(tmp_path, argv, fragment)


def test_bad_input_from_a_shell_is_one_line_exit_2_and_leaves_nothing(tmp_path):
    assert_refused_in_one_line(tmp_path, ["--env", "NoSuchEnv-v0"], "NoSuchEnv-v0", process=True)


def assert_refused_in_one_line(tmp_path, argv: list[str], fragment: str, process=False) -> None:
    """monobeast.py with `argv` exits 2 with one stderr line holding `fragment`, and leaves
    no process or shared-memory segment behind.

    In the test process by default (`tests/support/in_process.py`): no actor process it started
    may be left, and no new /dev/shm entry. With `process`, as a process from a shell,
    for what only a new interpreter shows (its exit status, imports it cannot make)."""
    if process:
        marker = uuid.uuid4().hex
        before = shm_entries()
        result = run([*argv, "--savedir", str(tmp_path)], timeout=60, marker=marker)
        assert wait_until_gone(marker) == []
        assert shm_entries() - before == set()
    else:
        started = {child.pid for child in mp.active_children()}
        before = set(os.listdir("/dev/shm"))
        result = run_monobeast([*argv, "--savedir", str(tmp_path)])
        assert {child.pid for child in mp.active_children()} <= started
        new = set(os.listdir("/dev/shm")) - before
        assert {name for name in new if not name.startswith("sem.")} == set()
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert lines[0].startswith("monobeast.py: error:")


# PPO with a central policy: synchronous actors, two lanes each, waiting on their slots.
SYNCHRONOUS_CENTRAL = ["--algo", "ppo", "--batch_size", "4", "--num_minibatches", "1"]
SYNCHRONOUS_CENTRAL += ["--policy", "central"]


@pytest.mark.parametrize("algo_flags", [[], SYNCHRONOUS_CENTRAL], ids=["impala", "ppo-central"])
def test_ctrl_c_stops_everything_within_10s(tmp_path, algo_flags):
    marker = uuid.uuid4().hex
    before = shm_entries()
    argv = [
        *CARTPOLE_SMALL,
        *algo_flags,
        "--num_actors",
        "2",
        "--total_steps",
        "100000000",
        "--savedir",
        str(tmp_path),
        "--xpid",
        "ctrlc",
    ]
    proc = start(argv, marker)
    try:
        log = tmp_path / "ctrlc" / "logs.csv"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (log.exists() and len(read_csv(log)) > 2):
            time.sleep(0.2)
        assert log.exists(), "training never started"
        interrupted_at = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        elapsed = time.monotonic() - interrupted_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert elapsed < 10
    assert "Traceback" not in err, err
    assert (tmp_path / "ctrlc" / "model.tar").is_file()
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()


def test_old_gym_api_env_learns_through_the_adapter(tmp_path):
    # OldStyleEnv (tests/envs/test_envs.py): old gym API, reward = action, 5 steps.
    # Always choosing action 1 scores 5; a uniform policy scores 2.5.
    result = run_monobeast(
        [
            *CARTPOLE_SMALL,
            "--env",
            "tests.envs.test_envs:OldStyleEnv",
            "--total_steps",
            "20000",
            "--learning_rate",
            "0.01",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "old",
        ]
    )
    assert result.returncode == 0, result.stderr
    # No family by name: its spaces pick the tuned file, and the start-up line says so.
    defaults = "defaults: configs/impala/classic.yaml (vector observations, Discrete actions)"
    assert defaults in result.stdout
    tested = run_monobeast(
        ["--mode", "test", "--savedir", str(tmp_path), "--xpid", "old", "--num_test_episodes", "20"]
    )
    assert tested.returncode == 0, tested.stderr
    assert json.loads((tmp_path / "old" / "test.json").read_text())["mean_return"] >= 4.5


def test_env_error_in_an_actor_stops_the_run_with_one_report(tmp_path):
    marker = uuid.uuid4().hex
    before = shm_entries()
    result = run(
        [
            *CARTPOLE_SMALL,
            "--env",
            "tests.end_to_end.test_monobeast:CrashingEnv",
            "--total_steps",
            "100000",
            "--max_actor_restarts",
            "2",
            "--savedir",
            str(tmp_path),
            "--xpid",
            "crash",
        ],
        marker=marker,
    )
    assert result.returncode == 1
    # Three actors die with the same error; its traceback is printed once.
    assert result.stdout.count("Traceback (most recent call last)") == 1, result.stdout
    assert "tests.end_to_end.test_monobeast:CrashingEnv" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "monobeast.py: error: actor-0 raised RuntimeError: boom: the environment broke; 2 actors"
    ), lines[0]
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()
