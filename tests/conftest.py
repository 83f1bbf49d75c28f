"""What every test gets: a private home and compile cache (`pytest_configure`), and torch's
thread count and random states as they were before it (`keep_global_state`); and fixtures
shared by tests: the native-code tests' (test_native.py, test_batcher.py) and the env
batch tests' `register_id` (test_env_batch.py, test_envpool_batch.py)."""

import atexit
import glob
import multiprocessing as mp
import os
import shutil
import signal
import tempfile

import gymnasium
import pytest

from tests.support.global_state import global_state_kept

# Set by pytest_configure to this process's private folder (pytest's own process and each
# xdist worker have one); removed by pytest_unconfigure.
_PRIVATE: list[str] = []


def pytest_configure(config):
    """Point beast's records at a folder of this process's own: HOME (a run's default
    --savedir, ~/logs/beast, and anything else a test or a library writes under ~) and
    BEAST_COMPILE_CACHE (beast/util/records.py: compiled packages, --compile auto's step
    records, the thread tuner's chosen count). Nothing a test runs reads what an earlier
    test, an earlier pytest run or the other xdist worker kept, and nothing is written
    into the user's home. Subprocesses inherit both. A test that means to share a cache
    between runs points BEAST_COMPILE_CACHE at a folder of its own and says why.

    Git's user settings stay the user's (GIT_CONFIG_GLOBAL): a run records its git
    state, which reads them."""
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    _remove_folders_of_dead_processes()
    private = tempfile.mkdtemp(prefix=f"beast-tests-{worker}-{os.getpid()}-")
    _PRIVATE.append(private)
    # xdist's workers end without pytest_unconfigure; atexit covers a normal exit, and the
    # next run's sweep (above) a killed one.
    atexit.register(shutil.rmtree, private, True)
    home = os.path.join(private, "home")
    os.makedirs(home)
    gitconfig = os.path.join(os.path.expanduser("~"), ".gitconfig")
    if "GIT_CONFIG_GLOBAL" not in os.environ and os.path.isfile(gitconfig):
        os.environ["GIT_CONFIG_GLOBAL"] = gitconfig
    os.environ["HOME"] = home
    os.environ["BEAST_COMPILE_CACHE"] = os.path.join(private, "compile-cache")


def _remove_folders_of_dead_processes() -> None:
    """Remove the private folders (beast-tests-WORKER-PID-*) of pytest processes that are
    gone: a run killed by a timeout leaves its folders behind."""
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), "beast-tests-*-*-*")):
        pid = os.path.basename(folder).split("-")[3]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(folder, ignore_errors=True)


def pytest_unconfigure(config):
    for private in _PRIVATE:
        shutil.rmtree(private, ignore_errors=True)
    _PRIVATE.clear()


@pytest.fixture(autouse=True)
def keep_global_state():
    """torch's thread count and the random states of torch, NumPy and `random` after a
    test are what they were before it: an in-process run sets its --num_threads and
    seeds torch, and a test that seeds or sets threads must not change what the next
    test on this worker starts from."""
    with global_state_kept():
        yield


# A test of blocking native code that hangs fails after this long instead of
# blocking the suite.
WATCHDOG_SECONDS = 30


@pytest.fixture
def watchdog(request):
    """Fail the test after WATCHDOG_SECONDS, or after the seconds of its
    `@pytest.mark.watchdog(seconds)` (a test whose legitimate work, a compilation, takes
    longer than that on a loaded machine)."""
    marker = request.node.get_closest_marker("watchdog")
    seconds = marker.args[0] if marker else WATCHDOG_SECONDS

    def on_alarm(signum, frame):
        raise TimeoutError(f"test still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


class ChildProcesses(list):
    """Children started by a test; any still alive at teardown are killed."""

    def start(self, ctx, target, *args, name):
        process = ctx.Process(target=target, args=args, name=name, daemon=True)
        process.start()
        self.append(process)
        return process


@pytest.fixture
def processes():
    started = ChildProcesses()
    yield started
    for process in started:
        if process.is_alive():
            process.kill()
        process.join(5)


@pytest.fixture(scope="module")
def forkserver():
    ctx = mp.get_context("forkserver")
    # Children fork from a server that already imported torch: ~30 ms per
    # child instead of ~2 s (only effective if the server is not yet running).
    ctx.set_forkserver_preload(["torch", "beast.native"])
    return ctx


@pytest.fixture
def register_id():
    """Register Gymnasium ids for one test; they are removed from the registry after it."""
    added: list[str] = []

    def register(env_id: str, **kwargs) -> str:
        gymnasium.register(env_id, **kwargs)
        added.append(env_id)
        return env_id

    yield register
    for env_id in added:
        gymnasium.registry.pop(env_id, None)
