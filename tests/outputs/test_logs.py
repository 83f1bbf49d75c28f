"""RunLog: the run directory's files, TensorBoard events and the console, TTY or not."""

import csv
import io
import json

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from beast.learning.learner import UpdateStats
from beast.outputs.eval_report import EvalReport
from beast.outputs.logs import EVAL_COLUMNS, RunLog, format_duration, pip_freeze


def stats(step: int, returns=(), loss: float = 1.5) -> UpdateStats:
    return UpdateStats(
        step=step,
        num_updates=step // 10,
        losses={"total_loss": loss, "pg_loss": 0.5},
        episode_returns=list(returns),
        episode_steps=[10] * len(returns),
    )


@pytest.fixture
def config():
    return {"env": "CartPole-v1", "learning_rate": 0.002, "xpid": "r"}


def test_run_directory_holds_what_reproduces_the_run(tmp_path, config):
    log = RunLog(str(tmp_path), config, 100, stream=io.StringIO(), tensorboard=False)
    log.close()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == config
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["config"] == config and "commit" in meta["git"]
    freeze = (tmp_path / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("torch==") for line in freeze)
    if meta["git"].get("dirty"):
        assert (tmp_path / "git_diff.patch").read_text().startswith("diff --git")
    else:
        assert not (tmp_path / "git_diff.patch").exists()


def test_pip_freeze_format():
    lines = pip_freeze().splitlines()
    assert lines and all("==" in line for line in lines)


def test_csv_and_tensorboard_hold_the_same_stats(tmp_path, config, monkeypatch):
    log = RunLog(str(tmp_path), config, 100, stream=io.StringIO())
    log.record(stats(10, returns=[1.0, 3.0], loss=2.0))
    log.record(stats(15, returns=[5.0], loss=7.0))  # within TENSORBOARD_INTERVAL: CSV only
    monkeypatch.setattr("beast.outputs.logs.TENSORBOARD_INTERVAL", 0.0)
    log.record(stats(20, loss=1.0))
    log.close()
    with open(tmp_path / "logs.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["step"] for row in rows] == ["10", "15", "20"]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"total_loss", "pg_loss", "time", "num_updates", "mean_episode_return"} <= tags
    loss = events.Scalars("total_loss")
    assert [(e.step, e.value) for e in loss] == [(10, 2.0), (20, 1.0)]
    # An update without finished episodes has no mean return (an empty CSV cell).
    assert [(e.step, e.value) for e in events.Scalars("mean_episode_return")] == [(10, 2.0)]
    assert [e.value for e in events.Scalars("episode_return")] == [1.0, 3.0, 5.0]


def test_non_tty_console_gets_plain_lines_only(tmp_path, config):
    stream = io.StringIO()  # not a terminal
    log = RunLog(str(tmp_path), config, 100, stream=stream, tensorboard=False)
    log.record(stats(50, returns=[7.0]))
    log.report_progress()
    log.print("hello")
    log.close()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[beast] step 50/100 (50.0%) | SPS")
    assert "return 7.00" in lines[0] and "loss 1.5" in lines[0] and "ETA" in lines[0]
    assert lines[1] == "[beast] hello"
    assert "\x1b" not in stream.getvalue() and "\r" not in stream.getvalue()


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_a_live_bar_and_messages_above_it(tmp_path, config):
    stream = FakeTerminal()
    log = RunLog(str(tmp_path), config, 100, stream=stream, tensorboard=False)
    log.record(stats(50, returns=[7.0]))
    log.report_progress()  # the bar shows it: no extra line
    log.print("a [bracketed] message")
    log.close()
    out = stream.getvalue()
    assert "50/100" in out and "return 7.00" in out and "loss 1.5" in out and "SPS" in out
    assert "[beast] a [bracketed] message" in out  # not read as rich markup
    assert "[beast] step" not in out


def test_an_evaluation_is_a_row_of_its_own_with_eval_scalars_and_a_line(tmp_path, config):
    stream = io.StringIO()
    log = RunLog(str(tmp_path), config, 100, stream=stream, evaluation=True)
    log.record(stats(100, returns=[4.0]))
    result = EvalReport(step=80, returns=(1.0, 2.0, 6.0), lengths=(3, 4, 5), seconds=0.5, best=True)
    log.record_eval(result)
    log.record(stats(120))
    log.close()
    with open(tmp_path / "logs.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[-len(EVAL_COLUMNS) :] == list(EVAL_COLUMNS)
    assert [row["step"] for row in rows] == ["100", "100", "120"]  # when written
    update, evaluation, _ = rows
    assert all(update[column] == "" for column in EVAL_COLUMNS)
    assert evaluation["total_loss"] == "" and evaluation["eval_step"] == "80"
    # Statistics of (1, 2, 6): mean 3, median 2, population std sqrt(14/3).
    assert float(evaluation["eval_mean_return"]) == 3.0
    assert float(evaluation["eval_median_return"]) == 2.0
    assert float(evaluation["eval_std_return"]) == pytest.approx((14 / 3) ** 0.5)
    assert (evaluation["eval_min_return"], evaluation["eval_max_return"]) == ("1.0", "6.0")
    assert (evaluation["eval_mean_length"], evaluation["eval_episodes"]) == ("4.0", "3")
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/mean_return")] == [(80, 3.0)]
    assert [(e.step, e.value) for e in events.Scalars("eval/max_return")] == [(80, 6.0)]
    assert (
        "[beast] evaluation at step 80: mean return 3.00 (median 2.00, min 1.00, max 6.00)"
        " over 3 episodes of 4.0 steps, in 0.5 s; the best so far"
    ) in stream.getvalue().splitlines()


def test_a_resumed_run_that_logs_more_columns_widens_logs_csv(tmp_path, config):
    log = RunLog(str(tmp_path), config, 100, stream=io.StringIO(), tensorboard=False)
    log.record(stats(10, returns=[1.0]))
    log.close()
    log = RunLog(
        str(tmp_path), config, 100, stream=io.StringIO(), tensorboard=False, evaluation=True
    )
    log.record(stats(20, loss=3.0))
    log.close()
    with open(tmp_path / "logs.csv") as f:
        header = next(csv.reader(f))
    with open(tmp_path / "logs.csv") as f:
        rows = list(csv.DictReader(f))
    assert header[-len(EVAL_COLUMNS) :] == list(EVAL_COLUMNS)
    assert [(row["step"], row["total_loss"], row["mean_episode_return"]) for row in rows] == [
        ("10", "1.5", "1.0"),
        ("20", "3.0", ""),
    ]
    assert all(row[column] == "" for row in rows for column in EVAL_COLUMNS)
    assert not (tmp_path / "logs.csv.tmp").exists()


def test_a_resumed_run_shows_its_last_known_return(tmp_path, config):
    """The progress line of a resumed run has the return of the episodes before the
    checkpoint it resumes from, not "no episode finished yet", until new ones end."""
    log = RunLog(str(tmp_path), config, 1000, stream=io.StringIO(), tensorboard=False)
    log.record(stats(100, returns=[float(i) for i in range(150)]))
    log.record(stats(200, returns=[1000.0]))  # after the checkpoint the resume starts from
    log.close()
    resumed = RunLog(str(tmp_path), config, 1000, stream=io.StringIO(), tensorboard=False)
    resumed.start_from(100)
    # The window: the last 100 of the 150 episodes by step 100, returns 50 to 149.
    assert "| return 99.50 (last 100 of 150 eps) |" in resumed.progress_line()
    resumed.record(stats(110, returns=[250.0]))
    assert "| return 101.50 (last 100 of 151 eps) |" in resumed.progress_line()  # 51..149, 250
    resumed.close()


def test_format_duration():
    assert format_duration(3725) == "1:02:05"
    assert format_duration(float("inf")) == "?"
