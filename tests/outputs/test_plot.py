"""beast.plot: smoothed curves from a run directory's CSVs, and the PNG they make."""

import numpy as np
import pytest

from beast.outputs.plot import load_curve, main, plot_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(path, returns, steps=None, log_rows=((0, 0.0), (100, 10.0), (200, 30.0))):
    path.mkdir(parents=True)
    steps = steps if steps is not None else [10 * (i + 1) for i in range(len(returns))]
    lines = ["step,return,length"] + [f"{s},{r},5" for s, r in zip(steps, returns, strict=True)]
    (path / "episodes.csv").write_text("\n".join(lines) + "\n")
    log = ["step,num_updates,time,total_loss"]
    log += [f"{s},{i},{t},0.1" for i, (s, t) in enumerate(log_rows)]
    (path / "logs.csv").write_text("\n".join(log) + "\n")
    return str(path)


def test_curve_is_a_trailing_mean_over_the_window(tmp_path):
    run = make_run(tmp_path / "a", returns=[1, 2, 3, 4, 5])
    curve = load_curve(run, window=2)
    # Worked by hand: [1], [1,2], [2,3], [3,4], [4,5].
    np.testing.assert_allclose(curve.mean_returns, [1.0, 1.5, 2.5, 3.5, 4.5])
    np.testing.assert_allclose(curve.steps, [10, 20, 30, 40, 50])
    assert curve.label == "a"


def test_wall_clock_is_interpolated_from_logs_csv(tmp_path):
    run = make_run(tmp_path / "a", returns=[0, 0, 0], steps=[50, 100, 150])
    # logs.csv: step 0 -> 0 s, 100 -> 10 s, 200 -> 30 s.
    np.testing.assert_allclose(load_curve(run).seconds, [5.0, 10.0, 20.0])


def test_a_resumed_run_adds_up_the_time_of_its_processes(tmp_path):
    # The resumed process's clock restarts at 0 s after step 200 (20 s of training).
    rows = ((100, 10.0), (200, 20.0), (300, 5.0))
    run = make_run(tmp_path / "a", returns=[0, 0], steps=[250, 300], log_rows=rows)
    np.testing.assert_allclose(load_curve(run).seconds, [22.5, 25.0])


def test_rows_a_resume_from_an_older_checkpoint_undid_are_dropped(tmp_path):
    """Steps 200-300 were logged, lost in a crash, and trained again from the
    checkpoint at step 200: the first attempt's episodes leave the curve, its time
    stays in the wall-clock."""
    rows = ((100, 10.0), (200, 20.0), (300, 30.0), (250, 6.0), (350, 12.0))
    run = make_run(
        tmp_path / "a",
        returns=[1, 2, 100, 100, 3, 4],
        steps=[150, 200, 250, 300, 250, 350],
        log_rows=rows,
    )
    curve = load_curve(run, window=1)
    np.testing.assert_allclose(curve.steps, [150, 200, 250, 350])
    np.testing.assert_allclose(curve.mean_returns, [1, 2, 3, 4])
    # 30 s ran before the crash; the second process's 6 s and 12 s come after them.
    np.testing.assert_allclose(curve.seconds, [15.0, 20.0, 36.0, 42.0])


def test_plot_writes_a_png_with_every_run(tmp_path):
    a = make_run(tmp_path / "a", returns=list(range(300)))
    b = make_run(tmp_path / "b", returns=[], steps=[])  # nothing finished yet
    out = plot_runs([a, b], str(tmp_path / "out" / "returns.png"), title="t")
    with open(out, "rb") as f:
        assert f.read(8) == PNG_MAGIC


def test_cli_default_output_and_errors(tmp_path, capsys):
    run = make_run(tmp_path / "a", returns=[1, 2, 3])
    assert main([run]) == 0
    assert (tmp_path / "a" / "returns.png").read_bytes()[:8] == PNG_MAGIC
    assert "returns.png" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "missing")])
    assert info.value.code == 2
    assert "no episodes.csv" in capsys.readouterr().err
