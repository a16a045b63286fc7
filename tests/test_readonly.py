"""Read-only inspection (issue 29): studies, trials, pareto, export and recipe read a database this process cannot
write (a mounted results folder, a shared file) and leave its bytes as they were; `run` refuses one, and refuses a
working folder or token cache it cannot write, with one error line and nothing changed on disk.

Tests run as root, for whom permission bits stop nothing: files and folders are made read-only with `chattr +i`
(writes then fail with EPERM), undone at teardown so that pytest can remove its temporary folders."""

import csv
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error

pytestmark = pytest.mark.slow


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _chattr_works(folder: Path) -> str | None:
    """None where `chattr +i` makes a file unwritable here, else why not."""
    if shutil.which("chattr") is None:
        return "chattr is not installed"
    probe = folder / "chattr-probe"
    probe.write_text("x")
    try:
        done = subprocess.run(["chattr", "+i", str(probe)], check=False, capture_output=True, text=True)
        if done.returncode != 0:
            return f"chattr +i is not permitted here: {done.stderr.strip()}"
        try:
            probe.write_text("y")
        except OSError:
            return None
        return "chattr +i did not make a file unwritable"
    finally:
        subprocess.run(["chattr", "-i", str(probe)], check=False, capture_output=True)
        probe.unlink(missing_ok=True)


@pytest.fixture
def immutable(tmp_path):
    """make(*paths): `chattr +i` each path (a file or a folder), undone at teardown, last first."""
    why = _chattr_works(tmp_path)
    if why:
        pytest.skip(f"cannot make files read-only for root: {why}")
    made: list[Path] = []

    def make(*paths: Path) -> None:
        for path in paths:
            subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
            made.append(path)

    yield make
    for path in reversed(made):
        subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)


@pytest.fixture
def raced(raced_study, tmp_path):
    """The session's raced study (3 trials of the tiny space raced at twice the proxy's steps, no pruning): its
    space file, and a copy of its database alone in a folder of this test's own (the tests make it read-only)."""
    assert raced_study.summary["n_complete"] == 3 and raced_study.summary["race"], raced_study.summary
    return raced_study.space, raced_study.copy_to(tmp_path / "db")


def inspect_all(cli, url: str, out: Path) -> dict[str, object]:
    """What each inspection command prints (and export writes), every one required to exit 0; `trials` also
    without --study (the storage's only study)."""
    out.mkdir()
    results: dict[str, object] = {}
    for name, args in {
        "studies": ["studies"],
        "trials": ["trials", "--study", "raced"],
        "trials-default": ["trials"],
        "pareto": ["pareto", "--study", "raced", "--out", str(out / "front.csv")],
        "export": ["export", "--study", "raced", "--out", str(out / "trials.csv"), "--curves", str(out / "curves.csv")],
        "recipe": ["recipe", "--study", "raced"],
    }.items():
        proc = cli(*args, "--storage", url, "--json")
        assert proc.returncode == 0, (name, proc.stderr)
        report = json.loads(proc.stdout)
        for key in ("out", "curves_out"):  # the files written: other paths each time
            report.pop(key, None)
        results[name] = report
    for name in ("front.csv", "trials.csv", "curves.csv"):
        results[name] = (out / name).read_text()
    return results


@pytest.mark.parametrize("what", ["file", "file and folder"])
def test_inspection_reads_a_read_only_database_and_changes_nothing(raced, cli, immutable, tmp_path, what):
    _, db = raced
    url = f"sqlite:///{db}"
    writable = inspect_all(cli, url, tmp_path / "writable")
    before, listing = digest(db), sorted(os.listdir(db.parent))
    immutable(db, *([db.parent] if what == "file and folder" else []))
    with pytest.raises(OSError):  # the database really is read-only, root or not
        open(db, "ab").close()

    read_only = inspect_all(cli, url, tmp_path / "read-only")
    assert read_only == writable  # the same answers as from the writable file
    assert digest(db) == before and sorted(os.listdir(db.parent)) == listing  # no byte, no side file
    studies = read_only["studies"]["studies"]
    assert [s["study"] for s in studies] == ["raced"] and studies[0]["n_complete"] == 3
    assert len(read_only["trials"]["trials"]) == 3 and read_only["trials"]["race"]
    assert read_only["pareto"]["pareto"] and read_only["pareto"]["verdict"]
    assert {r["trial"] for r in csv.DictReader(read_only["trials.csv"].splitlines())} >= {"0", "1", "2"}
    assert read_only["recipe"]["reuse_map"] in [t["reuse_map"] for t in read_only["trials"]["trials"]]


def test_a_wal_database_in_a_read_only_folder_is_read_immutable(raced, cli, immutable, tmp_path):
    """A WAL database needs its -shm side file, which a read-only folder cannot get: it is opened immutable."""
    _, db = raced
    folder = tmp_path / "wal"
    folder.mkdir()
    wal = folder / "w.db"
    shutil.copyfile(db, wal)
    conn = sqlite3.connect(wal)
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    conn.close()  # the last connection: the -wal and -shm files go
    assert sorted(os.listdir(folder)) == ["w.db"]
    expected = json.loads(
        cli("trials", "--study", "raced", "--storage", f"sqlite:///{db}", "--json", check=True).stdout
    )
    before = digest(wal)
    immutable(wal, folder)

    proc = cli("trials", "--study", "raced", "--storage", f"sqlite:///{wal}", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == expected
    assert digest(wal) == before and sorted(os.listdir(folder)) == ["w.db"]


def test_run_refuses_a_read_only_database(raced, cli, immutable, tmp_path):
    space, db = raced
    before = digest(db)
    immutable(db)
    proc = cli(
        "run",
        "--space",
        str(space),
        "--budget",
        "1.5x",
        "--study",
        "raced",
        "--storage",
        f"sqlite:///{db}",
        "--n-trials",
        "4",
    )
    assert_one_line_error(proc)
    assert "not writable" in proc.stderr
    assert digest(db) == before


def test_an_old_study_that_cannot_be_written_is_refused_with_the_migrate_command(cli, immutable, tmp_path):
    """A database stored before the ledger of runs is imported when first opened; a file this process cannot write
    is refused with the command that imports it where it can be, in one line, its bytes unchanged."""
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript((ROOT / "tests" / "fixtures" / "study-eeb668a.sql").read_text(encoding="utf-8"))
    conn.close()
    before = digest(db)
    immutable(db)
    proc = cli("trials", "--storage", f"sqlite:///{db}", "--json")
    assert_one_line_error(proc)
    assert "ilr-search migrate --storage" in proc.stderr
    assert digest(db) == before


def run_tiny(cli, space: Path, cwd: Path, *storage: str, env: dict | None = None):
    return cli(
        "run",
        "--space",
        str(space),
        "--budget",
        "1.5x",
        "--study",
        "new",
        "--n-trials",
        "1",
        *storage,
        cwd=cwd,
        env=env,
    )


def test_run_in_a_read_only_working_folder_is_one_error_line(raced, cli, immutable, tmp_path):
    space, _ = raced
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    immutable(cwd)
    # the default storage's studies/ folder cannot be made there
    proc = run_tiny(cli, space, cwd)
    assert_one_line_error(proc)
    assert "default storage" in proc.stderr
    # a storage elsewhere: the checkpoints (studies/checkpoints) still cannot go there; no database is made
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_tiny(cli, space, cwd, "--storage", f"sqlite:///{elsewhere / 'n.db'}")
    assert_one_line_error(proc)
    assert "checkpoints" in proc.stderr
    assert os.listdir(elsewhere) == [] and os.listdir(cwd) == []


def test_run_with_a_read_only_token_cache_is_one_error_line(raced, cli, immutable, tmp_path):
    space, _ = raced
    cache = tmp_path / "cache"
    cache.mkdir()
    immutable(cache)
    for root in (cache, cache / "below"):  # the cache folder itself, or one to be made in it
        proc = run_tiny(
            cli, space, tmp_path, "--storage", f"sqlite:///{tmp_path / 'n.db'}", env={"ILR_SEARCH_CACHE": str(root)}
        )
        assert_one_line_error(proc)
        assert "token cache" in proc.stderr and "ILR_SEARCH_CACHE" in proc.stderr
        assert not (tmp_path / "n.db").exists() and os.listdir(cache) == []
