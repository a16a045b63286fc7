"""`run --fuse K` (issue 20): a study trains its maps in fused groups with the guarantees of one at a time."""

import hashlib
import json
from collections import Counter
from pathlib import Path

import optuna
import pytest
from conftest import NO_REFERENCES, assert_one_line_error, write_space
from helpers import run_args, stored_reference_dicts
from optuna.trial import TrialState

from ilr_search.search.progress import Event, RunReporter, Step


def trials_of(db: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="fused", storage=f"sqlite:///{db}").trials


def trained_maps(trials) -> Counter:
    return Counter(
        t.user_attrs["map_key"] for t in trials if t.state.is_finished() and t.user_attrs.get("steps", 0) > 0
    )


def with_result(trials) -> list:
    return [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


@pytest.fixture
def space(tmp_path) -> Path:
    """The tiny space without reference runs, of a narrow model with two validation windows: fusion's guarantees
    need no size."""
    return write_space(
        tmp_path / "tiny.toml", search=NO_REFERENCES, model={"d_model": 16, "seq_len": 32}, train={"eval_windows": 2}
    )


@pytest.mark.slow
def test_run_fuse_4_finishes_with_the_right_count_no_map_twice_and_resumes(cli, tmp_path, space):
    db = tmp_path / "fused.db"
    summary = json.loads(cli(*run_args(space, db, "fused", "--fuse", "4", n_trials=8), check=True).stdout)
    trials = trials_of(db)
    assert summary["n_complete"] + summary["n_pruned"] == len(with_result(trials)) == 8
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    trained = trained_maps(trials)
    assert trained and max(trained.values()) == 1, trained
    assert all(
        t.user_attrs.get("steps") == 24
        for t in with_result(trials)
        if "reused_from" not in t.user_attrs and t.state == TrialState.COMPLETE
    )  # fused members trained to the end
    # resuming to 11 (not a multiple of 4) adds exactly three trials, still no map trained twice
    more = json.loads(cli(*run_args(space, db, "fused", "--fuse", "4", n_trials=11), check=True).stdout)
    trials = trials_of(db)
    assert more["n_complete"] + more["n_pruned"] == len(with_result(trials)) == 11
    trained = trained_maps(trials)
    assert max(trained.values()) == 1, trained
    assert not list((tmp_path / "studies" / "checkpoints").glob("**/*.pt"))  # deleted when their trials end


class CtrlCAtStep(RunReporter):
    """Ctrl-C from the console: a KeyboardInterrupt raised where the group's progress is shown."""

    def __init__(self, step: int) -> None:
        self.at = step

    def on(self, event: Event) -> None:
        if isinstance(event, Step) and event.step == self.at:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_ctrl_c_in_a_fused_group_fails_its_trials_queues_them_again_and_a_resume_finishes(
    token_cache, tmp_path, space, monkeypatch
):
    from ilr_search.search.run import RunRequest, run_in_process
    from ilr_search.space import load_space

    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'fused.db'}"
    summary = run_in_process(
        RunRequest(load_space(space), "1.5x", "fused", storage, n_trials=6, fuse=4), CtrlCAtStep(15)
    ).to_json()
    assert summary["interrupted"]
    trials = trials_of(tmp_path / "fused.db")
    interrupted = [t for t in trials if t.user_attrs.get("reason") == "interrupted (Ctrl-C)"]
    assert interrupted and all(t.state == TrialState.FAIL for t in interrupted)
    retries = {t.user_attrs.get("retry_of") for t in trials if t.state == TrialState.WAITING}
    assert retries == {t.number for t in interrupted}  # each interrupted map is queued again
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    # checkpoints at step 10 survive the interruption; the resume trains the queued maps from them
    assert len(list((tmp_path / "studies" / "checkpoints").glob("**/*.pt"))) == len(interrupted)

    resumed = run_in_process(RunRequest(load_space(space), "1.5x", "fused", storage, n_trials=6, fuse=4)).to_json()
    assert not resumed["interrupted"]
    trials = trials_of(tmp_path / "fused.db")
    assert len(with_result(trials)) == 6
    assert max(trained_maps(trials).values()) == 1
    assert {
        t.user_attrs.get("resumed_from_step") for t in with_result(trials) if t.user_attrs.get("retry_of") in retries
    } == {10}


@pytest.mark.slow
@pytest.mark.parametrize("value", ["0", "abc", "-2"])
def test_bad_fuse_exits_2_with_one_error_line_and_changes_nothing(cli, tmp_path, space, raced_study, value):
    # an existing study: a copy of the session's raced study, resumed with its own command and a bad --fuse
    db = raced_study.copy_to(tmp_path / "existing")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    proc = cli(*run_args(raced_study.space, db, raced_study.study, "--target", "2x", "--fuse", value))
    assert_one_line_error(proc)
    assert "--fuse must be" in proc.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    fresh = tmp_path / "fresh.db"
    assert_one_line_error(cli(*run_args(space, fresh, "fused", "--fuse", value, n_trials=3)))
    assert not fresh.exists()


@pytest.mark.slow
def test_reference_runs_trained_fused_equal_those_trained_one_at_a_time(cli, tmp_path):
    """The baseline's extra seeds and the second seed, trained as one fused group with --fuse 3, give the
    single runs' validation curves (the fused trainer's tolerance); the trials are the same fixed maps."""
    # a narrow model, 12-step proxies, two validation windows: the equality compared needs no size
    space = write_space(
        tmp_path / "refs.toml",
        search={"families": ["ilr"]},
        model={"d_model": 16, "seq_len": 32},
        train={"steps": 12, "eval_windows": 2},
    )
    references = {}
    for fuse in ("1", "3"):
        db = tmp_path / f"refs{fuse}.db"
        proc = cli(
            *run_args(
                space, db, "fused", "--fuse", fuse, "--pruner", "none", "--enqueue", "2,1,1,1 1,2,1,1", n_trials=3
            ),
            check=True,
        )
        assert ("(fused, 3 at once)" in proc.stderr) == (fuse == "3"), proc.stderr
        references[fuse] = stored_reference_dicts(f"sqlite:///{db}", "fused")
    assert set(references["1"]) == set(references["3"]) == {"baseline_seed1", "baseline_seed2", "second_seed"}
    for name, single in references["1"].items():
        fused = references["3"][name]
        assert (fused["schedule"], fused["seed"], fused["steps"]) == (
            single["schedule"],
            single["seed"],
            single["steps"],
        )
        assert [s for s, _ in fused["curve"]] == [s for s, _ in single["curve"]]
        assert all(abs(a - b) <= 1e-4 for (_, a), (_, b) in zip(fused["curve"], single["curve"], strict=True)), (
            name,
            fused,
            single,
        )
