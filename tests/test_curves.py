"""Training-loss curves beside the validation ones: stored for every trained trial on SQL and journal storage,
and a database made before they were kept still opens, lists and exports (and gains the table on a resume)."""

import json
import sqlite3

import pandas as pd
import pytest
from conftest import NO_REFERENCES, write_space
from helpers import run_args


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_every_trained_trial_has_a_training_loss_curve(tmp_path, cli, kind):
    space = write_space(
        tmp_path / "space.toml",
        search={**NO_REFERENCES, "enqueue_paper_maps": False},
        train={"eval_fractions": [0.5, 1.0]},
    )
    storage = f"sqlite:///{tmp_path / 'c.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'c.journal'}"
    cli(*run_args(space, storage, "c", budget="2x", steps=8, n_trials=2), check=True)
    listed = json.loads(cli("trials", "--study", "c", "--storage", storage, "--json", check=True).stdout)["trials"]
    assert len(listed) == 2
    for t in listed:
        # 8 steps, evaluated at 4 and 8: the loss is read at both, so two windows of 4 steps
        assert [p["step"] for p in t["curves"]["train"]] == [4, 8]
        assert [p["step"] for p in t["curves"]["val"]] == [4, 8]
        assert all(p["loss"] > 0 and p["tokens"] == p["step"] * 8 * 64 for p in t["curves"]["train"])


@pytest.mark.slow
def test_a_database_made_before_training_curves_still_reads_and_resumes(tmp_path, cli):
    space = write_space(tmp_path / "space.toml", search={**NO_REFERENCES, "enqueue_paper_maps": False})
    db = tmp_path / "old.db"
    storage = f"sqlite:///{db}"
    cli(*run_args(space, storage, "c", budget="2x", steps=8, n_trials=1), check=True)
    with sqlite3.connect(db) as conn:  # the database as an ilr-search before this table left it
        conn.execute("DROP TABLE ilr_train_curves")
    listed = json.loads(cli("trials", "--study", "c", "--storage", storage, "--json", check=True).stdout)["trials"]
    assert listed[0]["curves"]["train"] == [] and listed[0]["curves"]["val"]
    curves = tmp_path / "curves.csv"
    cli(
        "export",
        "--study",
        "c",
        "--storage",
        storage,
        "--out",
        str(tmp_path / "t.csv"),
        "--curves",
        str(curves),
        check=True,
    )
    assert set(pd.read_csv(curves)["kind"]) == {"val"}
    with sqlite3.connect(db) as conn:  # reading created nothing
        assert not conn.execute("SELECT name FROM sqlite_master WHERE name = 'ilr_train_curves'").fetchall()
    cli(
        *run_args(space, storage, "c", budget="2x", steps=8, n_trials=2), check=True
    )  # a resume adds the table, and the new trial's curve
    listed = json.loads(cli("trials", "--study", "c", "--storage", storage, "--json", check=True).stdout)["trials"]
    assert listed[0]["curves"]["train"] == [] and listed[1]["curves"]["train"]
