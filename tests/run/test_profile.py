"""--profile: per-phase clocks of actors and learner, and the printed breakdown."""

import time

import numpy as np
import torch

from beast.util.profile import (
    ACTOR_PHASES,
    LEARNER_PHASES,
    PhaseClock,
    format_profile,
    shared_counters,
)
from tests.support.in_process import run_monobeast
from tests.support.runs import CARTPOLE_SMALL


def test_clock_adds_each_interval_to_the_phase_named_at_its_end():
    counters = shared_counters(2, ACTOR_PHASES)
    # Each interval lies between the sleep in it (a sleep never ends early) and the time
    # this test measured around it on the clock's own clock (order, not speed: a slow
    # machine only widens the brackets).
    before = time.perf_counter()
    clock = PhaseClock(counters[1], ACTOR_PHASES)
    time.sleep(0.02)
    clock.mark("env_step")
    middle = time.perf_counter()
    time.sleep(0.04)
    clock.mark("inference")
    after = time.perf_counter()
    clock.restart()
    clock.mark("env_step")  # what passed since the restart, added to env_step
    end = time.perf_counter()
    env_step, inference = counters[1, 2].item(), counters[1, 1].item()
    assert 0.02 <= env_step <= (middle - before) + (end - after)
    assert 0.04 <= inference <= after - before
    assert counters[0].sum().item() == 0.0  # other rows untouched
    assert counters.is_shared()


def test_format_profile_gives_shares_and_per_update_times():
    actor = np.array([[1.0, 2.0, 1.0, 0.0], [1.0, 2.0, 1.0, 0.0]])  # wait, inference, env, write
    learner = np.array([[1.0, 4.0, 4.0, 1.0, 0.0]])
    lines = format_profile(actor, learner, num_updates=10, steps=8000)
    assert len(lines) == 2
    assert "1.000 actor-ms per agent step" in lines[0]
    assert "wait_slots 25%, inference 50%, env_step 25%, slot_write 0%" in lines[0]
    assert "forward 40% (400 ms)" in lines[1] and "wait_batch 10% (100 ms)" in lines[1]
    assert format_profile(np.zeros((1, 4)), np.zeros((1, 5)), num_updates=0, steps=0) == []
    assert len(LEARNER_PHASES) == learner.shape[1]


def test_monobeast_profile_prints_a_breakdown_at_the_end(tmp_path):
    result = run_monobeast(
        [*CARTPOLE_SMALL, "--total_steps", "3000", "--profile"]
        + ["--savedir", str(tmp_path), "--xpid", "profile"]
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "profile:" in line]
    assert any("actors (" in line and "env_step" in line for line in lines), result.stdout
    assert any("learner (" in line and "backward" in line for line in lines), result.stdout
    # The shares cover all of the actors' measured time (up to rounding).
    actor_line = [line for line in lines if "actors (" in line][-1]
    assert (
        torch.tensor(
            [float(p.split()[-1].rstrip("%,")) for p in actor_line.split(": ")[-1].split(", ")]
        ).sum()
        >= 98
    )
