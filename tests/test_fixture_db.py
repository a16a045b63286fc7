"""A study stored by an earlier version still opens, lists and resumes.

The study was made by commit eeb668a (main before the race, fusion, curves and the Optuna shim):
`python -m ilr_search run --space tests/fixtures/space-eeb668a.toml --budget 1.5x --study before-typed-records
--storage sqlite:///study-eeb668a.db --n-trials 3` (the tiny test space of that commit). It is kept as the
database's SQL text (tests/fixtures/study-eeb668a.sql, Python's sqlite3 iterdump): each test
rebuilds the database file from it, so no binary file is committed."""

import json
import shutil
import sqlite3

import optuna
import pytest
from conftest import ROOT, one_core

from ilr_search.storage.trials import TrialAttr, told_trials, trained_results

FIXTURES = ROOT / "tests" / "fixtures"
STUDY = "before-typed-records"


@pytest.fixture
def old_study(tmp_path):
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.executescript((FIXTURES / "study-eeb668a.sql").read_text(encoding="utf-8"))
    conn.close()
    shutil.copy(FIXTURES / "space-eeb668a.toml", tmp_path / "space.toml")
    return tmp_path, f"sqlite:///{tmp_path / 'old.db'}"


@pytest.mark.slow
def test_an_old_study_lists_and_reports(old_study, cli):
    folder, storage = old_study
    trials = json.loads(cli("trials", "--storage", storage, "--json", cwd=folder, check=True).stdout)
    assert trials["study"] == STUDY and len(trials["trials"]) == 3
    assert all(t["state"] == "COMPLETE" and t["val_ppl"] > 1 for t in trials["trials"])
    assert all(t["curves"]["val"] and t["curves"]["train"] == [] for t in trials["trials"])  # no training curves then
    pareto = json.loads(cli("pareto", "--storage", storage, "--json", cwd=folder, check=True).stdout)
    assert pareto["pareto"] and all(p["steps"] == 24 for p in pareto["pareto"])
    studies = json.loads(cli("studies", "--storage", storage, "--json", cwd=folder, check=True).stdout)
    assert [s["study"] for s in studies["studies"]] == [STUDY]


@pytest.mark.slow
def test_an_old_study_resumes_with_the_same_command(old_study, cli):
    folder, storage = old_study
    # raced on resume in this process (conftest.one_core), at the old space's target (4x: 96-step runs) under a
    # cap on the race's steps: the resume and the race's start are the point, not the length of a race to its end
    with one_core():
        proc = cli(
            "run",
            "--space",
            str(folder / "space.toml"),
            "--budget",
            "1.5x",
            "--study",
            STUDY,
            "--storage",
            storage,
            "--n-trials",
            "4",
            "--max-race-steps",
            "500",
            "--json",
            cwd=folder,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["study"] == STUDY and summary["n_complete"] + summary["n_pruned"] == 4
    assert summary["target_steps"] == 4 * 24 and summary["verdict"]  # a study made before the race is raced on resume
    assert 0 < summary["race_steps"] <= 500


def test_an_old_studys_trials_read_as_records(old_study):
    """Every attribute the old study's trials carry is one the record reads; those written only by later
    versions (or only for some trials) read as their defaults."""
    _, storage = old_study
    study = optuna.load_study(study_name=STUDY, storage=storage)
    trials = study.trials
    names = {v for k, v in vars(TrialAttr).items() if k.isupper()}
    assert all(set(t.user_attrs) <= names for t in trials)
    records = told_trials(study)
    assert [r.number for r in trained_results(records)] == [t.number for t in trials] and len(records) == 3
    for t, r in zip(trials, records, strict=True):
        a = t.user_attrs
        assert (r.map_key, list(r.reuse_map), r.flops_ratio, r.param_count) == (
            a["map_key"],
            a["reuse_map"],
            a["flops_ratio"],
            a["params"],
        )
        assert (r.val_loss, r.val_ppl, r.val_bpb, r.steps, r.status) == (
            a["val_loss"],
            a["val_ppl"],
            a["val_bpb"],
            a["steps"],
            a["status"],
        )
        assert (dict(r.knobs), r.proposed_map, r.reused_from, r.pruned_at_step, r.steps_saved) == (
            {},
            None,
            None,
            None,
            0,
        )
