"""--wandb: the run log's one scalar writer feeding W&B, an offline run's records read back
from its .wandb file, resume, and runs without --wandb or without the package."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from beast.outputs.logs import ScalarWriter
from tests.support.runs import (
    CARTPOLE_SMALL,
    ROOT,
    assert_refused_in_one_line,
    read_csv,
    wait_until_gone,
)
from tests.support.wandb_files import history_rows, wandb_records


class FakeWandbRun:
    """What ScalarWriter calls on a `wandb.Run`, recorded."""

    def __init__(self):
        self.axes, self.rows, self.finished = {}, [], False

    def define_metric(self, name, step_metric):
        assert name not in self.axes, f"{name} defined twice"
        self.axes[name] = step_metric

    def log(self, row):
        self.rows.append(row)

    def finish(self):
        self.finished = True


class FakeTensorBoard:
    def __init__(self):
        self.points, self.closed = [], False

    def add_scalar(self, tag, value, step):
        self.points.append((tag, value, step))

    def close(self):
        self.closed = True


def test_one_writer_feeds_tensorboard_and_wandb_the_same_scalars():
    tensorboard, wandb_run = FakeTensorBoard(), FakeWandbRun()
    writer = ScalarWriter(tensorboard, wandb_run)
    writer.episode_returns([1.0, 3.0], step=10)
    writer.write({"total_loss": 0.5}, step=20)
    writer.episode_returns([8.0], step=30)
    writer.write({"eval/mean_return": 7.0}, step=15)  # an evaluation arrives late
    writer.write({"total_loss": 0.25, "sps": 100.0}, step=40)
    writer.close()
    assert tensorboard.points == [
        ("episode_return", 1.0, 10),
        ("episode_return", 3.0, 10),
        ("total_loss", 0.5, 20),
        ("episode_return", 8.0, 30),
        ("eval/mean_return", 7.0, 15),
        ("total_loss", 0.25, 40),
        ("sps", 100.0, 40),
    ]
    # W&B: a row per write, its episodes' mean in the next training row, evaluations on
    # their own axis (W&B's own step only grows).
    assert wandb_run.rows == [
        {"total_loss": 0.5, "episode_return": 2.0, "step": 20},
        {"eval/mean_return": 7.0, "eval/step": 15},
        {"total_loss": 0.25, "sps": 100.0, "episode_return": 8.0, "step": 40},
    ]
    assert wandb_run.axes == {
        "total_loss": "step",
        "episode_return": "step",
        "sps": "step",
        "eval/mean_return": "eval/step",
    }
    assert tensorboard.closed and wandb_run.finished


def wandb_env(tmp_path) -> dict:
    """The test's environment for wandb: its home-level files under tmp_path, no
    WANDB_MODE from outside (the flag decides)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    for name in ("CONFIG", "CACHE", "DATA", "ARTIFACT"):
        env[f"WANDB_{name}_DIR"] = str(tmp_path / f"wandb-{name.lower()}")
    return dict(env, PYTHONUNBUFFERED="1")


def monobeast(code: str, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    """monobeast.main(argv) in a fresh interpreter, after `code` ran there."""
    program = f"import sys\n{code}\nimport monobeast\nsys.exit(monobeast.main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", program, *argv],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env=env,
    )


def test_an_offline_run_logs_the_scalars_evaluations_config_and_resumes(tmp_path):
    pytest.importorskip("wandb")
    argv = [*CARTPOLE_SMALL, "--eval_interval", "1000", "--eval_episodes", "2"]
    argv += ["--wandb", "--wandb_mode", "offline", "--wandb_project", "beast-test"]
    argv += ["--wandb_group", "g1", "--wandb_tags", "t1, t2", "--savedir", str(tmp_path)]
    argv += ["--xpid", "w"]
    result = monobeast("", [*argv, "--total_steps", "2000"], wandb_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "w"
    run_id = (run_dir / "wandb_id").read_text().strip()
    assert f"W&B run {run_id} (offline)" in result.stdout
    (path,) = glob.glob(str(run_dir / "wandb" / f"offline-run-*-{run_id}" / f"run-{run_id}.wandb"))
    records = wandb_records(path)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_id, run.project, run.display_name) == (run_id, "beast-test", "w")
    assert run.run_group == "g1" and list(run.tags) == ["t1", "t2"]
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["env"] == "CartPole-v1" and config["eval_interval"] == 1000
    assert "commit" in config["git"]
    rows = history_rows(records)
    trained = [row for row in rows if "step" in row]
    assert {"total_loss", "grad_norm", "learning_rate"} <= set().union(*trained)
    assert any("sps" in row for row in trained) and any("episode_return" in row for row in rows)
    # The evaluations: the same steps and means as logs.csv's eval rows.
    evals = [row for row in rows if "eval/step" in row]
    csv_evals = [row for row in read_csv(run_dir / "logs.csv") if row["eval_step"]]
    assert [row["eval/step"] for row in evals] == [int(row["eval_step"]) for row in csv_evals]
    assert [row["eval/mean_return"] for row in evals] == pytest.approx(
        [float(row["eval_mean_return"]) for row in csv_evals]
    )
    axes = {
        r.metric.name: r.metric.step_metric
        for r in records
        if r.WhichOneof("record_type") == "metric"
    }
    assert axes["total_loss"] == "step" and axes["eval/mean_return"] == "eval/step"

    # Resuming the run continues its W&B run: the same id.
    result = monobeast("", [*argv, "--total_steps", "3000"], wandb_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming w" in result.stdout and f"W&B run {run_id} (offline)" in result.stdout
    assert len(glob.glob(str(run_dir / "wandb" / f"offline-run-*-{run_id}"))) == 2


def test_ctrl_c_stops_a_wandb_run_and_wandbs_own_processes(tmp_path):
    pytest.importorskip("wandb")
    marker = uuid.uuid4().hex
    argv = [*CARTPOLE_SMALL, "--total_steps", "100000000", "--wandb", "--wandb_mode", "offline"]
    env = dict(wandb_env(tmp_path), BEAST_TEST_MARKER=marker)
    proc = subprocess.Popen(
        [sys.executable, "monobeast.py", *argv, "--savedir", str(tmp_path), "--xpid", "c"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (tmp_path / "c" / "logs.csv").exists() and len(
                read_csv(tmp_path / "c" / "logs.csv")
            ) > 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "interrupted" in out
    assert wait_until_gone(marker) == []  # wandb-core and wandb-symon too


def test_a_run_without_wandb_neither_imports_it_nor_writes_its_files(tmp_path):
    argv = [*CARTPOLE_SMALL, "--total_steps", "400", "--eval_interval", "200"]
    argv += ["--savedir", str(tmp_path), "--xpid", "n"]
    env = wandb_env(tmp_path)
    result = monobeast(
        "import atexit; atexit.register(lambda: print('wandb' in sys.modules))", argv, env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "False"
    found = [name for name in os.listdir(tmp_path / "n") if "wandb" in name]
    assert found == [] and not [p for p in tmp_path.iterdir() if p.name.startswith("wandb-")]


def test_wandb_without_the_package_is_one_line_saying_how_to_install_it(tmp_path):
    argv = [*CARTPOLE_SMALL, "--wandb", "--savedir", str(tmp_path), "--xpid", "m"]
    result = monobeast("sys.modules['wandb'] = None  # import wandb fails", argv, os.environ)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install wandb" in lines[0], result.stderr
    assert lines[0].startswith("monobeast.py: error: --wandb needs the wandb package")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--wandb_tags", "a,,b"], "each comma-separated tag must have 1 to 64 characters"),
        (["--wandb_tags", "x" * 65], "each comma-separated tag must have 1 to 64 characters"),
        (["--wandb_project", " "], "--wandb_project must not be empty"),
        (["--wandb_mode", "sometimes"], "invalid choice: 'sometimes'"),
    ],
)
def test_bad_wandb_flags_are_one_line_and_exit_2(tmp_path, argv, fragment):
    pytest.importorskip("wandb")
    assert_refused_in_one_line(tmp_path, ["--env", "CartPole-v1", "--wandb", *argv], fragment)
