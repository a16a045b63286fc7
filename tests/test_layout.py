"""How a run uses the machine (its layout): chosen from the usable cores, never from the load average; stored with
the study and reused on resume; and the run's per-phase accounting."""

import json
import os
from pathlib import Path

import optuna
import pytest
from conftest import BUSY_LOAD, NO_REFERENCES, QUIET_LOAD, write_space
from helpers import run_args

from ilr_search.commands.layout import process_threads, race_processes, trial_lanes, usable_cores
from ilr_search.commands.run import RunOptions, choose_layout, run_request
from ilr_search.search.plan import LAYOUT_ATTR, PhaseLayout, StudyLayout, stored_layout, stored_layouts
from ilr_search.space import load_space

BUSY = BUSY_LOAD  # a load average well above any core count here
QUIET = QUIET_LOAD


def layout_at(load: tuple[float, float, float], monkeypatch, space: Path | None, **flags) -> StudyLayout:
    monkeypatch.setattr(os, "getloadavg", lambda: load)
    return choose_layout(run_request(RunOptions(space=space, **flags))).layout


@pytest.mark.parametrize("space", [None, "tiny"], ids=["default-space", "tiny-space"])
def test_the_layout_is_the_same_at_any_load_average(tmp_path, monkeypatch, space):
    monkeypatch.chdir(tmp_path)
    path = None if space is None else write_space(tmp_path / "tiny.toml")
    quiet = layout_at(QUIET, monkeypatch, path)
    assert layout_at(BUSY, monkeypatch, path) == quiet
    space_cfg = run_request(RunOptions(space=path)).space
    lanes = trial_lanes(space_cfg, 1, space_cfg.search.fuse)
    assert quiet.trials == PhaseLayout(1, process_threads(space_cfg, lanes), space_cfg.search.fuse, lanes)
    assert lanes == (min(usable_cores(), space_cfg.search.fuse) if space_cfg.search.fuse > 1 else 1)
    assert quiet.race.processes == race_processes(run_request(RunOptions(space=path)).space, 1)
    assert quiet.race.processes == (usable_cores() if usable_cores() > 1 else 1)


def test_the_layout_follows_the_usable_cores_and_omp_num_threads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # a 4-core machine
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    four = layout_at(BUSY, monkeypatch, None)  # the default space: K = 4, trained in four one-thread lanes
    assert four == StudyLayout(PhaseLayout(1, 1, 4, lanes=4), PhaseLayout(4, 1, 4))
    assert layout_at(BUSY, monkeypatch, None, workers=2) == StudyLayout(PhaseLayout(2, 2, 4), PhaseLayout(2, 2, 4))
    assert layout_at(BUSY, monkeypatch, None, fuse="2").trials == PhaseLayout(
        1, 2, 2, lanes=2
    )  # lanes: at most K; threads: the cores over
    assert layout_at(BUSY, monkeypatch, None, fuse="1").trials == PhaseLayout(1, 4, 1)  # nothing to share out
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert layout_at(BUSY, monkeypatch, None, workers=1).trials == PhaseLayout(1, 1, 4, lanes=4)
    assert layout_at(BUSY, monkeypatch, None, fuse="1").trials == PhaseLayout(1, 2, 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # one core: everything in the run's process
    assert layout_at(QUIET, monkeypatch, None) == StudyLayout(PhaseLayout(1, 1, 4), PhaseLayout(1, 1, 4))


def test_a_study_layout_round_trips_through_its_stored_form():
    layout = StudyLayout(PhaseLayout(1, 1, 4, lanes=2), PhaseLayout(2, 1, 4))
    stored = json.loads(json.dumps(layout.to_dict()))
    assert StudyLayout.from_dict(stored) == layout
    for phase in stored.values():  # a layout stored before lanes existed: one lane
        del phase["lanes"]
    assert StudyLayout.from_dict(stored) == StudyLayout(PhaseLayout(1, 1, 4), PhaseLayout(2, 1, 4))
    assert stored_layout({}) is None
    assert layout.describe() == "trials 1 process x 2 lanes x 1 thread, K = 4; race 2 processes x 1 thread, K = 4"


def race_runs(db: Path, study: str = "layout") -> list[tuple]:
    from ilr_search.storage import open_store, parse_storage

    store = open_store(parse_storage(f"sqlite:///{db}"), study, read_only=True)
    return sorted(
        (r.job.map_key, r.job.seed, r.steps, r.state, r.val_loss, r.val_ppl, r.curve) for r in store.race_runs()
    )


def trial_values(db: Path, study: str = "layout") -> list[tuple]:
    study_ = optuna.load_study(study_name=study, storage=f"sqlite:///{db}")
    return [
        (t.number, t.state, t.params, t.values, t.user_attrs.get("val_ppl"), t.user_attrs.get("steps"))
        for t in study_.trials
    ]


@pytest.mark.slow
def test_a_busy_spell_before_a_run_changes_none_of_its_numbers(fused_raced_study, fused_raced_study_by_api):
    # the session's fused raced study (conftest.FUSED_RACE: K = 2, so on several cores the trials train in lanes;
    # raced at 2x; a narrow model, few validation windows: the numbers compared need no size), run at QUIET (by
    # `run`) and at BUSY (by the API, which test_api_equals_cli.py holds to the CLI's study)
    quiet, busy = fused_raced_study, fused_raced_study_by_api
    assert (quiet.load, busy.load) == (QUIET, BUSY)
    space = load_space(str(quiet.space))
    batch, seq = space.train.batch_size, space.model.seq_len
    summaries = {"busy": busy.summary, "quiet": quiet.summary}
    assert summaries["busy"]["layout"] == summaries["quiet"]["layout"]
    assert summaries["quiet"]["layout"]["trials"]["lanes"] == min(usable_cores(), 2)
    assert trial_values(busy.db, busy.study) == trial_values(quiet.db, quiet.study)
    busy_runs = race_runs(busy.db, busy.study)
    assert busy_runs and busy_runs == race_runs(quiet.db, quiet.study)
    assert summaries["busy"]["verdict"] == summaries["quiet"]["verdict"]
    phases = summaries["quiet"]["phases"]
    assert [p["phase"] for p in phases][0] == "trials" and "screen" in [p["phase"] for p in phases]
    for p in phases:
        assert set(p) == {"phase", "wall_seconds", "tokens", "tokens_per_second", "cpu_seconds", "cpu_percent"}
        assert p["wall_seconds"] > 0 and p["cpu_seconds"] >= 0
    trial_tokens = sum(t[5] or 0 for t in trial_values(quiet.db, quiet.study)) * batch * seq
    assert phases[0]["tokens"] == trial_tokens
    references = [p["tokens"] for p in phases if p["phase"] == "references"]
    assert references == [summaries["quiet"]["reference_steps"] * batch * seq]
    race = sum(p["tokens"] for p in phases[1:] if p["phase"] != "references")
    assert race == summaries["quiet"]["race_steps"] * batch * seq


@pytest.mark.slow
def test_a_resume_keeps_the_stored_layout_unless_asked(cli, tmp_path):
    space = write_space(tmp_path / "tiny.toml", search=NO_REFERENCES, train={"steps": 8})  # the space's K: 1
    db = tmp_path / "study.db"
    first = cli(*run_args(space, db, "layout", "--fuse", "2", n_trials=2), check=True)
    made = json.loads(first.stdout)["layout"]
    assert made["trials"]["fuse"] == made["race"]["fuse"] == 2
    assert "results may differ" not in first.stderr

    resumed = cli(*run_args(space, db, "layout", n_trials=3), check=True)
    assert json.loads(resumed.stdout)["layout"] == made
    assert "the study's stored layout" in resumed.stderr and "results may differ" not in resumed.stderr
    attrs = optuna.load_study(study_name="layout", storage=f"sqlite:///{db}").user_attrs
    assert len(attrs[LAYOUT_ATTR]) == 1 and stored_layout(attrs).to_dict() == made

    changed = cli(*run_args(space, db, "layout", "--fuse", "1", n_trials=4), check=True)
    assert json.loads(changed.stdout)["layout"]["trials"]["fuse"] == 1
    warned = [line for line in changed.stderr.splitlines() if "results may differ in their rounding" in line]
    assert len(warned) == 1
    attrs = optuna.load_study(study_name="layout", storage=f"sqlite:///{db}").user_attrs
    assert [(layout.trials.fuse, finished) for layout, finished in stored_layouts(attrs)] == [(2, 0), (1, 3)]
    shown = json.loads(cli("trials", "--study", "layout", "--storage", f"sqlite:///{db}", "--json", check=True).stdout)
    assert [(r["trials"]["fuse"], r["finished_trials"]) for r in shown["layouts"]] == [(2, 0), (1, 3)]
