"""Contract of benchmarks.bench: the learner-only and acting-only measurements run on tiny
CartPole configs, return sane figures, clean up their processes, and refuse bad inputs.

The figures themselves are not checked against any speed: this machine is shared.
"""

from __future__ import annotations

import math
import multiprocessing as mp

import numpy as np
import pytest
import torch

from beast.algos.policies import CategoricalPolicy
from beast.buffers import rollout_spec
from beast.envs import EnvError
from beast.fields import box_obs, core_state
from beast.measure import synthetic_batch
from benchmarks import bench

CARTPOLE = {"obs_shape": (4,), "obs_dtype": np.float32, "num_actions": 2}
TINY = {"unroll_length": 4, "batch_size": 2}


def cartpole_batch(unroll_length: int, batch_size: int) -> dict[str, torch.Tensor]:
    """A synthetic CartPole learner batch with IMPALA's record (no recurrent state)."""
    spec = rollout_spec(
        unroll_length=unroll_length,
        obs=box_obs((4,), np.float32),
        record=CategoricalPolicy(2).record_spec(),
    )
    return synthetic_batch(spec, batch_size, 2)


@pytest.mark.parametrize("variant", ["fp32", "bf16"])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_measure_learner_times_every_step(variant, num_threads):
    before = torch.get_num_threads()
    timing = bench.measure_learner(
        **CARTPOLE, **TINY, variant=variant, num_threads=num_threads, steps=3
    )
    assert timing.error is None
    assert timing.variant == variant and timing.num_threads == num_threads
    assert len(timing.step_seconds) == 3 and all(s > 0 for s in timing.step_seconds)
    assert timing.first_step_seconds is not None and timing.first_step_seconds > 0
    assert timing.samples_per_step == 4 * 2
    assert math.isclose(timing.steps_per_second, 8000.0 / timing.ms_per_step)
    assert torch.get_num_threads() == before  # the thread count is restored


@pytest.mark.parametrize(
    "overrides",
    [
        {"unroll_length": 0},
        {"batch_size": 0},
        {"num_threads": 0},
        {"steps": 0},
        {"variant": "fp64"},
        {"model": "nope"},
        {"variant": "channels_last"},  # vector observations have no channels
    ],
)
def test_measure_learner_rejects_bad_inputs(overrides):
    kwargs = {**CARTPOLE, **TINY, "steps": 1, **overrides}
    with pytest.raises(ValueError):
        bench.measure_learner(**kwargs)


def test_learner_step_updates_and_publishes_weights():
    step = bench.LearnerStep(obs_shape=(4,), num_actions=2, variant="bf16")
    batch = cartpole_batch(4, 2)
    before = [p.detach().clone() for p in step.model.parameters()]
    losses = step(batch)
    assert math.isfinite(losses["total_loss"]) and losses["grad_norm"] > 0
    assert any(not torch.equal(b, p) for b, p in zip(before, step.model.parameters(), strict=True))
    for shared, own in zip(step.actor_model.parameters(), step.model.parameters(), strict=True):
        assert torch.equal(shared, own)
    # Parameters stay float32 under autocast: only the forward's compute is bf16.
    assert all(p.dtype == torch.float32 for p in step.model.parameters())


def test_learner_rollout_spec_has_impala_record_and_core_state():
    step = bench.LearnerStep(obs_shape=(4,), num_actions=2, use_lstm=True)
    spec = bench.learner_rollout_spec(step, 4, np.float32)
    assert spec["policy_logits"].shape == (5, 2) and spec["baseline"].shape == (5,)
    assert spec["terminated"].shape == (5,) and spec["truncated"].shape == (5,)
    state = step.model.initial_state(1)
    assert [spec[f"core_state_{i}"].shape for i in range(len(state))] == [
        (s.shape[0], *s.shape[2:]) for s in state
    ]


def test_synthetic_batch_has_the_learner_layout():
    spec = rollout_spec(
        unroll_length=5,
        obs=box_obs((4, 84, 84), np.uint8),
        record=CategoricalPolicy(6).record_spec(),
        core_state_shapes=[(1, 16)],
    )
    batch = synthetic_batch(spec, 3, 6, seed=1)
    assert set(batch) == set(spec)
    # Rollout fields [T+1, B, ...] and core state [d0, B, ...]: the batch is dim 1 of both.
    for key, field in spec.items():
        assert batch[key].shape == (field.shape[0], 3, *field.shape[1:])
        assert batch[key].dtype == field.dtype
    state = core_state(batch)
    assert len(state) == 1 and state[0].shape == (1, 3, 16)
    assert torch.equal(batch["last_action"][1:], batch["action"][:-1])
    assert set(batch["reward"].unique().tolist()) <= {-1.0, 0.0, 1.0}
    assert int(batch["action"].max()) < 6
    assert not batch["truncated"].any()  # episodes end, none is cut by a time limit


def test_compare_precision_fp32_is_exact_and_bf16_is_close():
    reference = bench.LearnerStep(obs_shape=(4,), num_actions=2)
    batch = cartpole_batch(8, 4)
    same = bench.compare_precision(reference, "fp32", batch)
    # Same weights, same ops, same CPU kernels: bit-identical.
    assert same.loss_rel_diff == 0 and same.grad_rel_error == 0
    bf16 = bench.compare_precision(reference, "bf16", batch)
    # bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.2% per op); over a few
    # layers the gradient direction must still agree to well within 1%.
    assert bf16.grad_cosine > 0.99 and bf16.grad_rel_error < 0.1
    assert -1.0 <= bf16.noise_cosine <= 1.0
    with pytest.raises(ValueError):
        bench.compare_precision(
            bench.LearnerStep(obs_shape=(4,), num_actions=2, variant="bf16"),
            "fp32",
            batch,
        )


def _actor_children() -> list[str]:
    return [p.name for p in mp.active_children() if p.name.startswith("actor-")]


def test_measure_acting_counts_steps_and_captures_rollouts():
    result = bench.measure_acting(
        env="CartPole-v1",
        num_actors=1,
        num_envs_per_actor=2,
        unroll_length=5,
        seconds=1.0,
        warmup_seconds=0.2,
        capture=2,
    )
    assert result.steps_per_second > 0
    assert result.rollouts is not None
    assert result.rollouts["obs"].shape == (6, 2, 4)
    assert result.rollouts["obs"].abs().sum() > 0  # written by an actor, not the zeros
    assert core_state(result.rollouts) == ()  # an MLP without LSTM has no recurrent state
    assert _actor_children() == []  # every actor joined


@pytest.mark.parametrize(
    "overrides, error",
    [
        ({"num_actors": 0}, ValueError),
        ({"num_envs_per_actor": 0}, ValueError),
        ({"unroll_length": 0}, ValueError),
        ({"seconds": 0.0}, ValueError),
        ({"warmup_seconds": -1.0}, ValueError),
        ({"num_buffers": 1, "num_envs_per_actor": 2}, ValueError),
        ({"env": "NoSuchEnv-v0"}, EnvError),
    ],
)
def test_measure_acting_rejects_bad_inputs(overrides, error):
    kwargs = {
        "env": "CartPole-v1",
        "num_actors": 1,
        "num_envs_per_actor": 1,
        "unroll_length": 2,
        "seconds": 0.5,
        **overrides,
    }
    with pytest.raises(error):
        bench.measure_acting(**kwargs)
    assert _actor_children() == []


@pytest.mark.parametrize(
    "argv",
    [
        ["throughput", "--num_actors", "0"],
        ["throughput", "--variants", "fp64"],
        ["throughput", "--threads", "0"],
        ["throughput", "--seconds", "-1"],
        ["nope"],
    ],
)
def test_cli_rejects_bad_flags(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_cli_learner_part_appends_a_results_section(tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    argv = [
        "throughput",
        "--env",
        "CartPole-v1",
        "--parts",
        "learner",
        "--unroll_length",
        "4",
        "--batch_size",
        "2",
        "--repeats",
        "2",
        "--learner_steps",
        "1",
        "--threads",
        "1",
        "--variants",
        "fp32,bf16",
        "--write_results",
        "--results",
        str(results),
    ]
    bench.main(argv)
    bench.main(argv)
    text = results.read_text()
    assert text.startswith("# Measured throughput") and text.count("# Measured") == 1
    assert text.count(": throughput\n") == 2  # one dated section per run
    assert "Command: `python -m benchmarks.bench throughput --env CartPole-v1" in text
    assert "| learner fp32, 1 thread(s)" in text and "| learner bf16, 1 thread(s)" in text
    assert "machine: " in capsys.readouterr().out
