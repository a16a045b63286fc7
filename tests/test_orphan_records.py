"""Records left by a study whose Optuna side is gone (a deleted journal beside its kept side file, a study deleted
with Optuna) are not taken for a new study's own: `run` refuses with one line and the fix, nothing changed. And a
claim whose holder ended without training that map (another study's, a stale one) is taken over, not waited on."""

import hashlib
import json

import optuna
import pytest
from conftest import NO_REFERENCES, assert_one_line_error, write_space
from helpers import run_args

from ilr_search.space import load_space
from ilr_search.storage import RunJob, open_store, parse_storage


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_new_study_over_an_earlier_ones_records_is_refused_with_the_fix(cli, tmp_path, kind):
    space = write_space(tmp_path / "s.toml", search=NO_REFERENCES, train={"steps": 8})
    storage = f"journal:{tmp_path / 's.log'}" if kind == "journal" else f"sqlite:///{tmp_path / 's.db'}"
    cli(*run_args(space, storage, "s", "--pruner", "none", budget="2x", n_trials=2), check=True)
    if kind == "journal":
        (tmp_path / "s.log").unlink()  # the journal gone, its side file s.log.ilr kept
        kept = tmp_path / "s.log.ilr"
    else:
        optuna.delete_study(study_name="s", storage=storage)  # the tables of ilr-search keep their rows
        kept = tmp_path / "s.db"
    before = digest(kept)
    proc = cli(*run_args(space, storage, "s", "--pruner", "none", budget="2x", n_trials=2))
    assert_one_line_error(proc)
    assert "earlier study" in proc.stderr or "no longer has" in proc.stderr
    assert ("delete" in proc.stderr and "s.log.ilr" in proc.stderr) if kind == "journal" else "--study" in proc.stderr
    assert digest(kept) == before and (kind == "sqlite" or not (tmp_path / "s.log").exists())
    if kind == "journal":  # the fix the line gives works
        kept.unlink()
        assert (
            json.loads(
                cli(*run_args(space, storage, "s", "--pruner", "none", budget="2x", n_trials=2), check=True).stdout
            )["n_trials"]
            == 2
        )


@pytest.mark.slow
def test_a_claim_held_by_a_trial_that_trained_another_map_is_taken_over(cli, console, tmp_path):
    space = write_space(tmp_path / "s.toml", search=NO_REFERENCES, train={"steps": 8})
    storage = f"sqlite:///{tmp_path / 's.db'}"
    cli(
        *run_args(space, storage, "s", "--pruner", "none", budget="2x", n_trials=1), check=True
    )  # trial 0: the baseline
    job = RunJob("1", load_space(space).train.seed, "2,1,1,1")
    assert open_store(parse_storage(storage), "s").claim_run("trial", job, "dead", 1.5, 8, 60.0)  # its worker dies
    # in a subprocess with a timeout: a run that waited on that claim would never end
    proc = console(
        *run_args(space, storage, "s", "--pruner", "none", budget="2x", n_trials=2),
        "--enqueue",
        "2,1,1,1",
        env={"ILR_SEARCH_HEARTBEAT_SECONDS": "1"},
        check=True,
    )
    assert json.loads(proc.stdout)["n_trials"] == 2
    trained = [
        t.user_attrs["map_key"]
        for t in optuna.load_study(study_name="s", storage=storage).trials
        if t.state == optuna.trial.TrialState.COMPLETE
    ]
    assert trained == ["1,1,1,1", "2,1,1,1"]
