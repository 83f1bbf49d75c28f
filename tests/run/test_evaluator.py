"""Evaluation during training (beast/run/evaluator.py) and the episode loop it shares with
--mode test (beast/trained/play.py `play_episodes`), without the entry points: the schedule,
the evaluation itself, the evaluator process and its supervision.
(The entry points' runs with --eval_interval: tests/end_to_end/test_evaluation_runs.py.)"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from types import SimpleNamespace

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium.envs.classic_control import CartPoleEnv
from torch import nn

from beast import envs
from beast.acting.error_board import ErrorBoard
from beast.acting.inference import LocalInference
from beast.algos.build import build_algorithm, build_checked_model, config_for
from beast.algos.policies import EpsilonGreedyPolicy
from beast.learning.learner import UpdateStats
from beast.models import copy_weights
from beast.outputs.checkpoint import BEST_CHECKPOINT_NAME, load_checkpoint
from beast.run.evaluator import (
    EVAL_SEED_OFFSET,
    EvalChannel,
    EvalSchedule,
    Evaluator,
    EvalWorker,
    run_evaluator,
)
from beast.trained.play import play_episodes

# A test of the evaluator process that hangs fails after this long.
WAIT_SECONDS = 60


class FiveStepEnv(gymnasium.Env):
    """Episodes of exactly 5 steps; the reward is the action; every action is recorded."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self):
        self.actions = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.actions.append(int(action))
        self.t += 1
        return np.zeros(2, np.float32), float(action), self.t == 5, False, {}


class StepCountingModel(nn.Module):
    """A recurrent model whose state counts the steps of the episode (reset where `done`):
    its Q-values prefer action 1 on an episode's first 3 steps and action 0 after, so the
    actions are right only if the state is carried through each episode and reset at its
    end."""

    def initial_state(self, batch_size: int):
        return (torch.zeros(1, batch_size),)

    def forward(self, inputs, core_state=()):
        (count,) = core_state
        q_values = []
        for done in inputs["done"]:  # [B] per step
            count = count * done.logical_not().float() + 1.0
            q_values.append(torch.stack([count[0] > 3, count[0] <= 3], dim=-1).float())
        return {"q_values": torch.stack(q_values)}, (count,)


def test_play_episodes_carries_recurrent_state_through_each_episode_and_resets_it():
    env = envs.make("tests.run.test_evaluator:FiveStepEnv", seed=0)
    spec = envs.env_spec(env)
    policy = LocalInference(StepCountingModel(), EpsilonGreedyPolicy(2, epsilon=0.0), num_envs=1)
    seen = []
    episodes = play_episodes(env, spec, policy, 3, on_episode=seen.append)
    assert env.unwrapped.actions == [1, 1, 1, 0, 0] * 3
    assert [(e.ret, e.length) for e in episodes] == [(3.0, 5)] * 3
    assert seen == episodes


def test_schedule_hands_over_at_the_first_update_past_each_multiple():
    schedule = EvalSchedule(100, 0)
    updates = [40, 80, 120, 160, 200, 240, 410, 420, 500, 599]
    assert [step for step in updates if schedule.due(step)] == [120, 200, 410, 500]
    resumed = EvalSchedule(100, 250)  # a run resumed at step 250: next at 300
    assert not resumed.due(280) and resumed.due(300) and not resumed.due(399)


def cartpole_config(tmp_path, **overrides):
    """A finalized IMPALA config on CartPole-v1 (its run directory under tmp_path)."""
    values = dict(env="CartPole-v1", config=None, savedir=str(tmp_path), xpid="run")
    values.update(eval_interval=1000, eval_episodes=3, **overrides)
    return config_for("impala")(**values).finalize()


def random_model(config, seed):
    """The config's network with weights drawn from `seed`."""
    spec = envs.env_spec(envs.make(config.env))
    torch.manual_seed(seed)
    return build_checked_model(build_algorithm(config, spec))


def test_an_evaluation_is_a_function_of_the_weights_and_the_best_is_kept(tmp_path):
    config = cartpole_config(tmp_path)
    os.makedirs(config.run_dir)
    worker = EvalWorker(config.to_dict(), config.run_dir)
    weights = random_model(config, seed=1)
    copy_weights(worker.model, weights)
    rng_state = torch.get_rng_state()
    first, again = worker.evaluate(100), worker.evaluate(200)
    # Training's random streams go on where they were (--serial evaluates in its process).
    assert torch.equal(torch.get_rng_state(), rng_state)
    # The same weights play the same episodes: the env is reset to its own seed, the
    # policy is greedy. CartPole pays 1 per step.
    assert first.returns == again.returns and first.lengths == again.lengths
    assert len(first.returns) == 3 and list(first.returns) == [float(n) for n in first.lengths]
    assert worker.seed == config.seed + EVAL_SEED_OFFSET
    # The first is the best so far; an equal mean is not better.
    assert first.best and not again.best
    best = load_checkpoint(os.path.join(config.run_dir, BEST_CHECKPOINT_NAME))
    assert best["step"] == 100 and best["config"]["env"] == "CartPole-v1"
    assert best["eval"]["mean_return"] == pytest.approx(np.mean(first.returns))
    for key, value in weights.state_dict().items():
        assert torch.equal(best["model_state_dict"][key], value)
    # A resumed run's worker starts from the saved best.
    assert EvalWorker(config.to_dict(), config.run_dir).best_return == best["eval"]["mean_return"]


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {WAIT_SECONDS} s")
        time.sleep(0.05)


def test_the_evaluator_process_evaluates_the_newest_snapshot_then_stops(tmp_path):
    config = cartpole_config(tmp_path)
    os.makedirs(config.run_dir)
    ctx = mp.get_context("forkserver")
    snapshot = random_model(config, seed=0)
    snapshot.share_memory()
    channel = EvalChannel(ctx, snapshot, config.eval_episodes)
    older, newer = random_model(config, seed=1), random_model(config, seed=2)
    # Both handed before the evaluator looks: the newer replaces the older.
    assert channel.hand(older, 1000) and channel.hand(newer, 2000)
    board = ErrorBoard(1, print)
    process = ctx.Process(
        target=run_evaluator,
        args=(config.to_dict(), config.run_dir, channel, os.getpid(), board.tensor[0]),
    )
    process.start()
    try:
        results = []

        def took_one() -> bool:
            result = channel.take()
            if result is not None:
                results.append(result)
            return bool(results)

        wait_for(took_one, "a result")
        (result,) = results
        os.makedirs(tmp_path / "reference")
        reference = EvalWorker(config.to_dict(), str(tmp_path / "reference"))
        copy_weights(reference.model, newer)
        expected = reference.evaluate(2000)
        assert result.step == 2000 and result.returns == expected.returns
        assert result.lengths == expected.lengths and result.best
        assert not channel.outstanding() and channel.take() is None
    finally:
        channel.request_stop()
        process.join(10)
        if process.is_alive():
            process.kill()
    assert process.exitcode == 0


class FakeLog:
    """What the evaluator uses of a RunLog: print() and record_eval()."""

    def __init__(self):
        self.lines, self.results = [], []

    def print(self, line):
        self.lines.append(line)

    def record_eval(self, result):
        self.results.append(result)


def evaluator_for(config):
    """An Evaluator over a run reduced to what it reads."""
    algorithm = build_algorithm(config, envs.env_spec(envs.make(config.env)))
    run = SimpleNamespace(
        config=config,
        algorithm=algorithm,
        actor_model=build_checked_model(algorithm),
        learner=SimpleNamespace(lock=threading.Lock()),
    )
    log = FakeLog()
    return Evaluator(run, log, step=0), log


def update(step):
    return UpdateStats(step=step, num_updates=1, losses={}, episode_returns=[], episode_steps=[])


def check_until(evaluator, condition, what):
    def checked():
        assert evaluator.check() is None
        return condition()

    wait_for(checked, what)


class SlowCartPole(CartPoleEnv):
    """CartPole whose steps take 20 ms: an evaluation lasts long enough to be killed in."""

    def step(self, action):
        time.sleep(0.02)
        return super().step(action)


def test_a_killed_evaluator_is_replaced_and_its_snapshot_evaluated_once(tmp_path):
    # A slow env: on a fast machine 3 CartPole episodes end before the SIGKILL lands, and
    # the kill would meet an evaluator with nothing outstanding.
    config = cartpole_config(tmp_path, env="tests.run.test_evaluator:SlowCartPole")
    evaluator, log = evaluator_for(config)
    os.makedirs(evaluator.run_dir)
    evaluator.start()
    try:
        evaluator.after_update(update(990))  # not yet due
        evaluator.after_update(update(1010))
        assert evaluator.channel.handed == 1010
        wait_for(lambda: evaluator.channel.taken == 1010, "the snapshot to be taken")
        os.kill(evaluator.process.pid, signal.SIGKILL)
        check_until(evaluator, lambda: log.results, "the evaluation of the lost snapshot")
        assert [result.step for result in log.results] == [1010]
        replaced = [line for line in log.lines if "starting a replacement" in line]
        assert replaced == ["the evaluator killed by SIGKILL; starting a replacement (restart 1)"]
        evaluator.finish(1010)  # nothing outstanding: returns at once
    finally:
        evaluator.close()
    assert evaluator.process.exited()


def test_an_evaluator_that_keeps_failing_stops_the_run_with_its_error_once(tmp_path):
    config = cartpole_config(
        tmp_path, env="tests.end_to_end.test_monobeast:CrashingEnv", max_actor_restarts=1
    )
    evaluator, log = evaluator_for(config)
    os.makedirs(evaluator.run_dir)
    evaluator.start()
    try:
        evaluator.after_update(update(1000))
        failure = None
        deadline = time.monotonic() + WAIT_SECONDS
        while failure is None and time.monotonic() < deadline:
            failure = evaluator.check()
            time.sleep(0.05)
    finally:
        evaluator.close()
    assert failure is not None and failure.startswith(
        "the evaluator raised RuntimeError: boom: the environment broke;"
    )
    assert "(--max_actor_restarts 1), so the run stops" in failure
    tracebacks = [line for line in log.lines if line.startswith("the evaluator failed:\n")]
    assert len(tracebacks) == 1 and "Traceback" in tracebacks[0]
