"""Contract of benchmarks.atari's pure parts: the threshold crossing on hand-made episode
tables, the median, IQM and stratified bootstrap against hand computations, the /proc
sampler of a run's processes on a child process tree started here (an orphan included),
the growth rules, episodes.csv's time column, and the command line's errors. No Atari run
starts here; one failing monobeast.py start checks the one-line error.
"""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time
from collections import deque
from multiprocessing import shared_memory

import numpy as np
import pytest

from beast.learning.learner import UpdateStats
from beast.outputs.logs import RunLog
from benchmarks import atari

INF = math.inf


# --- The threshold crossing -----------------------------------------------------------


def test_trailing_means_are_full_windows_only():
    means = atari.trailing_means([0.0, 1.0, 2.0, 3.0, 4.0], 3)
    assert np.isnan(means[:2]).all()
    assert means[2:].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "returns, threshold, window, index, best_index, best",
    [
        # Means of 3: 1, 2, 3 at episodes 2, 3, 4: 2 is first reached at episode 3.
        ([0, 1, 2, 3, 4], 2.0, 3, 3, 4, 3.0),
        # Reached at the first full window, then falls back: the first stays.
        ([5, 5, 5, 0, 0], 5.0, 3, 2, 2, 5.0),
        # Never reached: the best is still reported.
        ([-21, -20, -19, -21], -19.0, 2, None, 2, -19.5),
        # Fewer episodes than the window: nothing to judge.
        ([30, 30], 18.0, 3, None, None, math.nan),
    ],
)
def test_first_crossing_by_hand(returns, threshold, window, index, best_index, best):
    crossing = atari.first_crossing(returns, threshold, window)
    assert crossing.index == index and crossing.best_index == best_index
    assert crossing.best == best or (math.isnan(best) and math.isnan(crossing.best))


def write_episodes(path, rows, header=("step", "return", "length", "time")):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def test_time_and_steps_to_the_threshold_from_an_episode_table(tmp_path):
    # Four updates of 640 steps, each consuming episodes; times from the run log's start.
    rows = [
        (640, -21, 800, 1.0),
        (640, -20, 800, 1.0),
        (1280, -19, 800, 2.5),
        (1920, -17, 800, 4.0),
        (2560, -15, 800, 6.0),
    ]
    write_episodes(tmp_path / "episodes.csv", rows)
    episodes = atari.read_episodes(tmp_path / "episodes.csv", launch_offset=3.25)
    assert episodes.seconds.tolist() == [4.25, 4.25, 5.75, 7.25, 9.25]
    # Means of 2: -20.5, -19.5, -18, -16: -18 is first reached by episode 3 (step 1920),
    # 4.0 s after the run log started and 7.25 s after launch.
    crossing = atari.first_crossing(episodes.returns, -18.0, 2)
    assert crossing.index == 3
    assert (episodes.seconds[3], episodes.steps[3]) == (7.25, 1920)
    assert crossing.best == -16.0


def test_time_and_steps_to_the_threshold_from_evaluations(tmp_path):
    # logs.csv: update rows, and evaluation rows (written when the evaluation ended, at the
    # step of the newest update; eval_step the step of the weights evaluated).
    (tmp_path / "logs.csv").write_text(
        "step,time,total_loss,eval_step,eval_mean_return\n"
        "6400,10.0,0.5,,\n"
        "12800,20.5,,6400,-21.0\n"
        "19200,31.0,,12800,18.5\n"
        "25600,40.0,0.4,,\n"
        "32000,52.0,,25600,20.0\n"
    )
    settings = atari.parse_args(["--score", "evaluation", "--out", str(tmp_path)])
    episodes = atari.read_episodes(tmp_path / "episodes.csv", 2.0)  # none: not read
    curve = atari.score_curve(episodes, tmp_path, 2.0, settings)
    assert curve.steps.tolist() == [6400, 12800, 25600]
    assert curve.seconds.tolist() == [22.5, 33.0, 54.0]
    crossing = atari.crossing_of(curve.scores, 18.0)
    assert (crossing.index, crossing.best_index, crossing.best) == (1, 2, 20.0)
    assert atari.crossing_of(curve.scores, 20.5).index is None


def test_an_episode_table_without_time_is_refused(tmp_path):
    write_episodes(tmp_path / "episodes.csv", [(640, -21, 800)], ("step", "return", "length"))
    with pytest.raises(atari.BenchError, match="no time column"):
        atari.read_episodes(tmp_path / "episodes.csv", 0.0)


def test_run_log_stamps_each_episode_with_its_update_time(tmp_path):
    log = RunLog(str(tmp_path), {}, 1000, tensorboard=False, live=False)
    log.record(
        UpdateStats(step=640, num_updates=1, losses={}, episode_returns=[], episode_steps=[])
    )
    log.record(UpdateStats(1280, 2, {}, episode_returns=[-21.0, -20.0], episode_steps=[800, 810]))
    log.close()
    with open(tmp_path / "logs.csv") as f:
        times = {row["step"]: row["time"] for row in csv.DictReader(f)}
    with open(tmp_path / "episodes.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["return"], r["length"]) for r in rows] == [
        ("1280", "-21.0", "800"),
        ("1280", "-20.0", "810"),
    ]
    assert [r["time"] for r in rows] == [times["1280"]] * 2


def test_run_log_widens_an_episode_table_from_before_the_time_column(tmp_path):
    write_episodes(tmp_path / "episodes.csv", [(640, -21, 800)], ("step", "return", "length"))
    log = RunLog(str(tmp_path), {}, 1000, tensorboard=False, live=False)
    log.record(UpdateStats(1280, 2, {}, episode_returns=[-19.0], episode_steps=[700]))
    log.close()
    with open(tmp_path / "episodes.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["step", "return", "length", "time"]
    assert rows[0]["time"] == "" and rows[1]["time"] != ""


# --- Median, IQM, bootstrap -----------------------------------------------------------


def column(values):
    """Runs of one task: [num_runs, 1]."""
    return np.asarray(values, dtype=np.float64).reshape(-1, 1)


@pytest.mark.parametrize(
    "values, iqm",
    [
        # 8 scores: 2 cut from each end, the mean of 3, 4, 5, 6.
        ([8, 1, 7, 2, 6, 3, 5, 4], 4.5),
        # 5 scores: int(1.25) = 1 cut from each end: (2 + 3 + 4) / 3, the outlier gone.
        ([1, 2, 3, 4, 100], 3.0),
        # 3 scores: int(0.75) = 0 cut: the plain mean (rliable's trim_mean does the same).
        ([1, 2, 6], 3.0),
        # A threshold not reached (inf) among the kept scores: not reached.
        ([1, 2, INF], INF),
        # ...but cut off at an end, it no longer counts.
        ([1, 2, 3, 4, INF], 3.0),
    ],
)
def test_interquartile_mean_by_hand(values, iqm):
    assert atari.interquartile_mean(column(values)) == iqm


def test_interquartile_mean_pools_runs_of_every_task():
    # 4 runs x 2 tasks: 8 scores pooled, 2 cut from each end: mean(3, 4, 5, 6).
    scores = np.array([[1, 8], [2, 7], [3, 6], [4, 5]], dtype=np.float64)
    assert atari.interquartile_mean(scores) == 4.5


@pytest.mark.parametrize(
    "values, median", [([3, 1, 2], 2.0), ([4, 1, 3, 2], 2.5), ([1, INF, INF], INF)]
)
def test_median_score_by_hand(values, median):
    assert atari.median_score(column(values)) == median


@pytest.mark.parametrize(
    "values, q, expected",
    [
        ([1, 2, 3, 4], 50.0, 2.5),  # numpy's linear interpolation
        ([1, 2, 3, 4], 2.5, 1.075),  # position 0.075 between 1 and 2
        ([1, 2, 3, 4], 100.0, 4.0),
        ([1, INF, INF], 97.5, INF),  # between two infinities: inf, not numpy's nan
        ([1, 2, INF], 97.5, INF),  # towards an infinity: inf
        ([1, 2, INF], 25.0, 1.5),
    ],
)
def test_percentile_by_hand(values, q, expected):
    assert atari.percentile(np.array(values, dtype=np.float64), q) == pytest.approx(expected)


def test_bootstrap_of_constant_runs_is_a_point():
    assert atari.stratified_bootstrap(column([7, 7, 7]), atari.interquartile_mean, 1000) == (
        7.0,
        7.0,
    )


def test_bootstrap_of_two_runs_by_hand():
    # Resamples of 2 runs from {0, 1}: means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4.
    # The 2.5th and 97.5th percentiles fall inside the outer quarters: 0 and 1 exactly.
    scores = column([0, 1])
    reps = 20_000
    rng = np.random.default_rng(atari.BOOTSTRAP_SEED)
    draws = rng.integers(0, 2, size=(reps, 2, 1)).mean(axis=(1, 2))
    # The same draws as the bootstrap's (same seed, same shape): its distribution is the
    # hand-computed one within sampling error (4 sigma of a proportion over 20k draws).
    for value, probability in ((0.0, 0.25), (0.5, 0.5), (1.0, 0.25)):
        assert abs((draws == value).mean() - probability) < 4 * math.sqrt(0.25 / reps)
    assert atari.stratified_bootstrap(scores, atari.interquartile_mean, reps) == (0.0, 1.0)


def test_bootstrap_resamples_runs_within_each_task():
    # Two tasks, each with two equal runs: a stratified resample always holds [0, 0] for
    # the first and [10, 10] for the second, so the IQM of 4 (mean of the middle two: 0
    # and 10) never moves. Pooling the tasks' runs before resampling would move it.
    scores = np.array([[0, 10], [0, 10]], dtype=np.float64)
    assert atari.stratified_bootstrap(scores, atari.interquartile_mean, 2000) == (5.0, 5.0)


def test_aggregate_counts_a_threshold_not_reached_as_slowest():
    result = atari.aggregate([300.0, 200.0, INF], reps=2000)
    assert result.median == 300.0 and result.iqm == INF  # 3 runs: the IQM is the mean
    assert result.median_ci[0] == 200.0 and result.median_ci[1] == INF


# --- The /proc sampler ----------------------------------------------------------------

# A child that starts a grandchild, which holds 64 MiB of written bytes, prints its pid
# and sleeps.
GRANDCHILD = (
    "import os, time; b = b'x' * (64 << 20); print(os.getpid(), flush=True); time.sleep(60)"
)
CHILD = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}]).wait()"


def process_state(pid: int) -> str | None:
    stat = atari.read_stat(pid)
    return None if stat is None else stat.state


def test_sampler_finds_the_whole_tree_and_an_orphan_and_kills_what_is_left():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        grandchild = int(child.stdout.readline())
        sampler = atari.TreeSampler(child.pid, child.pid)
        sample = sampler.sample(0.0)
        records = {record.pid: record for record in sampler.records.values()}
        assert set(records) == {child.pid, grandchild}
        assert records[child.pid].role == "main"
        # 64 MiB written: its peak RSS (VmHWM) and the sum hold them.
        assert records[grandchild].peak_rss_kib >= 64 * 1024
        assert sample.rss_kib >= 64 * 1024 and sample.processes == 2
        assert sample.private_kib >= 64 * 1024  # malloc's pages: anonymous, private
        assert sample.fds >= 3 * 2  # stdin, stdout, stderr each
        # The child dies: the grandchild, an orphan now, is found through its session.
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert set(sampler.members()) == {grandchild}
        left = atari.leftovers(sampler, seconds=0.2)
        assert len(left) == 1 and str(grandchild) in left[0]
        deadline = time.monotonic() + 5
        while process_state(grandchild) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(grandchild) in (None, "Z")
        assert sampler.members() == {}
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def test_read_stat_of_a_name_with_spaces_and_parentheses(tmp_path):
    # comm comes from the executable's name: "a) (b" splits wrongly at the first ")".
    name = tmp_path / "a) (b"
    os.symlink("/bin/sleep", name)
    proc = subprocess.Popen([str(name), "30"])
    try:
        stat = atari.read_stat(proc.pid)
        assert stat.comm == "a) (b" and stat.ppid == os.getpid() and stat.state in "RSD"
    finally:
        proc.kill()
        proc.wait()


def test_shared_memory_counts_each_segment_once():
    segment = shared_memory.SharedMemory(create=True, size=3 << 20)
    try:
        before = atari.run_shared_memory([os.getpid()])
        # A second mapping of the same segment adds nothing; the segment adds its size.
        again = shared_memory.SharedMemory(name=segment.name)
        assert atari.run_shared_memory([os.getpid(), os.getpid()]) == before
        again.close()
        assert before >= 3 << 20
    finally:
        segment.close()
        segment.unlink()


@pytest.mark.parametrize(
    "pid, cmdline, comm, parent_role, role",
    [
        (10, "python monobeast.py --env Pong", "python", None, "main"),
        (
            11,
            "python -B -c from multiprocessing.forkserver import main",
            "python",
            "main",
            "fork server",
        ),
        # Forked by the fork server: the same command line, an actor.
        (
            12,
            "python -B -c from multiprocessing.forkserver import main",
            "python",
            "fork server",
            "actor",
        ),
        (
            13,
            "python -B -c from multiprocessing.resource_tracker import main",
            "python",
            "main",
            "resource tracker",
        ),
        (
            14,
            "python -m beast.util.parent_death 10 SIGTERM"
            " beast.train_step.build_child:build_in_child",
            "python",
            "main",
            "beast.train_step.build_child:build_in_child",
        ),
        (
            15,
            "g++ wrapper.cpp",
            "g++",
            "beast.train_step.build_child:build_in_child",
            "beast.train_step.build_child:build_in_child",
        ),
        (16, "python -c import sys", "python", "main", "python -c"),
    ],
)
def test_process_roles(pid, cmdline, comm, parent_role, role):
    assert atari.process_role(pid, 10, cmdline, comm, parent_role) == role


# --- Growth rules ---------------------------------------------------------------------


def samples(private_mib, fds=10, every=1.0):
    """Samples whose private memory is `private_mib` (their RSS that and 2 GiB of a
    mapped replay)."""
    return [
        atari.Sample(i * every, int((value + 2048) * 1024), int(value * 1024), fds, 3)
        for i, value in enumerate(private_mib)
    ]


def test_growth_window_starts_when_the_replay_is_full():
    fill = [(10.0, 0.1), (100.0, 0.5), (200.0, 1.0), (300.0, 1.0)]
    start, end, why = atari.growth_window(60.0, 400.0, fill)
    assert (start, end) == (200.0, 400.0) and "fill of 1.000" in why
    # A replay full before the warm-up ends, or none: from the warm-up.
    assert atari.growth_window(60.0, 400.0, [(10.0, 1.0)])[0] == 60.0
    assert atari.growth_window(60.0, 400.0, [])[:2] == (60.0, 400.0)


def test_flat_memory_and_files_are_no_finding():
    window = (60.0, 300.0, "after warm-up")
    flat = samples([1000.0] * 301)
    snapshots = [(t, {"model.tar": 5_000_000, "logs.csv": 100 + int(t)}) for t in range(0, 301, 10)]
    figures, found = atari.growth_findings(flat, snapshots, window)
    assert found == [] and figures["judged"] and figures["private_mib"] == [1000.0, 1000.0]


def test_growth_after_the_window_starts_is_found():
    window = (60.0, 300.0, "after warm-up")
    # 1,000 MiB growing 1 MiB a second: +240 MiB in the window, over 128 MiB and 5%.
    growing = samples([1000.0 + t for t in range(301)], fds=10)
    # replay.tar: written before the fill, rewritten once at the full size, then flat (Ape-X's
    # run of 2026-12-07): no finding. model.tar grows at each rewrite: found.
    snapshots = [
        (60.0, {"model.tar": 5_000_000, "replay.tar": 5_250_000}),
        (180.0, {"model.tar": 5_500_000, "replay.tar": 7_080_000}),
        (300.0, {"model.tar": 6_000_000, "replay.tar": 7_080_000, "stray.log": 10}),
    ]
    _, found = atari.growth_findings(growing, snapshots, window)
    assert any(line.startswith("memory:") for line in found)
    assert any("model.tar grew 5,500,000 -> 6,000,000" in line for line in found)
    assert not any("replay.tar" in line for line in found)
    assert any("stray.log appeared" in line for line in found)


def test_shared_memory_touched_by_more_processes_is_no_finding():
    """A full replay's pages count in the RSS of every process that has touched them: an
    actor writing into rows another actor filled grows its RSS, not the machine's use."""
    window = (60.0, 300.0, "after the replay reached its fill of 1.000")
    touching = [atari.Sample(t, (7_700 + 10 * t) * 1024, 4_000 * 1024, 10, 3) for t in range(301)]
    replay = [(float(t), 2_889 * atari.MIB) for t in range(0, 301, 10)]
    figures, found = atari.growth_findings(touching, [], window, replay)
    assert found == [] and figures["private_mib"] == [4000.0, 4000.0]
    assert figures["shared_mib"] == [2889.0, 2889.0]
    # A segment that appears in the window (the replay held twice) is found.
    grown = replay[:-1] + [(300.0, 2 * 2_889 * atari.MIB)]
    _, found = atari.growth_findings(touching, [], window, grown)
    assert found == [
        "memory: the run's shared memory (each segment once) grew 2,889 MiB (2,889 -> 5,778)"
        " between 60 and 300 s, after the replay reached its fill of 1.000"
    ]


def test_logs_faster_than_the_limit_are_found():
    window = (0.0, 3600.0, "after warm-up")
    snapshots = [(0.0, {"logs.csv": 0}), (3600.0, {"logs.csv": 60 * atari.MIB})]
    figures, found = atari.growth_findings(samples([100.0] * 3), snapshots, window)
    assert figures["logs_mib_per_hour"] == pytest.approx(60.0)
    assert any(line.startswith("logs:") for line in found)


def test_a_short_window_is_not_judged():
    figures, found = atari.growth_findings(samples([1.0, 900.0]), [], (60.0, 90.0, "x"))
    assert not figures["judged"] and found == []


# --- Files being written ----------------------------------------------------------------


def test_csv_tail_returns_whole_rows_once(tmp_path):
    path = tmp_path / "logs.csv"
    tail = atari.CsvTail(path)
    assert tail.rows() == []  # not there yet
    path.write_text("step,time\n640,1.5\n1280,2.")
    assert tail.rows() == [{"step": "640", "time": "1.5"}]
    with open(path, "a") as f:
        f.write("5\n1920,3.0\n")
    assert tail.rows() == [{"step": "1280", "time": "2.5"}, {"step": "1920", "time": "3.0"}]
    assert tail.rows() == []


def test_polling_bounds_the_start_up_from_above_and_sees_the_threshold(tmp_path):
    settings = atari.parse_args(["--window", "2", "--threshold", "-19", "--out", str(tmp_path)])
    watch = atari.Watch(None, time.monotonic() - 10.0, tmp_path, settings, None)
    logs, episodes = atari.CsvTail(tmp_path / "logs.csv"), atari.CsvTail(tmp_path / "episodes.csv")
    window = deque(maxlen=2)
    (tmp_path / "logs.csv").write_text("step,time\n640,4.0\n")
    write_episodes(tmp_path / "episodes.csv", [(640, -21, 800, 4.0)])
    watch.poll_files(logs, episodes, window)
    # Read 10 s after launch, a row of 4 s on the run's clock: the start-up is at most 6 s.
    assert 6.0 <= watch.launch_offset < 7.0  # the poll itself took well under a second
    assert watch.last_step == 640 and watch.threshold_seen_at is None
    # A row written just before the next poll tightens the bound; the mean of the last
    # two episodes reaches -19.
    now = watch.now()
    with open(tmp_path / "logs.csv", "a") as f:
        f.write(f"1280,{now - 0.5}\n")
    with open(tmp_path / "episodes.csv", "a") as f:
        f.write(f"1280,-17,800,{now - 0.5}\n")
    watch.poll_files(logs, episodes, window)
    assert 0.5 <= watch.launch_offset < 1.5
    assert watch.last_step == 1280 and watch.threshold_seen_at >= now


def test_polling_sees_the_threshold_in_an_evaluation_not_in_the_episodes(tmp_path):
    settings = atari.parse_args(
        ["--score", "evaluation", "--window", "1", "--threshold", "18", "--out", str(tmp_path)]
    )
    watch = atari.Watch(None, time.monotonic() - 10.0, tmp_path, settings, None)
    logs, episodes = atari.CsvTail(tmp_path / "logs.csv"), atari.CsvTail(tmp_path / "episodes.csv")
    window = deque(maxlen=1)
    (tmp_path / "logs.csv").write_text("step,time,eval_mean_return\n640,4.0,\n1280,5.0,17.0\n")
    write_episodes(tmp_path / "episodes.csv", [(640, 21, 800, 4.0)])  # a lucky episode
    watch.poll_files(logs, episodes, window)
    assert watch.threshold_seen_at is None
    with open(tmp_path / "logs.csv", "a") as f:
        f.write("1920,6.0,18.0\n")
    watch.poll_files(logs, episodes, window)
    assert watch.threshold_seen_at is not None


# --- Command line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds", [("90", 90.0), ("90s", 90.0), ("20m", 1200.0), ("2h", 7200.0)]
)
def test_parse_duration(text, seconds):
    assert atari.parse_duration(text) == seconds


@pytest.mark.parametrize(
    "argv",
    [
        ["--budget", "soon"],
        ["--budget", "0"],
        ["--window", "0"],
        ["--seeds", "1", "1"],
        ["--", "--seed", "3"],
        ["--", "--xpid=mine"],
    ],
)
def test_bad_arguments_exit_2_in_one_line(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        atari.parse_args([*argv, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()[-1]) > 0


def test_defaults_are_the_default_pong_run(tmp_path):
    settings = atari.parse_args(["--out", str(tmp_path)])
    assert (settings.algo, settings.env, settings.threshold) == ("impala", "PongNoFrameskip-v4", 18)
    assert settings.seeds == (1,) and settings.budget == 1200.0 and not settings.stop_at_threshold
    assert settings.flags == ()


@pytest.mark.parametrize(
    "argv, score",
    [
        ([], "episodes"),  # IMPALA: every env samples the same policy
        (["--algo", "apex"], "evaluation"),  # Ape-X's per-env epsilons
        (["--algo", "apex", "--", "--exploration", "linear"], "episodes"),  # one schedule
        (["--algo", "dqn", "--", "--exploration=per_env"], "evaluation"),
        (["--algo", "dqn", "--score", "evaluation"], "evaluation"),
    ],
)
def test_auto_score_asks_whether_the_envs_act_alike(argv, score, tmp_path):
    assert atari.parse_args(["--out", str(tmp_path), *argv]).score == score


def test_an_evaluation_interval_after_the_separator_wins(tmp_path):
    settings = atari.parse_args(
        ["--score", "evaluation", "--out", str(tmp_path), "--", "--eval_interval", "5000"]
    )
    assert settings.eval_interval == 5000
    assert atari.flag_value(["--a", "1", "--a=2", "--b"], "--a") == "2"
    assert atari.flag_value(["--b"], "--b") is None


def test_a_failing_run_is_one_line_and_exit_2(tmp_path, capsys):
    # monobeast.py refuses the env in its start-up (a few seconds: its imports).
    argv = ["--env", "NoSuchGame-v0", "--budget", "120", "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        atari.main([*argv, "--score", "episodes"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exited with 2" in err[0] and "NoSuchGame-v0" in err[0]
    assert (tmp_path / "summary.json").exists()
    # --score auto reads the run's config and env first: the same env error, before launch.
    with pytest.raises(SystemExit) as exit_info:
        atari.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NoSuchGame-v0" in err[0]
