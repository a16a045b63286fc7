import json
import re
import sqlite3
import subprocess
import sys

import optuna
import pandas as pd
import pytest
from conftest import NO_REFERENCES, assert_one_line_error, run_cli, write_space
from helpers import HANG_SECONDS, imported_by, run_args, stored_reference_dicts

from ilr_search.analysis.results import study_front
from ilr_search.storage.trials import told_trials

SEQ = 32  # tokens a row (the batch is the tiny space's 8 rows)
NARROW = {"d_model": 16, "seq_len": SEQ}  # the studies' model: what pruning saves and what is read back needs no size


@pytest.fixture(scope="module")
def pruned_study(tmp_path_factory, token_cache):
    """A real study with complete and pruned trials (the eager rule prunes tiny proxies early; the calibrated
    default is tested in test_fidelity.py), plus one failed (diverged) trial."""
    root = tmp_path_factory.mktemp("report")
    db = root / "r.db"
    space = write_space(root / "tiny.toml", model=NARROW)  # the tiny space of a narrow model
    proc = run_cli(
        run_args(space, db, "rep", "--sampler", "random", "--pruner", "pareto-eager", budget="2x", n_trials=10),
        root,
        {"ILR_SEARCH_CACHE": str(token_cache)},
    )
    assert proc.returncode == 0, proc.stderr
    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{db}")
    dist = optuna.distributions.IntDistribution(1, 3)
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL,
            params={f"r{i}": 3 for i in range(4)},
            distributions={f"r{i}": dist for i in range(4)},
            user_attrs={
                "reuse_map": [3, 3, 1, 1],
                "map_key": "3,3,1,1",
                "flops_ratio": 1.9,
                "status": "diverged",
                "reason": "training loss became nan at step 3",
                "steps": 3,
            },
        )
    )
    return root, db, json.loads(proc.stdout)


@pytest.mark.slow
def test_study_has_pruned_trials_with_reasons(pruned_study, cli):
    root, db, summary = pruned_study
    assert summary["n_pruned"] >= 1 and summary["steps_saved_by_pruning"] > 0
    trials = json.loads(cli("trials", "--study", "rep", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    pruned = [t for t in trials["trials"] if t["state"] == "PRUNED" and t["steps"] > 0]
    assert pruned and all(t["pruned_at_step"] in (6, 12) for t in pruned)
    with sqlite3.connect(db) as conn:
        reasons = conn.execute("SELECT trial_number, dominated_by, reason FROM ilr_pruning").fetchall()
    assert {r[0] for r in reasons} >= {t["trial"] for t in pruned}
    assert all(json.loads(r[1]) and "dominated" in r[2] for r in reasons)


@pytest.mark.slow
def test_pruning_trains_fewer_steps_than_the_same_study_without(pruned_study, cli, tmp_path):
    _, _, pruned = pruned_study
    # the same study without pruning; its reference runs (not counted in steps_trained) are left out
    space = str(write_space(tmp_path / "plain.toml", search=NO_REFERENCES, model=NARROW))
    plain = json.loads(
        cli(
            "run",
            "--space",
            space,
            "--budget",
            "2x",
            "--study",
            "rep",
            "--storage",
            f"sqlite:///{tmp_path / 'plain.db'}",
            "--n-trials",
            "10",
            "--sampler",
            "random",
            "--pruner",
            "none",
            "--json",
            check=True,
        ).stdout
    )
    assert plain["n_pruned"] == 0 and plain["steps_saved_by_pruning"] == 0
    assert pruned["steps_trained"] < plain["steps_trained"]


@pytest.mark.slow
def test_stored_front_equals_brute_force_on_the_real_study(pruned_study, cli):
    _, db, _ = pruned_study
    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{db}")
    complete = [
        t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and "reused_from" not in t.user_attrs
    ]
    points = [(t.user_attrs["val_ppl"], t.user_attrs["flops_ratio"]) for t in complete]
    brute = {
        complete[i].number
        for i, p in enumerate(points)
        if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in points)
    }
    assert {p.trial for p in study_front(told_trials(study))} == brute
    with sqlite3.connect(db) as conn:
        last = conn.execute("SELECT MAX(n_complete) FROM ilr_fronts").fetchone()[0]
        stored = {r[0] for r in conn.execute("SELECT trial_number FROM ilr_fronts WHERE n_complete = ?", (last,))}
        n_history = conn.execute("SELECT COUNT(DISTINCT n_complete) FROM ilr_fronts").fetchone()[0]
    n_complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert stored == brute and last == n_complete and n_history >= 1  # kept each time a trial completes
    report = json.loads(cli("pareto", "--study", "rep", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    assert {p["trial"] for p in report["pareto"]} == brute
    assert report["noise"]["n_seeds"] == 3 and report["noise"]["spread"] >= 0


@pytest.mark.slow
def test_html_is_self_contained_with_every_point(pruned_study, cli, tmp_path):
    _, db, _ = pruned_study
    out = tmp_path / "front.html"
    cli("pareto", "--study", "rep", "--storage", f"sqlite:///{db}", "--out", str(out), check=True)
    html = out.read_text()
    assert not re.search(r"<script[^>]+src=[\"']https?://", html)
    assert 'id="plotly-js-gzip-base64">' in html and len(html) > 500_000  # the library itself is embedded, gzipped
    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{db}")
    for t in study.trials:
        if t.user_attrs.get("reuse_map"):
            assert f"trial {t.number} (" in html  # every trial, complete, pruned or failed, is in the hover text
    assert "Pareto front" in html and "baseline" in html and "layer importance" in html
    assert '"responsive": true' in html  # the figure takes the page's width


@pytest.mark.slow
@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_export_round_trips_through_pandas(pruned_study, cli, tmp_path, suffix):
    _, db, _ = pruned_study
    out = tmp_path / f"trials.{suffix}"
    cli("export", "--study", "rep", "--storage", f"sqlite:///{db}", "--out", str(out), check=True)
    frame = pd.read_csv(out) if suffix == "csv" else pd.read_parquet(out)
    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{db}")
    references = frame[frame["state"] == "REFERENCE"]
    assert sorted(references["reference"]) == sorted(stored_reference_dicts(f"sqlite:///{db}", "rep")) != []
    frame = frame[frame["state"] != "REFERENCE"]
    assert len(frame) == len(study.trials)
    assert set(frame["state"]) >= {"COMPLETE", "PRUNED", "FAIL"}
    assert {"reuse_map", "flops_ratio", "val_ppl", "steps", "pruned_at_step", "duration_seconds", "param_r0"} <= set(
        frame.columns
    )
    first = frame.iloc[0]
    assert first["reuse_map"] == "1,1,1,1" and first["val_ppl"] == pytest.approx(study.trials[0].user_attrs["val_ppl"])


@pytest.mark.slow
@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_export_curves_is_a_long_table_of_validation_and_training_loss(pruned_study, cli, tmp_path, suffix):
    _, db, _ = pruned_study
    out = tmp_path / f"curves.{suffix}"
    cli(
        "export",
        "--study",
        "rep",
        "--storage",
        f"sqlite:///{db}",
        "--out",
        str(tmp_path / "t.csv"),
        "--curves",
        str(out),
        check=True,
    )
    curves = pd.read_csv(out) if suffix == "csv" else pd.read_parquet(out)
    assert list(curves.columns) == ["trial", "reference", "map", "kind", "step", "tokens", "loss", "seed", "run_steps"]
    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{db}")
    trained = [
        t
        for t in study.trials
        if t.user_attrs.get("steps") and "reused_from" not in t.user_attrs and t.state != optuna.trial.TrialState.FAIL
    ]  # (the fixture's added FAIL trial has no curve)
    assert trained
    for t in trained:
        mine = curves[curves["trial"] == t.number]
        val, train = mine[mine["kind"] == "val"], mine[mine["kind"] == "train"]
        assert set(mine["map"]) == {t.user_attrs["map_key"]}
        assert len(val) >= 1 and len(train) >= 1, t.number
        assert train["step"].max() == t.user_attrs["steps"]  # the last window ends where training stopped
        assert (train["tokens"] == train["step"] * 8 * SEQ).all() and (val["tokens"] == val["step"] * 8 * SEQ).all()
        # the validation points are Optuna's intermediate values too (optuna-dashboard plots them)
        assert dict(zip(val["step"], val["loss"], strict=True)) == pytest.approx(t.intermediate_values)
    refs = curves[curves["trial"].isna()]
    assert set(refs["kind"]) == {"val"} and set(refs["reference"]) >= {"baseline_seed1"}


@pytest.mark.slow
def test_trials_json_carries_each_trials_curves(pruned_study, cli):
    _, db, _ = pruned_study
    listed = json.loads(cli("trials", "--study", "rep", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    by_number = {t["trial"]: t for t in listed["trials"]}
    trained = [t for t in listed["trials"] if t["steps"] and t["reused_from"] is None and t["state"] != "FAIL"]
    assert trained
    for t in trained:
        assert t["curves"]["val"] and t["curves"]["train"], t["trial"]
        assert t["curves"]["val"][-1]["step"] == t["pruned_at_step"] or t["curves"]["val"][-1]["step"] == 24
    for t in listed["trials"]:
        if t["reused_from"] is not None:  # a reused result comes with its curves
            assert t["curves"] == by_number[t["reused_from"]]["curves"]


@pytest.mark.slow
@pytest.mark.parametrize("suffix", ["csv", "json"])
def test_front_as_a_table(pruned_study, cli, tmp_path, suffix):
    _, db, _ = pruned_study
    out = tmp_path / f"front.{suffix}"
    cli("pareto", "--study", "rep", "--storage", f"sqlite:///{db}", "--out", str(out), check=True)
    rows = pd.read_csv(out).to_dict("records") if suffix == "csv" else json.loads(out.read_text())["pareto"]
    assert rows and all(r["val_ppl"] > 1 for r in rows)


@pytest.mark.slow
def test_optuna_still_opens_the_database(pruned_study):
    root, db, _ = pruned_study
    study = optuna.load_study(study_name="rep", storage=f"sqlite:///{db}")
    assert len(study.trials) >= 11
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from optuna.cli import main; sys.exit(main())",
            "studies",
            "--storage",
            f"sqlite:///{db}",
        ],
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
    )
    assert proc.returncode == 0 and "rep" in proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unknown study", "unwritable out", "unknown extension", "export extension"])
def test_report_errors(pruned_study, cli, case):
    _, db, _ = pruned_study
    storage = ["--storage", f"sqlite:///{db}"]
    args = {
        "unknown study": ["pareto", "--study", "nope", *storage],
        "unwritable out": ["pareto", "--study", "rep", *storage, "--out", "/sys/front.html"],
        "unknown extension": ["pareto", "--study", "rep", *storage, "--out", "front.docx"],
        "export extension": ["export", "--study", "rep", *storage, "--out", "trials.xlsx"],
    }[case]
    assert_one_line_error(cli(*args))


@pytest.mark.slow
@pytest.mark.parametrize("command", [["trials"], ["studies"], ["trials", "--json"]])
def test_reading_a_stored_study_does_not_import_torch(pruned_study, command):
    root, db, _ = pruned_study
    assert "torch" not in imported_by([*command, "--storage", f"sqlite:///{db}"], root).loaded
