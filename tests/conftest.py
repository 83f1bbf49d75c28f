"""Fixtures shared by tests: the native-code tests' (test_native.py, test_batcher.py) and
the env batch tests' `register_id` (test_env_batch.py, test_envpool_batch.py)."""

import multiprocessing as mp
import signal

import gymnasium
import pytest

# A test of blocking native code that hangs fails after this long instead of
# blocking the suite.
WATCHDOG_SECONDS = 30


@pytest.fixture
def watchdog():
    def on_alarm(signum, frame):
        raise TimeoutError(f"test still running after {WATCHDOG_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(WATCHDOG_SECONDS)
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
