"""Contract of benchmarks.bench: the learner-only and acting-only measurements run on tiny
CartPole configs, return sane figures, clean up their processes, and refuse bad inputs.
Then the pure parts of the races against SB3 and SBX (benchmarks.races, benchmarks.peers
and the side-by-side scripts' helpers): no race runs here.

The figures themselves are not checked against any speed: this machine is shared.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
import os

import numpy as np
import pytest
import torch

from beast.algos.policies import CategoricalPolicy
from beast.envs import EnvError
from beast.experience.rollout_slots import rollout_spec
from beast.fields import box_obs, core_state
from beast.run.measure import synthetic_batch
from benchmarks import bench, peers, races
from benchmarks import sb3_qpg_side_by_side as qpg
from benchmarks.batcher_latency import measure_round_trip
from benchmarks.learning_checks import CHECKS, run_check
from benchmarks.monobeast_sps import learner_threads


@pytest.fixture(autouse=True)
def private_records(tmp_path_factory, monkeypatch):
    """beast's records (HOME, BEAST_COMPILE_CACHE) in a folder of the test's own, as
    tests/conftest.py gives every test under tests/ (which does not reach this folder when
    this file runs alone)."""
    folder = tmp_path_factory.mktemp("records")
    monkeypatch.setenv("HOME", str(folder / "home"))
    monkeypatch.setenv("BEAST_COMPILE_CACHE", str(folder / "compile-cache"))


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


# The races of beast, SB3 and SBX (benchmarks.races) and the helpers of the side-by-side
# scripts they reuse: their pure parts only; no race runs here.


def _run(side: str, seed: int, seconds: float | None, rate: float = 100.0) -> races.Run:
    return races.Run(side, seed, seconds, None, math.nan, 1000, 10.0, rate, "torch 1")


def test_rotated_puts_each_side_first_once_over_as_many_seeds():
    sides = ["beast", "SB3", "SBX"]
    orders = [races.rotated(sides, i) for i in range(3)]
    assert orders == [["beast", "SB3", "SBX"], ["SB3", "SBX", "beast"], ["SBX", "beast", "SB3"]]
    assert races.rotated(sides, 4) == orders[1]  # the shift wraps around


@pytest.mark.parametrize(
    "values, median",
    [
        ([10.0, None, 12.0], 12.0),  # not reached sorts after every time: [10, 12, inf]
        ([None, None, 5.0], None),  # most did not reach it: the median is "not reached"
        ([3.0, 1.0, 2.0], 2.0),
        ([1.0, 2.0], 1.5),
        ([1.0, None], None),  # (1 + inf) / 2
    ],
)
def test_median_seconds_counts_not_reached_as_slowest(values, median):
    assert races.median_seconds(values) == median


def test_faster_picks_least_time_and_most_rate():
    medians = {"SB3 (1 thr)": 30.0, "SB3 (2 thr)": None, "SBX": 6.0}
    assert races.faster(medians, races.TIME) == "SBX"
    assert races.faster(medians | {"SBX": None}, races.TIME) == "SB3 (1 thr)"
    assert races.faster({"SB3 (1 thr)": 60.0, "SBX": 120.0}, races.RATE) == "SBX"
    assert races.faster({"SBX": None}, races.TIME) is None


def test_paired_ratios_use_only_seeds_where_both_have_the_figure():
    runs = [
        _run("beast", 1, 10.0),
        _run("SB3", 1, 20.0),
        _run("beast", 2, None),  # beast did not reach it: no pair
        _run("SB3", 2, 30.0),
        _run("beast", 3, 12.0),
        _run("SB3", 3, None),  # SB3 did not: no pair
        _run("beast", 4, 8.0),  # SB3 failed with seed 4: no run, no pair
    ]
    assert races.paired_ratios(runs, "SB3", races.TIME) == [0.5]
    assert races.paired_ratios(runs, "SB3", races.RATE) == [1.0, 1.0, 1.0]


def test_summary_gives_medians_and_ratios_to_each_peer_and_the_faster():
    race = races.RACES["ppo_cartpole"]
    times = {"beast": [10.0, None, 12.0], "SB3 (1 thr)": [20.0, 30.0, None], "SBX": [5, 6, 7]}
    runs = [
        _run(side, seed, None if t is None else float(t), 100.0 if side == "SBX" else 50.0)
        for side, values in times.items()
        for seed, t in zip((1, 4, 5), values, strict=True)
    ]
    lines = races.summary(race, list(times), runs)
    assert lines[0] == "medians over 3 seed(s):"
    assert lines[1] == "- beast: to 475 12.0 s (reached 2/3), 50.0 steps/s"
    assert lines[2] == "- SB3 (1 thr): to 475 30.0 s (reached 2/3), 50.0 steps/s"
    assert lines[3] == "- SBX: to 475 6.0 s (reached 3/3), 100.0 steps/s"
    # 12 / 30 of the medians; per seed only seed 1 pairs (10 / 20).
    assert lines[4] == "time to 475, beast / SB3 (1 thr): 0.40 (medians); per seed: 0.50 (0.50)"
    # 10 / 5 and 12 / 7, median 1.86.
    assert lines[5] == "time to 475, beast / SBX: 2.00 (medians); per seed: 1.86 (2.00, 1.71)"
    assert lines[6] == "time to 475, beast / the faster peer (SBX): 2.00"
    assert len(lines) == 7  # PPO's race is timed only: no steps/s ratios


def test_summary_of_a_rate_race_and_a_side_with_no_run():
    race = races.RACES["sac_halfcheetah"]
    runs = [
        _run("beast", 1, None, 66.0),
        _run("SB3 (1 thr)", 1, None, 60.0),
        _run("SB3 (2 thr)", 1, None, 33.0),
    ]
    lines = races.summary(race, ["beast", "SB3 (1 thr)", "SB3 (2 thr)", "SBX"], runs)
    assert "- SBX: no run finished" in lines
    assert "steps/s, beast / SB3 (1 thr): 1.10 (medians); per seed: 1.10 (1.10)" in lines
    assert "steps/s, beast / SB3 (2 thr): 2.00 (medians); per seed: 2.00 (2.00)" in lines
    assert lines[-2:] == [
        "steps/s, beast / SB3 at its better thread setting (SB3 (1 thr)): 1.10",
        "steps/s, beast / the faster peer (SB3 (1 thr)): 1.10",
    ]


@pytest.mark.parametrize("name", list(races.RACES))
def test_every_race_has_a_header_matching_its_rows_and_quick_settings(name):
    race = races.RACES[name]
    quick = dataclasses.replace(race, **race.quick)  # every override names a Race field
    assert quick.budget < race.budget
    assert (race.threshold is None) == (races.TIME not in race.figures)
    columns, rule = races.header(race).splitlines()
    line = races.row(race, races.Run("SBX", 1, 3.5, 700, -150.0, 900, 4.0, 225.0, "torch 1"))
    assert columns.count("|") == rule.count("|") == line.count("|")


def test_sides_are_beast_cold_and_warm_sb3_per_thread_count_then_sbx():
    cold, warm = "beast (cold cache)", "beast (warm cache)"
    labels = [side.label for side in races.sides(races.RACES["sac_halfcheetah"], None)]
    assert labels == [cold, warm, "SB3 (1 thr)", "SB3 (2 thr)", "SBX"]
    labels = [side.label for side in races.sides(races.RACES["dqn_cartpole"], None)]
    assert labels == [cold, warm, "SB3 (1 thr)", "SBX"]
    labels = [side.label for side in races.sides(races.RACES["dqn_cartpole"], (0, 2))]
    assert labels == [cold, warm, "SB3 (torch default)", "SB3 (2 thr)", "SBX"]
    race = races.RACES["sac_pendulum"]
    labels = [side.label for side in races.sides(race, None, ("beast",), ("warm",))]
    assert labels == [warm]


def test_beasts_runs_see_an_empty_cache_cold_and_the_warm_one_warm(tmp_path):
    """A cold side's run gets a new empty compile cache, removed after it; a warm side's
    the warm cache; other sides the environment as it was."""
    seen = {}
    settings = races.Settings(warm_cache=str(tmp_path / "warm"))
    before = dict(races._CLEAN_ENVIRON)
    for side in (races.Side("beast", cache="cold"), races.Side("beast", cache="warm")):
        with races.beast_cache(side, settings):
            seen[side.cache] = races._CLEAN_ENVIRON[races.CACHE_VARIABLE]
            if side.cache == "cold":
                assert os.path.isdir(seen["cold"]) and not os.listdir(seen["cold"])
    with races.beast_cache(races.Side("sbx"), settings):
        assert dict(races._CLEAN_ENVIRON) == before
    assert not os.path.exists(seen["cold"])
    assert seen["warm"] == str(tmp_path / "warm")
    assert dict(races._CLEAN_ENVIRON) == before


def test_summary_of_beast_cold_and_warm_gives_their_ratio_first():
    race = races.RACES["sac_pendulum"]
    cold, warm = "beast (cold cache)", "beast (warm cache)"
    runs = [_run(cold, 1, 60.0), _run(warm, 1, 50.0), _run(cold, 4, 66.0), _run(warm, 4, 55.0)]
    lines = races.summary(race, [cold, warm], runs)
    assert lines[3] == (
        "time to -200, beast (cold cache) / beast (warm cache): 1.20 (medians); per seed: 1.20"
        " (1.20, 1.20)"
    )
    assert len(lines) == 4  # no peer: no other ratio


def test_race_flags_parse_lists_and_beast_flags():
    args = races.parse_args(["--beast_flags", "--compile on --updates_per_sample 4"])
    assert args.beast_flags == ("--compile", "on", "--updates_per_sample", "4")
    assert args.seeds == (1, 4, 5) and args.only == tuple(races.RACES)
    assert args.sb3_threads is None  # each race's own
    args = races.parse_args(["--quick", "--only", "sac_pendulum,dqn_cartpole", "--seeds", "7"])
    assert args.seeds == (7,) and args.only == ("sac_pendulum", "dqn_cartpole")
    assert races.parse_args(["--quick"]).seeds == (1,)
    assert races.parse_args(["--beast_flags=--no-dueling"]).beast_flags == ("--no-dueling",)


@pytest.mark.parametrize(
    "argv",
    [
        ["--only", "dqn_pong"],
        ["--only", ""],
        ["--seeds", "1,x"],
        ["--sb3_threads", "-1"],
        ["--beast_flags", '--xpid "unclosed'],
    ],
)
def test_race_flags_refuse_bad_input_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        races.parse_args(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("python -m benchmarks.races: error")


def test_peer_environ_puts_jax_on_the_cpu_for_sbx_only():
    sbx = peers.peer_environ("sbx", "--xla_cpu_multi_thread_eigen=false")
    assert sbx["JAX_PLATFORMS"] == "cpu"
    assert sbx["XLA_FLAGS"] == "--xla_cpu_multi_thread_eigen=false"
    sb3 = peers.peer_environ("sb3", "--xla_cpu_multi_thread_eigen=false")
    assert sb3.get("XLA_FLAGS") == os.environ.get("XLA_FLAGS")
    assert sb3.get("JAX_PLATFORMS") == os.environ.get("JAX_PLATFORMS")
    with pytest.raises(ValueError, match="unknown peer"):
        peers.peer_environ("rllib")


def test_peer_main_calls_the_named_function_with_the_json_arguments(capsys):
    # What a peer's process runs: MODULE:FUNCTION with JSON keyword arguments; one JSON line.
    peers.main(["benchmarks.sb3_qpg_side_by_side:best_mean", '{"returns": [1, 5, 3], "window": 2}'])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == 4.0


def _best_mean_reference(returns: list[float], window: int) -> float:
    """Every window's mean, recomputed from scratch."""
    means = [sum(returns[i : i + window]) / window for i in range(len(returns) - window + 1)]
    return max(means) if means and window > 0 else math.nan


@pytest.mark.parametrize("window", [1, 3, 20])
def test_best_mean_matches_the_mean_of_every_window(window):
    returns = [float(x) for x in np.random.default_rng(window).integers(-1600, 0, size=50)]
    assert qpg.best_mean(returns, window) == pytest.approx(_best_mean_reference(returns, window))
    assert math.isnan(qpg.best_mean(returns[: window - 1], window))  # too few episodes


def test_marked_rate_counts_the_steps_between_the_records_found():
    # beast's records land after the marks (per update): 2,010 -> 5,004 in 30 s.
    marks = {"2000": 40.0, "2000_step": 2010, "5000": 70.0, "5000_step": 5004}
    assert qpg.marked_rate(marks, 2000, 5000) == pytest.approx(2994 / 30)


def test_learner_threads_reads_the_tuners_choice_or_the_start_line():
    line = "run x in /tmp/x: env CartPole-v1, learner on cpu in fp32 with 1 thread(s); lr 1e-3"
    assert learner_threads(f"starting\n{line}\n") == 1
    assert learner_threads("no such line") is None
    tuned = "[beast] learner threads: 2 (agent steps/s 81 with 1, 126 with 2, measured ...)"
    assert learner_threads(f"{line}\n{tuned}\n") == 2  # the tuner's choice, once made


def test_round_trip_latency_benchmark_runs():
    ctx = mp.get_context("forkserver")
    results = measure_round_trip(round_trips=300, group_size=4, ctx=ctx)
    # Figures, not speeds: tens of microseconds when idle, and anything on a busy machine.
    assert results["bare_median_us"] > 0 and results["tensors_median_us"] > 0
    assert results["pipe_median_us"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_every_algorithm_reaches_its_bar_in_every_mode(tmp_path, check):
    """The issue's bars (benchmarks/learning_checks.py prints the same runs as a table:
    steps to the bar, best and last means, wall-clock), seed 1."""
    outcome = run_check(check, seed=1, savedir=str(tmp_path))
    assert outcome.passed, outcome
