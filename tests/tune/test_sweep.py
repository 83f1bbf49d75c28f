"""beast.sweep: sweep files expand to named runs, run on local slots, resume, report."""

import csv
import math
import os
import subprocess
import sys

import pytest

from beast.config import ConfigError
from beast.tune.sweep import command, expand, is_finished, load_sweep, slot_resources

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sweep_file(tmp_path, text):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


def test_grid_expands_to_every_combination_with_stable_names(tmp_path):
    spec = load_sweep(
        sweep_file(
            tmp_path,
            "flags: {env: CartPole-v1, total_steps: 1000}\n"
            "grid: {learning_rate: [0.001, 0.002], use_lstm: [true, false]}\n",
        )
    )
    assert spec.name == "s"  # the file's name
    runs = expand(spec)
    assert [run.name for run in runs] == [
        "learning_rate=0.001,use_lstm=true",
        "learning_rate=0.001,use_lstm=false",
        "learning_rate=0.002,use_lstm=true",
        "learning_rate=0.002,use_lstm=false",
    ]
    assert runs[1].flags == {
        "env": "CartPole-v1",
        "total_steps": 1000,
        "learning_rate": 0.001,
        "use_lstm": False,
    }
    assert runs[1].varying == {"learning_rate": 0.001, "use_lstm": False}


def test_random_search_is_seeded_in_range_and_crossed_with_the_grid(tmp_path):
    text = (
        "grid: {seed: [1, 2]}\n"
        "random:\n  num_samples: 5\n  seed: 3\n  params:\n"
        "    learning_rate: {log_uniform: [0.0001, 0.01]}\n"
        "    baseline_cost: {uniform: [0.25, 0.5]}\n"
        "    unroll_length: {int_uniform: [10, 12]}\n"
        "    optimizer: {choice: [adam, rmsprop]}\n"
    )
    runs = expand(load_sweep(sweep_file(tmp_path, text)))
    assert len(runs) == 10
    again = expand(load_sweep(sweep_file(tmp_path, text)))
    assert [r.flags for r in runs] == [r.flags for r in again]  # the seed fixes the draws
    for run in runs:
        v = run.varying
        assert 1e-4 <= v["learning_rate"] <= 1e-2 and 0.25 <= v["baseline_cost"] <= 0.5
        assert type(v["unroll_length"]) is int and 10 <= v["unroll_length"] <= 12
        assert v["optimizer"] in ("adam", "rmsprop")
    # Each seed runs the same 5 draws.
    draws = [{k: v for k, v in r.varying.items() if k != "seed"} for r in runs]
    assert draws[:5] == draws[5:]
    assert len({r.name for r in runs}) == 10


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("grid: {lerning_rate: [0.1]}\n", "unknown key 'lerning_rate' (did you mean"),
        ("grid: {num_actors: [1, two]}\n", "key 'num_actors' must be an integer"),
        ("flags: {optimizer: sgd}\n", "key 'optimizer' must be one of"),
        ("grid: {seed: []}\n", "grid key 'seed' needs a non-empty list"),
        ("grid: {xpid: [a]}\n", "'xpid' is set by the sweep"),
        ("flags: {seed: 1}\ngrid: {seed: [2]}\n", "'seed' is set in more than one section"),
        ("grids: {seed: [1]}\n", "unknown key 'grids'"),
        (
            "random: {num_samples: 2, params: {batch_size: {uniform: [1, 4]}}}\n",
            "key 'batch_size' must be an integer",
        ),
        (
            "random: {num_samples: 2, params: {learning_rate: {normal: [0, 1]}}}\n",
            "'learning_rate' needs one of",
        ),
        ("random: {num_samples: 0, params: {seed: {choice: [1]}}}\n", "num_samples must be"),
        ("max_parallel: 0\n", "max_parallel must be a positive integer"),
    ],
)
def test_bad_sweep_files_name_the_file_and_key(tmp_path, text, fragment):
    path = sweep_file(tmp_path, text)
    with pytest.raises(ConfigError) as info:  # SweepError is one
        load_sweep(path)
    assert fragment in str(info.value) and path in str(info.value)


def test_command_spells_flags_as_monobeast_reads_them(tmp_path):
    spec = load_sweep(
        sweep_file(tmp_path, "flags: {use_lstm: false, learning_rate: 0.1}\ngrid: {seed: [3]}\n")
    )
    argv = command(expand(spec)[0], "/sweeps/s", num_threads=2)
    assert argv[2:] == [
        "--no-use_lstm",
        "--learning_rate",
        "0.1",
        "--seed",
        "3",
        "--num_threads",
        "2",
        "--savedir",
        "/sweeps/s",
        "--xpid",
        "seed=3",
    ]


def test_slots_pin_disjoint_cores_and_share_gpus_round_robin():
    assert slot_resources(2, 2, [0, 1, 2, 3], ["5", "7"]) == [([0, 1], "5"), ([2, 3], "7")]
    # Three slots, one GPU: each slot gets it; 3 x 1 cores fit in 4.
    assert slot_resources(3, 1, [0, 1, 2, 3], ["0"]) == [([0], "0"), ([1], "0"), ([2], "0")]
    # Oversubscribed: no pinning rather than overlapping pins; no GPUs: none set.
    assert slot_resources(2, 2, [0, 1], []) == [(None, None), (None, None)]


def run_sweep_cli(path, savedir, *extra):
    return subprocess.run(
        [sys.executable, "-m", "beast.sweep", path, "--savedir", str(savedir), *extra],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )


def test_tiny_cartpole_sweep_runs_reports_and_resumes(tmp_path):
    path = sweep_file(
        tmp_path,
        "name: tiny\n"
        "max_parallel: 2\n"
        "flags: {env: CartPole-v1, total_steps: 2000, num_actors: 1, num_envs_per_actor: 2,"
        " batch_size: 2, unroll_length: 10, log_interval: 1.0}\n"
        "grid: {seed: [1, 2]}\n",
    )
    savedir = tmp_path / "runs"
    first = run_sweep_cli(path, savedir)
    assert first.returncode == 0, first.stdout + first.stderr
    sweep_dir = savedir / "tiny"
    for name in ("seed=1", "seed=2"):
        run_dir = sweep_dir / name
        assert is_finished(str(run_dir))
        assert (run_dir / "model.tar").is_file() and (run_dir / "sweep.log").is_file()
        assert any(f.startswith("events.out.tfevents") for f in os.listdir(run_dir))
    assert first.stdout.count("[sweep] started") == 2
    with open(sweep_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["run"] for row in rows] == ["seed=1", "seed=2"]
    for row in rows:
        assert row["status"] == "done" and math.isfinite(float(row["mean_return"]))
        assert float(row["sps"]) > 0 and float(row["wall_clock_s"]) > 0
    header = next(line for line in first.stdout.splitlines() if line.startswith("seed"))
    assert header.split() == ["seed", "mean_return", "SPS", "wall_clock", "status"]
    assert (sweep_dir / "returns.png").read_bytes()[:4] == b"\x89PNG"

    # Started again: both runs are finished, so nothing runs and the table is the same.
    again = run_sweep_cli(path, savedir)
    assert again.returncode == 0, again.stderr
    assert "(2 finished before)" in again.stdout and "[sweep] started" not in again.stdout


def test_dry_run_and_bad_file_exit_codes(tmp_path):
    path = sweep_file(tmp_path, "flags: {env: CartPole-v1}\ngrid: {seed: [1, 2, 3]}\n")
    dry = run_sweep_cli(path, tmp_path, "--dry_run", "--max_parallel", "1")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("monobeast.py") == 3 and not (tmp_path / "s").exists()
    bad = run_sweep_cli(sweep_file(tmp_path, "grid: {sed: [1]}\n"), tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("python -m beast.sweep: error:")
    assert "unknown key 'sed'" in bad.stderr


def test_help_describes_every_mode(capsys):
    from beast.tune.sweep import main

    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse's line wraps undone
    for mode in ("grid (", "random (", "optuna (", "pbt ("):
        assert mode in text
    assert "population-based training" in text and "TPE" in text and "resume" in text
