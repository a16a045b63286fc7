"""Race runs in the exports (issues 29 and 30): `export` writes a row per stored race run beside the trials and
references (and its curve with --curves), `trials --json` lists them under `race_runs`, integer columns come out
as integers. The race runs' table of an older database (ilr_audit in schema version 1, ilr_race_runs in 2) and its
reference runs (study attributes) are imported as rows of ilr_runs when it is first opened, or by `ilr-search
migrate` (once, even by two processes at once)."""

import csv
import json
import math
import sqlite3
import subprocess
import sys

import pandas as pd
import pytest
from conftest import RACE_STEPS, ROOT
from helpers import HANG_SECONDS, env_for

FIXTURES = ROOT / "tests" / "fixtures"
OLD_STUDY = "before-typed-records"  # the study of tests/fixtures/study-eeb668a.sql (schema version 1)


def stored_runs(db, study: str) -> dict[tuple[str, int, int], dict]:
    """The study's race runs as the database holds them, by (map, steps, seed), read with plain sqlite3."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM ilr_runs WHERE study = ? AND kind = 'race'", (study,))]
    conn.close()
    return {(r["map_key"], r["steps"], r["seed"]): r for r in rows}


def same(a, b) -> bool:
    """Equal values, None and NaN (a missing value read back from a table) alike."""

    def missing(x) -> bool:
        return x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA

    if missing(a) or missing(b):
        return missing(a) and missing(b)
    return a == b if isinstance(a, str) or isinstance(b, str) else a == pytest.approx(b)


@pytest.fixture(scope="module")
def raced(raced_study):
    """The session's raced study (3 trials, the contenders raced at 2x): its folder, database and race runs."""
    runs = stored_runs(raced_study.db, raced_study.study)
    assert runs and {steps for _, steps, _ in runs} == {2 * RACE_STEPS}  # the race trained at the target
    return raced_study.root, raced_study.db, runs


@pytest.mark.slow
def test_export_holds_every_race_run_with_integer_columns(raced, cli, tmp_path):
    _, db, runs = raced
    out, curves_out, csv_out = tmp_path / "t.parquet", tmp_path / "c.parquet", tmp_path / "t.csv"
    report = json.loads(
        cli(
            "export",
            "--study",
            "raced",
            "--storage",
            f"sqlite:///{db}",
            "--out",
            str(out),
            "--curves",
            str(curves_out),
            "--json",
            check=True,
        ).stdout
    )
    assert report["race_runs"] == len(runs)
    frame = pd.read_parquet(out)
    race = frame[frame["state"] == "RACE_RUN"]
    assert len(race) == len(runs) == report["race_runs"]
    for row in race.to_dict("records"):
        stored = runs[(row["map_key"], row["steps"], row["seed"])]
        assert row["run_state"] == stored["state"] and str(row["factor"]) == stored["factor"]
        for column, db_column in (
            ("val_loss", "val_loss"),
            ("val_ppl", "val_ppl"),
            ("val_bpb", "val_bpb"),
            ("flops_ratio", "flops_ratio"),
            ("train_seconds", "seconds"),
        ):
            assert same(row[column], stored[db_column]), (column, row[column], stored[db_column])
        key_map = row["map_key"].split("|")[0]
        assert same(row["reuse_map"], None) if key_map.startswith("deep") else row["reuse_map"] == key_map
        assert pd.isna(row["trial"]) and pd.isna(row["reference"])
    trials = frame[frame["state"].isin(["COMPLETE", "PRUNED"])]
    assert len(trials) == 3 and sorted(trials["trial"]) == [0, 1, 2]
    params = [c for c in frame.columns if c.startswith("param_r")]
    assert params
    for column in ("trial", "steps", "seed", "params", *params):
        assert pd.api.types.is_integer_dtype(frame[column]), (column, frame[column].dtype)

    # The curves: each race run's stored validation curve, named by its map, seed and length.
    curves = pd.read_parquet(curves_out)
    for column in ("trial", "step", "tokens", "seed", "run_steps"):
        assert pd.api.types.is_integer_dtype(curves[column]), (column, curves[column].dtype)
    race_points = curves[curves["run_steps"].notna()]
    got = {}
    for p in race_points.to_dict("records"):
        got.setdefault((p["map"], p["run_steps"], p["seed"]), []).append([p["step"], p["loss"]])
    assert got == {k: json.loads(r["curve"]) for k, r in runs.items() if json.loads(r["curve"] or "[]")}
    assert (race_points["kind"] == "val").all() and (race_points["tokens"] > 0).all()

    # CSV: the integers written as integers (trial 0, not 0.0), the missing ones empty.
    cli("export", "--study", "raced", "--storage", f"sqlite:///{db}", "--out", str(csv_out), check=True)
    with open(csv_out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    first = next(r for r in rows if r["trial"] == "0")
    assert first["params"].isdigit() and first["steps"].isdigit() and first["seed"].isdigit()
    assert all(
        r["trial"] == "" and r["steps"].isdigit() and r["seed"].isdigit() for r in rows if r["state"] == "RACE_RUN"
    )
    assert sum(r["state"] == "RACE_RUN" for r in rows) == len(runs)


@pytest.mark.slow
def test_trials_json_lists_every_race_run(raced, cli):
    _, db, runs = raced
    report = json.loads(cli("trials", "--study", "raced", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    listed = {(r["map_key"], r["steps"], r["seed"]): r for r in report["race_runs"]}
    assert listed.keys() == runs.keys() and len(report["race_runs"]) == len(runs)
    for key, r in listed.items():
        stored = runs[key]
        assert (r["state"], r["factor"], r["val_loss"], r["val_ppl"], r["flops_ratio"]) == (
            stored["state"],
            stored["factor"],
            stored["val_loss"],
            stored["val_ppl"],
            stored["flops_ratio"],
        )
        assert [[p["step"], p["loss"]] for p in r["curves"]["val"]] == json.loads(stored["curve"] or "[]")
        assert r["curves"]["train"] == [] and all(isinstance(p["tokens"], int) for p in r["curves"]["val"])
    finished = {
        (r["map_key"], r["steps"], r["seed"]) for r in report["race"]["results"] if r["source"].startswith("run ")
    }
    assert finished <= listed.keys()  # every race run the verdict rests on is listed


# ---------------------------------------------------------------------------------------------------------
# The race runs of a schema-version-1 database (table ilr_audit)

OLD_RUN = (
    "before-typed-records",
    "4",
    1,
    "2,1,1,1",
    "w",
    1.0,
    "complete",
    1.2272727272727273,
    96,
    3.9,
    49.4,
    5.6,
    "[[48, 4.2], [96, 3.9]]",
    2.5,
    "ok",
)


@pytest.fixture
def old_db(tmp_path):
    """The fixture study's database, with one race run stored under the old table name."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript((FIXTURES / "study-eeb668a.sql").read_text(encoding="utf-8"))
        conn.execute(f"INSERT INTO ilr_audit VALUES ({','.join('?' * len(OLD_RUN))})", OLD_RUN)
    conn.close()
    return path


def tables(path) -> set[str]:
    with sqlite3.connect(path) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    return names


def schema_version(path) -> int:
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT version FROM ilr_schema WHERE id = 1").fetchone()[0]
    conn.close()
    return version


OLD_REFERENCES = ["baseline_seed1", "baseline_seed2", "second_seed"]  # the fixture's, as study attributes


def test_an_old_database_is_imported_when_first_read_and_lists_its_race_and_reference_runs(old_db, cli):
    assert "ilr_audit" in tables(old_db) and "ilr_runs" not in tables(old_db)
    assert schema_version(old_db) == 1 and reference_attrs(old_db) == OLD_REFERENCES
    report = json.loads(cli("trials", "--storage", f"sqlite:///{old_db}", "--json", check=True).stdout)
    assert [(r["map_key"], r["steps"], r["seed"], r["state"], r["val_ppl"]) for r in report["race_runs"]] == [
        ("2,1,1,1", 96, 1, "complete", 49.4)
    ]
    assert [r["reference"] for r in report["references"]] == OLD_REFERENCES
    assert "ilr_audit" not in tables(old_db) and "ilr_runs" in tables(old_db)  # reading imported it
    assert schema_version(old_db) == 5 and reference_attrs(old_db) == []


def test_an_old_studys_trials_become_its_trial_runs_once(old_db):
    """Its trials' results lived only in Optuna's attributes: on first open each told trial's result becomes its
    map's run (kind trial) with the trial's number, and a second open changes nothing."""
    import optuna

    from ilr_search.storage import open_storage, open_store, parse_storage
    from ilr_search.storage.trials import told_trials

    spec = parse_storage(f"sqlite:///{old_db}")
    first = [r for r in open_store(spec, OLD_STUDY).runs() if r.kind == "trial"]
    trials = told_trials(optuna.load_study(study_name=OLD_STUDY, storage=open_storage(spec)))
    trained = [t for t in trials if t.trained_its_map]
    assert trained and sorted((r.trial, r.map_key, r.state, r.val_ppl, r.seconds) for r in first) == [
        (t.number, t.map_key, "complete", t.val_ppl, t.train_seconds) for t in trained
    ]
    assert [r for r in open_store(spec, OLD_STUDY).runs() if r.kind == "trial"] == first


# Opens the store for writing (what migrates), saying "locking" as it asks for the write lock to migrate.
OPEN_FOR_WRITING = """
import json, sys
import sqlalchemy as sa
from ilr_search.storage import open_store, parse_storage

def said(conn, cursor, statement, *args):
    if statement.startswith("BEGIN IMMEDIATE"):
        print("locking", flush=True)

sa.event.listen(sa.engine.Engine, "before_cursor_execute", said)
store = open_store(parse_storage(sys.argv[1]), sys.argv[2])
races = [[r.job.map_key, r.steps, r.job.seed] for r in store.race_runs()]
print(json.dumps([races, [r.name for r in store.reference_runs()]]))
"""


def test_two_processes_opening_an_old_database_at_once_migrate_it_once(old_db, token_cache):
    """While the test holds the database's write lock, both processes find the old table and ask for the lock
    to migrate it; once it is free, one migrates it and the other, looking again under the lock, finds it done."""
    lock = sqlite3.connect(old_db, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_FOR_WRITING, f"sqlite:///{old_db}", OLD_STUDY],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env_for(token_cache),
        )
        for _ in range(2)
    ]
    said = [p.stdout.readline().strip() for p in procs]  # both waiting for the lock, neither has migrated
    lock.execute("ROLLBACK")
    lock.close()
    outputs = [p.communicate(timeout=HANG_SECONDS) for p in procs]
    assert said == ["locking", "locking"], [err[-2000:] for _, err in outputs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    assert all(json.loads(out.strip().splitlines()[-1]) == [[["2,1,1,1", 96, 1]], OLD_REFERENCES] for out, _ in outputs)
    old_tables = {"ilr_audit", "ilr_race_runs", "ilr_run_scores", "ilr_map_claims"}
    assert "ilr_runs" in tables(old_db) and not tables(old_db) & old_tables
    assert schema_version(old_db) == 5 and reference_attrs(old_db) == []
    with sqlite3.connect(old_db) as conn:
        kinds = conn.execute("SELECT kind, count(*) FROM ilr_runs GROUP BY kind ORDER BY kind").fetchall()
    conn.close()
    assert kinds == [
        ("race", 1),
        ("reference", len(OLD_REFERENCES)),
        ("trial", 3),
        ("worker", 1),
    ]  # moved once (worker:0 too; the trials: their results)


def reference_attrs(path) -> list[str]:
    """The names of the reference runs kept in the database's study attributes (before schema version 3)."""
    with sqlite3.connect(path) as conn:
        keys = [k for (k,) in conn.execute("SELECT key FROM study_user_attributes ORDER BY study_user_attribute_id")]
    conn.close()
    return [k.removeprefix("ilr:reference:") for k in keys if k.startswith("ilr:reference:")]


RUN_COLUMNS = "study, factor, seed, map_key, worker, heartbeat, state, flops_ratio, steps, val_loss, val_ppl, val_bpb, "
RUN_COLUMNS += "curve, seconds, reason"


def test_the_migration_keeps_every_column_and_runs_once(old_db):
    from ilr_search.storage import open_store, parse_storage

    spec = parse_storage(f"sqlite:///{old_db}")
    first = open_store(spec, OLD_STUDY).race_runs()
    with sqlite3.connect(old_db) as conn:
        migrated = conn.execute(f"SELECT {RUN_COLUMNS} FROM ilr_runs WHERE kind = 'race'").fetchall()
    conn.close()
    assert migrated == [OLD_RUN]
    again = open_store(spec, OLD_STUDY).race_runs()  # already migrated: nothing changes
    assert again == first and len(first) == 1 and first[0].curve == ((48, 4.2), (96, 3.9))
    assert "ilr_runs" in tables(old_db) and "ilr_audit" not in tables(old_db) and schema_version(old_db) == 5


def test_the_migration_moves_the_reference_runs_and_they_read_the_same(old_db, tmp_path, cli):
    """The reference runs of the study attributes become rows of ilr_runs, and the attributes are gone: imported by
    `ilr-search migrate` (once: a second call imports nothing) or on first opening, every report shows the same (the
    `references` of `pareto --json` and `studies`' answer included)."""
    from ilr_search.search.studies import open_study
    from ilr_search.storage import open_store, parse_storage, study_references

    first_opened = tmp_path / "first-opened.db"
    first_opened.write_bytes(old_db.read_bytes())
    storage = f"sqlite:///{old_db}"
    migrated = json.loads(cli("migrate", "--storage", storage, "--json", check=True).stdout)
    assert migrated == {"storage": storage, "studies": [OLD_STUDY], "imported": True}
    assert json.loads(cli("migrate", "--storage", storage, "--json", check=True).stdout)["imported"] is False
    read_only = parse_storage(storage, read_only=True)
    refs = study_references(read_only, open_study(read_only, OLD_STUDY))
    assert list(refs) == OLD_REFERENCES and reference_attrs(old_db) == []
    store = open_store(parse_storage(storage), OLD_STUDY)
    assert [r.name for r in store.reference_runs()] == OLD_REFERENCES
    reports = {
        path: {
            command: json.loads(cli(command, "--storage", f"sqlite:///{path}", "--json", check=True).stdout)
            for command in ("trials", "pareto", "studies")
        }
        for path in (old_db, first_opened)
    }
    assert reports[old_db] == reports[first_opened] and reports[old_db]["pareto"]["references"]
    assert reference_attrs(first_opened) == [] and "ilr_audit" not in tables(first_opened)


def test_a_schema_2_database_moves_its_race_runs_with_their_scores(old_db):
    """A database of schema version 2 (ilr_race_runs, with a frozen run's scores in ilr_run_scores) migrates to
    rows of ilr_runs with the scores on them."""
    from ilr_search.storage import open_store, parse_storage

    with sqlite3.connect(old_db) as conn:
        conn.execute("ALTER TABLE ilr_audit RENAME TO ilr_race_runs")
        conn.execute(
            "CREATE TABLE ilr_run_scores (study VARCHAR(512) NOT NULL, factor VARCHAR(32) NOT NULL, "
            "seed INTEGER NOT NULL, map_key VARCHAR(256) NOT NULL, scores TEXT NOT NULL, "
            "PRIMARY KEY (study, factor, seed, map_key))"
        )
        conn.execute("INSERT INTO ilr_run_scores VALUES (?, ?, ?, ?, ?)", (*OLD_RUN[:4], "[0.5, 1.5]"))
        conn.execute("UPDATE ilr_schema SET version = 2")
    conn.close()
    read_only = open_store(parse_storage(f"sqlite:///{old_db}", read_only=True), OLD_STUDY, read_only=True)
    imported = read_only.race_runs()
    assert [r.scores for r in imported] == [(0.5, 1.5)]
    assert open_store(parse_storage(f"sqlite:///{old_db}"), OLD_STUDY).race_runs() == imported
    assert not tables(old_db) & {"ilr_race_runs", "ilr_run_scores"} and schema_version(old_db) == 5


def test_a_journal_side_file_imports_race_runs_written_before_the_rename(tmp_path):
    """A journal study's records written under the old kind ("audit") are imported as race runs when its store is
    first opened, and update as such."""
    from ilr_search.storage import RunJob, open_store, parse_storage

    names = (
        "study",
        "factor",
        "seed",
        "map_key",
        "worker",
        "heartbeat",
        "state",
        "flops_ratio",
        "steps",
        "val_loss",
        "val_ppl",
        "val_bpb",
        "curve",
        "seconds",
        "reason",
    )
    old = dict(zip(names, OLD_RUN, strict=True)) | {"kind": "audit", "state": "running", "worker": "dead"}
    (tmp_path / "j.log.ilr").write_text(json.dumps(old) + "\n", encoding="utf-8")
    store = open_store(parse_storage(f"journal:{tmp_path / 'j.log'}"), OLD_STUDY)
    job = RunJob("4", 1, "2,1,1,1")
    assert [r.job for r in store.race_runs()] == [job] and store.race_runs()[0].state == "running"
    assert store.claim_run("race", job, "me", 1.2, 96, stale_after=0.0)  # the dead worker's run is taken over
    assert store.finish_run("race", job, "me", "complete", 3.8, 44.7, 5.5, [(96, 3.8)], 1.0, "ok")
    (run,) = store.race_runs()
    assert (run.worker, run.state, run.val_ppl, run.curve) == ("me", "complete", 44.7, ((96, 3.8),))
    kinds = [json.loads(line)["kind"] for line in (tmp_path / "j.log.ilr").read_text(encoding="utf-8").splitlines()]
    assert kinds == ["race_run"] * 3
