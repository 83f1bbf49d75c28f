"""Running monobeast.py as a user does, and checking what a run leaves behind: the
processes that carry a run's marker, unheld /dev/shm entries, a refusal's one line, its
logs, the actors of a running run.

Every run started here gets a unique marker in its environment (BEAST_TEST_MARKER), so
that the processes it started can be found after it exits.
"""

from __future__ import annotations

import contextlib
import csv
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
import uuid

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


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def actor_pids(main_pid: int) -> list[int]:
    """Actors are the children of the main process's forkserver."""
    children = [
        int(p) for p in os.listdir("/proc") if p.isdigit() and parent_pid(int(p)) == main_pid
    ]
    forkservers = []
    for pid in children:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"forkserver" in f.read():
                    forkservers.append(pid)
        except OSError:
            continue
    return [
        int(p) for p in os.listdir("/proc") if p.isdigit() and parent_pid(int(p)) in forkservers
    ]


def live(pid: int) -> bool:
    """Whether `pid` runs: a killed process its parent has not reaped yet (a zombie) still
    takes signals without error, and must not count as another kill."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class LineReader:
    """Reads a process's output in a thread as it comes, each line with its arrival time,
    so that the pipe never fills and a test can see when a line appeared."""

    def __init__(self, stream) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line))

    def first(self, text: str) -> float | None:
        """When the first line holding `text` arrived, or None."""
        return next((at for at, line in list(self.lines) if text in line), None)

    def text_so_far(self) -> str:
        """The output read until now, the process still running."""
        return "".join(line for _, line in list(self.lines))

    def text(self, timeout: float = 30) -> str:
        """All the output, once the stream ended."""
        self._thread.join(timeout)
        return "".join(line for _, line in self.lines)


def wait_for_rows(log, count, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(read_csv(log)) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{log} did not reach {count} rows")


# The tuned flags live in configs/impala/classic.yaml, which --env CartPole-v1
# picks: this checks that the shipped config learns, as a user runs it.
CARTPOLE_FLAGS = ["--env", "CartPole-v1", "--num_threads", "1", "--log_interval", "10"]


def best_mean_of_100(run_dir) -> float:
    """Highest mean return over any 100 consecutive finished episodes."""
    with open(os.path.join(run_dir, "episodes.csv")) as f:
        returns = [float(row["return"]) for row in csv.DictReader(f)]
    assert len(returns) >= 100, f"only {len(returns)} episodes finished"
    window = sum(returns[:100])
    best = window
    for i in range(100, len(returns)):
        window += returns[i] - returns[i - 100]
        best = max(best, window)
    return best / 100


# R2D2's and Ape-X's smoke runs (tests/end_to_end/test_r2d2_monobeast.py), small enough
# that learning starts after 20 sequences; updates are batches of 4, the target network
# is copied every 5 updates.
REPLAY_SMALL = [
    "--env",
    "CartPole-v1",
    "--num_actors",
    "1",
    "--num_envs_per_actor",
    "2",
    "--batch_size",
    "4",
    "--replay_size",
    "200",
    "--target_update_period",
    "5",
    "--log_interval",
    "0.5",
    "--num_threads",
    "1",
]
R2D2_SMALL = ["--algo", "r2d2", *REPLAY_SMALL, "--min_replay_size", "20"]
R2D2_SMALL += ["--seq_len", "10", "--seq_overlap", "5", "--burn_in", "5"]
APEX_SMALL = ["--algo", "apex", *REPLAY_SMALL, "--learning_starts", "20", "--n_step", "3"]
