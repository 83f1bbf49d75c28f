"""beast.tune: the Optuna search (trials pruned on evaluations, a storage that survives
pruned, failed and interrupted trials and resumes) and population-based training (rounds,
copies of the top members' checkpoints, perturbations, lineage; locally and on Ray)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from beast.outputs.checkpoint import load_latest_checkpoint, save_checkpoint
from beast.tune import optuna_search, pbt
from beast.tune.runs import Evaluation, evaluations, read_rows
from beast.tune.sweep import load_sweep, main, run_sweep

optuna = pytest.importorskip("optuna")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A run that starts in seconds: one process (--serial), one thread.
TINY = {"env": "CartPole-v1", "num_threads": 1, "serial": True, "log_interval": 100.0}


def sweep_file(tmp_path, data, name="s"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def cli(args):
    """beast.sweep's main in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


OPTUNA = {"n_trials": 3, "params": {"learning_rate": {"log_uniform": [0.0001, 0.01]}}}
PBT = {"population": 2, "interval": 1000, "params": {"learning_rate": {"uniform": [1e-4, 1e-2]}}}


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"flags": {"eval_interval": 100}, "optuna": {**OPTUNA, "n_trials": 0}}, "n_trials must"),
        ({"flags": {"eval_interval": 100}, "optuna": {**OPTUNA, "params": {}}}, "params is empty"),
        ({"flags": {"eval_interval": 100}, "optuna": {"params": OPTUNA["params"]}}, "a budget"),
        ({"optuna": OPTUNA}, "set flags: eval_interval"),
        ({"flags": {"eval_interval": 100}, "optuna": {**OPTUNA, "pruner": "hyper"}}, "pruner"),
        ({"flags": {"eval_interval": 100}, "optuna": OPTUNA, "grid": {"seed": [1]}}, "combined"),
        ({"pbt": {**PBT, "params": {"unroll_length": {"int_uniform": [10, 20]}}}}, "cannot"),
        ({"pbt": {**PBT, "members": [{"hidden_size": 8}]}}, "'hidden_size' is not explored"),
        ({"pbt": {**PBT, "fraction": 0.9}}, "fraction must be in [0, 0.5]"),
        ({"pbt": {**PBT, "interval": 0}}, "interval must be a positive integer"),
    ],
)
def test_bad_tuner_sections_are_one_line_and_exit_2(tmp_path, data, fragment):
    code, out, err = cli([sweep_file(tmp_path, data), "--savedir", str(tmp_path)])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("python -m beast.sweep: error:"), err
    assert fragment in err


def test_pbt_refuses_a_flag_that_cannot_change_mid_run_from_the_shell(tmp_path):
    path = sweep_file(tmp_path, {"pbt": {**PBT, "params": {"hidden_size": {"choice": [8, 16]}}}})
    done = subprocess.run(
        [sys.executable, "-m", "beast.sweep", path], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"python -m beast.sweep: error: {path}: pbt: 'hidden_size' cannot change in a running"
        f" learner, so PBT cannot explore it; it explores {', '.join(pbt.EXPLORABLE)}"
        " (set fixed flags under 'flags')"
    ]


def test_missing_optuna_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    path = sweep_file(tmp_path, {"flags": {"eval_interval": 100}, "optuna": OPTUNA})
    code, _, err = cli([path])
    assert code == 2
    needs = "the optuna search needs optuna: pip install -e '.[tune]'"
    assert err == f"python -m beast.sweep: error: {needs}\n"


def test_ray_address_needs_a_pbt_sweep(tmp_path):
    path = sweep_file(tmp_path, {"flags": {"total_steps": 10}, "grid": {"seed": [1]}})
    code, _, err = cli([path, "--ray_address", "auto"])
    assert code == 2 and "this sweep has no 'pbt'" in err


# --- Optuna: the trial state machine over fake runs -------------------------------------


def fake_drive(plans):
    """A stand-in for beast.tune.runs.drive: the run named N writes logs.csv rows for the
    evaluations plans[N] lists (step -> mean return), asking should_stop after each, and
    exits with plans[N]'s code; it writes what a finished run writes when it gets through."""

    def drive(run, sweep_dir, *, should_stop, **_):
        evals, returncode, total = plans[run.name]
        run_dir = os.path.join(sweep_dir, run.name)
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump({"total_steps": total}, f)
        with open(os.path.join(run_dir, "logs.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, ["step", "eval_step", "eval_mean_return"])
            writer.writeheader()
            for step, value in evals.items():
                writer.writerow({"step": step, "eval_step": "", "eval_mean_return": ""})
                # A snapshot a few steps past the multiple it was due at (EvalSchedule).
                writer.writerow({"step": step, "eval_step": step + 3, "eval_mean_return": value})
                f.flush()
                if should_stop():
                    return 0
        return returncode

    return drive


def test_trials_complete_prune_and_fail_and_the_storage_stays_whole(tmp_path, monkeypatch):
    data = {
        "name": "fake",
        "flags": {"eval_interval": 100, "total_steps": 300},
        "optuna": {**OPTUNA, "n_trials": 4, "pruner": {"median": {"n_startup_trials": 1}}},
    }
    spec = load_sweep(sweep_file(tmp_path, data))
    plans = {
        "trial0": ({100: 10.0, 200: 20.0, 300: 30.0}, 0, 300),  # completes: value 30
        "trial1": ({100: 1.0, 200: 2.0, 300: 3.0}, 0, 300),  # below the median at 100: pruned
        "trial2": ({100: 50.0}, 1, 300),  # its run fails
        "trial3": ({100: 40.0, 200: 80.0, 300: 90.0}, 0, 300),  # completes: the best
    }
    monkeypatch.setattr(optuna_search, "drive", fake_drive(plans))
    sweep_dir = str(tmp_path / "fake")
    slots = [(None, None)]  # one at a time: the trials' order is the plans'
    results = optuna_search.run_optuna(spec, sweep_dir, slots=slots, cpus_per_run=1)

    study = optuna.load_study(study_name="fake", storage=f"sqlite:///{sweep_dir}/optuna.db")
    states = [(t.user_attrs["run"], t.state.name, t.value) for t in study.trials]
    assert states == [
        ("trial0", "COMPLETE", 30.0),
        ("trial1", "PRUNED", 1.0),  # Optuna keeps a pruned trial's last report
        ("trial2", "FAIL", None),
        ("trial3", "COMPLETE", 90.0),
    ]
    # Reported at the step each evaluation was due, not the snapshot's.
    assert study.trials[0].intermediate_values == {100: 10.0, 200: 20.0, 300: 30.0}
    assert study.trials[1].intermediate_values == {100: 1.0}
    assert study.best_trial.user_attrs["run"] == "trial3"
    assert [(r.run.name, r.status, r.extra["best"]) for r in results] == [
        ("trial0", "done", False),
        ("trial1", "pruned", False),
        ("trial2", "failed", False),
        ("trial3", "done", True),
    ]
    with open(os.path.join(sweep_dir, "results.csv")) as f:
        rows = list(csv.DictReader(f))
    assert [row["objective"] for row in rows] == ["30.0", "1.0", "50.0", "90.0"]

    # The budget is spent: run again, nothing starts.
    again = optuna_search.run_optuna(spec, sweep_dir, slots=slots, cpus_per_run=1)
    assert len(again) == 4 and len(study.trials) == 4


def test_a_trial_of_a_dead_search_is_queued_again_under_its_run(tmp_path, monkeypatch):
    """A RUNNING trial whose heartbeats stopped (its search was killed) is failed and
    queued with its params and run directory; the next search resumes it."""
    data = {"name": "dead", "flags": {"eval_interval": 100, "total_steps": 100}}
    data["optuna"] = {**OPTUNA, "n_trials": 1}
    spec = load_sweep(sweep_file(tmp_path, data))
    sweep_dir = str(tmp_path / "dead")
    study = optuna_search.open_study(spec, sweep_dir)
    orphan = study.ask(optuna_search._distributions(spec.optuna.params))
    orphan.set_user_attr("run", "trial0")
    study._storage.record_heartbeat(orphan._trial_id)
    monkeypatch.setattr(optuna_search, "_GRACE_SECONDS", 1)
    time.sleep(2.5)  # its last heartbeat is older than the grace (SQLite: whole seconds)
    ran = []

    def drive(run, sweep_dir, *, should_stop, **kwargs):
        ran.append((run.name, run.varying))
        return fake_drive({"trial0": ({100: 5.0}, 0, 100)})(run, sweep_dir, should_stop=should_stop)

    monkeypatch.setattr(optuna_search, "drive", drive)
    optuna_search.run_optuna(spec, sweep_dir, slots=[(None, None)], cpus_per_run=1)
    assert ran == [("trial0", orphan.params)]
    study = optuna.load_study(study_name="dead", storage=f"sqlite:///{sweep_dir}/optuna.db")
    assert [(t.user_attrs["run"], t.state.name) for t in study.trials] == [
        ("trial0", "FAIL"),
        ("trial0", "COMPLETE"),
    ]


def test_a_resumed_search_counts_its_runs_not_its_requeued_trials(tmp_path, monkeypatch, capsys):
    """A trial interrupted and queued again is its run's second Optuna trial: the search
    that resumes it says how many runs came before, and that one is queued."""
    data = {"name": "count", "flags": {"eval_interval": 100, "total_steps": 100}}
    data["optuna"] = {**OPTUNA, "n_trials": 3}
    spec = load_sweep(sweep_file(tmp_path, data))
    sweep_dir = str(tmp_path / "count")
    # The new run is Optuna's trial 3 (trial1 requeued is trial 2, still run "trial1").
    plans = {name: ({100: 5.0}, 0, 100) for name in ("trial0", "trial1", "trial3")}
    monkeypatch.setattr(optuna_search, "drive", fake_drive(plans))
    study = optuna_search.open_study(spec, sweep_dir)
    for name, interrupted in (("trial0", False), ("trial1", True)):
        trial = study.ask(optuna_search._distributions(spec.optuna.params))
        trial.set_user_attr("run", name)
        if interrupted:  # as a search stopped by Ctrl-C leaves it
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            optuna_search._queue_again(study, trial)
        else:
            study.tell(trial, 1.0)
    optuna_search.run_optuna(spec, sweep_dir, slots=[(None, None)], cpus_per_run=1)
    first_line = capsys.readouterr().out.splitlines()[0]
    assert first_line.endswith("(2 trials before, 1 of them queued to resume)")


# --- Optuna: real runs, interrupted and resumed -----------------------------------------


@pytest.mark.slow  # about a minute on 2 cores
def test_a_tiny_search_interrupted_resumes_its_trials(tmp_path):
    data = {
        "name": "tiny",
        "max_parallel": 2,
        "flags": {
            **TINY,
            "algo": "ppo",
            # Long enough that the interrupt, sent at the first checkpoint (after a
            # second), finds the trials running: at 2,000 steps they could end first.
            "total_steps": 20_000,
            "eval_interval": 1000,
            "eval_episodes": 2,
            "checkpoint_interval": 1.0,
        },
        "optuna": {
            **OPTUNA,
            "n_trials": 2,
            "seed": 0,
            "startup_trials": 2,
            "pruner": {"median": {"n_startup_trials": 1}},
        },
    }
    path = sweep_file(tmp_path, data)
    savedir = tmp_path / "runs"
    sweep_dir = savedir / "tiny"
    argv = [sys.executable, "-m", "beast.sweep", path, "--savedir", str(savedir)]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    while not (sweep_dir / "trial0" / "model.tar").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "interrupted: queued to resume" in out
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{sweep_dir}/optuna.db")
    assert "RUNNING" not in [t.state.name for t in study.trials]
    queued = [t.user_attrs["run"] for t in study.trials if t.state.name == "WAITING"]
    assert "trial0" in queued

    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{sweep_dir}/optuna.db")
    # Two runs in all (a run is named by the number of its first trial), each ended.
    ends = {t.user_attrs["run"]: t.state.name for t in study.trials if t.state.name != "FAIL"}
    assert set(ends) == {"trial0", "trial1"}
    assert set(ends.values()) <= {"COMPLETE", "PRUNED"}
    with open(sweep_dir / "trial0" / "sweep.log") as f:
        assert "resuming trial0 from" in f.read()
    with open(sweep_dir / "results.csv") as f:
        assert {row["run"] for row in csv.DictReader(f)} == set(ends)


# --- PBT ---------------------------------------------------------------------------------


def pbt_spec(**overrides):
    return pbt.PBTSpec(
        population=4,
        interval=100,
        params={
            "learning_rate": {"log_uniform": [0.001, 0.01]},
            "clip_range": {"choice": [0.1, 0.2]},
        },
        **overrides,
    )


def test_explore_multiplies_by_a_factor_and_clamps_to_the_bounds():
    spec = pbt_spec(perturb=(0.5, 2.0))
    seen = set()
    for seed in range(20):
        explored = pbt.explore(
            {"learning_rate": 0.004, "clip_range": 0.1}, spec, random.Random(seed)
        )
        seen.add(explored["learning_rate"])
        assert explored["clip_range"] in (0.1, 0.2)
    assert seen == {0.002, 0.008}
    high = pbt.explore(
        {"learning_rate": 0.009, "clip_range": 0.1}, pbt_spec(perturb=(2.0,)), random.Random(0)
    )
    low = pbt.explore(
        {"learning_rate": 0.0015, "clip_range": 0.1}, pbt_spec(perturb=(0.5,)), random.Random(0)
    )
    assert high["learning_rate"] == 0.01 and low["learning_rate"] == 0.001


def test_the_bottom_members_copy_a_top_members_checkpoint_and_perturb_its_values(tmp_path):
    members = [
        pbt.Member(f"member{i}", {"learning_rate": 0.001 * (i + 1), "clip_range": 0.2}, i)
        for i in range(4)
    ]
    for i, member in enumerate(members):
        (tmp_path / member.name).mkdir()
        save_checkpoint(
            str(tmp_path / member.name), {"step": 1000 + i, "model_state_dict": f"w{i}"}
        )
    scores = [10.0, float("nan"), 30.0, 20.0]  # member2 best, member1 (no episode) worst
    spec = pbt_spec(fraction=0.25, perturb=(1.25,))
    rows = pbt.exploit_and_explore(members, scores, spec, random.Random(0), 3, str(tmp_path))
    assert [(r["member"], r["source"], r["event"], r["step"]) for r in rows] == [
        ("member1", "member2", "copied", 1002)
    ]
    copied, _, _ = load_latest_checkpoint(str(tmp_path / "member1"))
    assert copied == {"step": 1002, "model_state_dict": "w2"}
    assert members[1].params["learning_rate"] == pytest.approx(0.003 * 1.25)
    assert members[1].copies == ["r3<-member2"]
    for i in (0, 2, 3):  # the others keep their checkpoints and values
        own = load_latest_checkpoint(str(tmp_path / f"member{i}"))[0]
        assert own["model_state_dict"] == f"w{i}"
        assert members[i].copies == []
    # fraction 0: the same population without PBT.
    assert (
        pbt.exploit_and_explore(
            members, scores, pbt_spec(fraction=0.0), random.Random(0), 4, str(tmp_path)
        )
        == []
    )


def test_a_round_scores_the_episodes_after_its_start(tmp_path):
    with open(tmp_path / "episodes.csv", "w") as f:
        f.write("step,return,length\n90,1.0,1\n100,3.0,3\n150,5.0,5\n200,7.0,7\n210,9.")
    assert pbt.round_score(str(tmp_path), 100) == 6.0  # 150 and 200; 210's row is half-written
    assert pbt.round_score(str(tmp_path), 200) != pbt.round_score(str(tmp_path), 200)  # nan


def tiny_population(tmp_path, name="pop"):
    data = {
        "name": name,
        "max_parallel": 2,
        "flags": {**TINY, "algo": "impala", "total_steps": 1600, "lr_schedule": "constant"},
        "pbt": {
            "population": 2,
            "interval": 800,
            "fraction": 0.5,
            "seed": 1,
            "params": {"learning_rate": {"log_uniform": [0.0001, 0.01]}},
            "members": [{"learning_rate": 0.002}, {"learning_rate": 0.0005}],
        },
    }
    return sweep_file(tmp_path, data)


def check_population(sweep_dir):
    with open(sweep_dir / "lineage.csv") as f:
        lineage = list(csv.DictReader(f))
    events = [(row["round"], row["member"], row["event"]) for row in lineage]
    assert events[:2] == [("0", "member0", "trained"), ("0", "member1", "trained")]
    copies = [row for row in lineage if row["event"] == "copied"]
    assert len(copies) == 1 and copies[0]["round"] == "0"
    copier = copies[0]["member"]
    assert copies[0]["source"] == ({"member0", "member1"} - {copier}).pop()
    assert events[3:] == [("1", "member0", "trained"), ("1", "member1", "trained")]
    state = json.loads((sweep_dir / "pbt.json").read_text())
    assert state["rounds"] == 2
    with open(sweep_dir / copier / "sweep.log") as f:
        log = f.read()
    # The second round resumed the copied checkpoint (at its step) with the perturbed rate.
    assert re.search(r"resuming \w+ from .* at step 800 .*changed flags: .*learning_rate", log)
    for member in ("member0", "member1"):
        rows = read_rows(str(sweep_dir / member / "logs.csv"))
        assert int(rows[-1]["step"]) >= 1600
    with open(sweep_dir / "results.csv") as f:
        rows = {row["run"]: row for row in csv.DictReader(f)}
    assert rows[copier]["copies"] == f"r0<-{copies[0]['source']}"
    assert {row["status"] for row in rows.values()} == {"done"}


def test_a_tiny_population_trains_in_rounds_and_copies(tmp_path):
    results = run_sweep(load_sweep(tiny_population(tmp_path)), savedir=str(tmp_path / "runs"))
    assert len(results) == 2
    check_population(tmp_path / "runs" / "pop")


@pytest.mark.slow
def test_the_population_runs_on_a_ray_cluster(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    try:
        code, out, err = cli(
            [
                tiny_population(tmp_path, "ray_pop"),
                "--savedir",
                str(tmp_path / "runs"),
                "--ray_address",
                cluster.address,
            ]
        )
    finally:
        cluster.shutdown()
    assert code == 0, out + err
    assert "Ray at" in out
    check_population(tmp_path / "runs" / "ray_pop")


def test_evaluations_read_whole_rows_only(tmp_path):
    with open(tmp_path / "logs.csv", "w") as f:
        f.write("step,eval_step,eval_mean_return\n100,,\n120,103,4.5\n140,203,47")
    assert evaluations(str(tmp_path)) == [Evaluation(103, 4.5)]  # 203's row is half-written


def test_a_member_that_crashes_gets_one_more_try(tmp_path, monkeypatch):
    data = {"flags": {"env": "CartPole-v1", "total_steps": 200}, "pbt": {**PBT, "interval": 100}}
    spec = load_sweep(sweep_file(tmp_path, {**data, "pbt": {**data["pbt"], "fraction": 0}}))
    calls = []

    def run_segment(run, sweep_dir, round_start, boundary, *args):
        calls.append((run.name, boundary))
        os.makedirs(os.path.join(sweep_dir, run.name), exist_ok=True)
        crashed = calls.count(("member1", 100)) == 1 and (run.name, boundary) == ("member1", 100)
        return pbt.Segment(-11 if crashed else 0, 1.0, boundary)

    monkeypatch.setattr(pbt, "run_segment", run_segment)
    pbt.run_pbt(spec, str(tmp_path / "s"), slots=[(None, None)], cpus_per_run=1)
    assert sorted(calls) == [
        ("member0", 100),
        ("member0", 200),
        ("member1", 100),
        ("member1", 100),
        ("member1", 200),
    ]
