"""Your own maps first (`run --enqueue`, `[search] enqueue`), no WAITING trial left after a run, references in
the listings, and a truthful sampler: what Optuna stores for a trial is the map it trained."""

import json
from pathlib import Path

import optuna
import pandas as pd
import pytest
from conftest import NO_REFERENCES, assert_one_line_error, run_cli, write_space
from helpers import BAD_ENQUEUES, run_args

from ilr_search.search.maps import parse_enqueued, repair_to_budget
from ilr_search.search.samplers import BudgetRepairSampler

SMALL = {"budget": "2x", "steps": 8}  # 2x: 8 layer runs of 8 steps

MAP_PARAMS = ("r0", "r1", "r2", "r3")


def trials_of(db: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="q", storage=f"sqlite:///{db}").trials


@pytest.fixture(scope="module")
def enqueued_study(tmp_path_factory, token_cache):
    """A 4-trial study (2x: 8 layer runs) with three maps asked for: one over budget, one within, block 2."""
    root = tmp_path_factory.mktemp("enqueue")
    space = write_space(root / "space.toml", search={"noise_seeds": 0, "families": ["ilr"]})
    db = root / "q.db"
    proc = run_cli(
        run_args(space, db, "q", "--enqueue", "3,3,3,1 1,2,1,2 block2", **SMALL, n_trials=4),
        root,
        {"ILR_SEARCH_CACHE": str(token_cache)},
    )
    assert proc.returncode == 0, proc.stderr
    return root, space, db, json.loads(proc.stdout)


@pytest.mark.slow
def test_enqueued_maps_run_first_in_order_repaired_to_the_budget(enqueued_study):
    _, _, db, summary = enqueued_study
    maps = [t.user_attrs["reuse_map"] for t in trials_of(db)]
    assert maps[0] == [1, 1, 1, 1]  # the baseline first
    assert maps[1] == repair_to_budget([3, 3, 3, 1], 8) != [3, 3, 3, 1]  # repaired, as a proposal is
    assert maps[2] == [1, 2, 1, 2]
    assert len(maps) == 4  # the fourth: the first paper-inspired map that fits
    assert set(summary["references"]) == {"block2"}  # block K: trained as a reference run
    assert summary["references"]["block2"]["schedule"] == [0, 1, 2, 3, 0, 1, 2, 3]


@pytest.mark.slow
def test_no_waiting_trial_is_left_and_listings_count_none(enqueued_study, cli):
    _, _, db, _ = enqueued_study
    trials = trials_of(db)
    assert [t.state for t in trials].count(optuna.trial.TrialState.WAITING) == 0
    assert all(t.state.is_finished() for t in trials) and len(trials) == 4
    storage = f"sqlite:///{db}"
    studies = json.loads(cli("studies", "--storage", storage, "--json", check=True).stdout)["studies"]
    assert studies[0]["n_trials"] == 4
    listed = json.loads(cli("trials", "--study", "q", "--storage", storage, "--json", check=True).stdout)
    assert [t["trial"] for t in listed["trials"]] == [0, 1, 2, 3] and all(t["reuse_map"] for t in listed["trials"])
    assert [(r["reference"], r["state"]) for r in listed["references"]] == [("block2", "REFERENCE")]
    out = db.parent / "trials.csv"
    cli("export", "--study", "q", "--storage", storage, "--out", str(out), check=True)
    frame = pd.read_csv(out)
    assert len(frame) == 5 and set(frame["state"][:4]) <= {"COMPLETE", "PRUNED"} and frame["state"][4] == "REFERENCE"
    assert frame.loc[frame["state"] == "REFERENCE", "reference"].tolist() == ["block2"]
    assert frame["trial"].isna().sum() == 1  # a reference has no trial number


@pytest.mark.slow
def test_a_resume_with_other_enqueued_maps_adds_them(enqueued_study, cli):
    root, space, db, _ = enqueued_study
    copy = root / "resume.db"
    copy.write_bytes(db.read_bytes())
    cli(
        *run_args(space, copy, "q", "--enqueue", "3,3,3,1 1,1,2,2", **SMALL, n_trials=6), check=True
    )  # 3,3,3,1 is there: not again
    trials = trials_of(copy)
    assert len(trials) == 6 and trials[4].user_attrs["reuse_map"] == [1, 1, 2, 2]
    assert not any(t.state == optuna.trial.TrialState.WAITING for t in trials)
    assert sum(t.user_attrs["reuse_map"] == repair_to_budget([3, 3, 3, 1], 8) for t in trials) == 1


@pytest.mark.slow
def test_enqueued_maps_beyond_the_target_raise_it(enqueued_study, cli):
    """A finished study resumed with a map of one's own trains it: the target grows by the trials it needs."""
    root, space, db, _ = enqueued_study
    copy = root / "beyond.db"
    copy.write_bytes(db.read_bytes())
    proc = cli(*run_args(space, copy, "q", "--enqueue", "1,1,2,2", **SMALL, n_trials=4), check=True)
    assert "--n-trials 4 raised to 5" in proc.stderr
    trials = trials_of(copy)
    assert len(trials) == 5 and trials[4].user_attrs["reuse_map"] == [1, 1, 2, 2]
    assert all(t.state.is_finished() for t in trials)


@pytest.mark.parametrize("case", sorted(BAD_ENQUEUES))
def test_bad_enqueued_maps_change_nothing(tmp_path, cli, case):
    space = write_space(tmp_path / "space.toml", search=NO_REFERENCES)
    db = tmp_path / "bad.db"
    proc = cli(*run_args(space, db, "q", "--enqueue", f"2,2,1,1 {BAD_ENQUEUES[case]}", **SMALL, n_trials=4))
    assert_one_line_error(proc)
    assert "enqueued map" in proc.stderr
    assert not db.exists()


@pytest.mark.slow
def test_the_space_toml_enqueues_maps_and_knob_settings(tmp_path, cli):
    space = write_space(
        tmp_path / "space.toml",
        search={**NO_REFERENCES, "knobs": ["injection"], "enqueue": ["1,1,2,2|injection=gated", "1,1,2,2"]},
    )
    db = tmp_path / "toml.db"
    cli(*run_args(space, db, "q", **SMALL, n_trials=3), check=True)
    trials = trials_of(db)
    assert [t.params for t in trials[:3]] == [
        {"r0": 1, "r1": 1, "r2": 1, "r3": 1, "injection": "none"},
        {"r0": 1, "r1": 1, "r2": 2, "r3": 2, "injection": "gated"},
        {"r0": 1, "r1": 1, "r2": 2, "r3": 2, "injection": "none"},
    ]
    assert trials[1].user_attrs["knobs"] == {"injection": "gated"}


def test_parse_enqueued_reads_maps_knobs_and_blocks():
    entry = parse_enqueued("4,4,1,1|injection", 4, 4, 6, ("injection", "iteration_norms"))
    assert entry.reuse_map == tuple(repair_to_budget([4, 4, 1, 1], 6)) and entry.repaired_from == (4, 4, 1, 1)
    assert entry.params(("injection", "iteration_norms")) == {
        "r0": 2,
        "r1": 2,
        "r2": 1,
        "r3": 1,
        "injection": "add",
        "iteration_norms": False,
    }
    assert parse_enqueued("block2", 4, 4, 8, ()).block == 2


@pytest.mark.slow
def test_every_trained_trial_stores_the_map_it_trained(tmp_path, cli):
    """Sampled trials too (past the enqueued ones, over budget proposals included): r0..r3 are the trained map."""
    space = write_space(
        tmp_path / "space.toml", search={**NO_REFERENCES, "max_reuse": 3}, train={"eval_fractions": [1.0]}
    )
    db = tmp_path / "truth.db"
    cli(
        "run",
        "--space",
        str(space),
        "--budget",
        "1.5x",
        "--steps",
        "4",
        "--n-trials",
        "9",
        "--study",
        "q",
        "--storage",
        f"sqlite:///{db}",
        "--sampler",
        "random",
        "--pruner",
        "none",
        "--json",
        check=True,
    )
    trials = trials_of(db)
    sampled = [t for t in trials if "fixed_params" not in t.system_attrs]
    assert len(sampled) >= 4
    for t in trials:
        assert [t.params[k] for k in MAP_PARAMS] == t.user_attrs["reuse_map"], (t.number, t.params)
        assert "proposed_map" not in t.user_attrs


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_the_budget_sampler_proposes_only_maps_within_budget(sampler):
    """Past TPE's startup trials too (its joint proposals), on a real study whose objective prefers deep maps."""
    from ilr_search.search.samplers import build_sampler, sampler_settings

    settings = sampler_settings(sampler, 0, 4)
    built = build_sampler(settings, 4, max_reuse=4, max_layer_runs=7)
    assert isinstance(built, BudgetRepairSampler)
    study = optuna.create_study(sampler=built)

    def objective(trial: optuna.Trial) -> float:
        counts = [trial.suggest_int(k, 1, 4) for k in MAP_PARAMS]
        assert sum(counts) <= 7, counts
        return -sum(c * (4 - i) for i, c in enumerate(counts))  # rewards over-budget proposals, were they allowed

    study.optimize(objective, n_trials=20)
    assert len(study.trials) == 20 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert max(sum(t.params.values()) for t in study.trials) == 7


def test_a_proposal_of_a_tried_map_is_drawn_again():
    """Repair maps many proposals onto the budget's edge; a proposal equal to a tried map is redrawn, so a
    short study does not spend its trials on reuses (15 maps fit 6 layer runs of 4 layers)."""
    from ilr_search.search.samplers import build_sampler, sampler_settings

    study = optuna.create_study(
        sampler=build_sampler(sampler_settings("random", 0, 4), 4, max_reuse=4, max_layer_runs=6)
    )
    study.optimize(lambda trial: float(sum(trial.suggest_int(k, 1, 4) for k in MAP_PARAMS)), n_trials=6)
    maps = [tuple(t.params[k] for k in MAP_PARAMS) for t in study.trials]
    assert len(set(maps)) == 6 and all(sum(m) <= 6 for m in maps)
