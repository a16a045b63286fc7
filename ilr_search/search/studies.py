"""Reading stored studies back: summaries, fidelity, the default study of a storage, listings."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from ilr_search.config import StudySettings
from ilr_search.errors import UserInputError
from ilr_search.analysis.fidelity import audit_reports, study_fidelity
from ilr_search.analysis.results import (curves_by_trial, curves_of_trials, listed_trials, race_run_rows, reference_rows,
                                         references, study_front, trial_row)
from ilr_search.analysis.trials import FINISHED, Trial, trained_results, trial_records
from ilr_search.storage import study_id, study_storage, StorageSpec, Store, open_storage, open_store, parse_storage

from ilr_search.search.plan import SAMPLER_ATTR, stored_config, stored_layouts
from ilr_search.search.race import RACE_POINT_FIELDS, race_summary

FRONT_FIELDS = ("trial", "reuse_map", "flops_ratio", "val_ppl", "val_bpb")  # of a front point in `run --json`


def summarize(study: optuna.Study, spec: StorageSpec, store: Store) -> dict[str, Any]:
    """The `run --json` summary. `pareto` is the race's front (race.py): each point at its longest raced
    length, with its seeds, interval and whether it is confirmed; `proxy_pareto` the front of the proxy
    results alone (the study's seed, the proxy's length)."""
    trials = listed_trials(study.get_trials(deepcopy=False))
    states = [t.state for t in trials]
    race = race_summary(trials, study.user_attrs, store.race_runs())
    return {
        "study": study.study_name,
        "storage": spec.masked,
        "n_trials": sum(s in FINISHED or s == TrialState.FAIL for s in states),
        "n_complete": states.count(TrialState.COMPLETE),
        "n_pruned": states.count(TrialState.PRUNED),
        "n_failed": states.count(TrialState.FAIL),
        "steps_trained": sum(t.steps for t in trials),
        "steps_saved_by_pruning": sum(t.steps_saved for t in trials),
        "reference_steps": sum(int(r.get("steps") or 0) for r in references(study).values()),
        "race_steps": race["race"]["steps_trained"] if race["race"] else 0,
        "pareto": [{k: p[k] for k in (*FRONT_FIELDS, *RACE_POINT_FIELDS)} | ({"knobs": p["knobs"]} if p.get("knobs") else {})
                   for p in race["pareto"]],
        "proxy_pareto": [{k: p[k] for k in FRONT_FIELDS} | ({"knobs": p["knobs"]} if p.get("knobs") else {})
                         for p in study_front(trials)],
        "verdict": race["verdict"],
        "target_steps": race["target_steps"],
        "detectable_gap": race["detectable_gap"],
        "equal_compute": race["equal_compute"],
        "race": race["race"],
        "references": references(study),
        "fidelity": fidelity_of(study, store, trials),
    }


def summarize_stored(storage: str | None, study_name: str) -> dict[str, Any]:
    """The `run` summary of a stored study, trained nothing (an interrupted multi-worker run)."""
    spec = parse_storage(storage)
    study = open_study(spec, study_name)
    summary = summarize(study, spec, open_store(spec, study_name, storage=study_storage(study)))
    stored = study.user_attrs.get(SAMPLER_ATTR)
    settings = StudySettings.from_dict(stored) if stored else None
    summary["sampler"] = settings.sampler.to_dict() if settings else None
    summary["pruner"] = settings.pruner.name if settings else None
    return summary


def fidelity_of(study: optuna.Study, store: Store, trials: list[Trial] | None = None) -> dict[str, Any]:
    """The study's fidelity (rung agreement, noise, second seed, audits, verdict) from its trials and rows."""
    trials = trial_records(study.get_trials(deepcopy=False) if trials is None else trials)
    config = stored_config(study.user_attrs)
    final_step = config.space.train.steps if config is not None else 0
    return study_fidelity(study.study_name, trials, curves_by_trial(store.curve_points()), study.user_attrs,
                          final_step, audit_reports(trials, store.race_runs()))


def open_study(spec: StorageSpec, name: str) -> optuna.Study:
    """An existing study, read-only use; a one-line error if it is not there (nothing is created)."""
    if not spec.exists():
        raise UserInputError(f"no study {name!r}: storage {spec.masked} does not exist yet")
    storage = open_storage(spec, heartbeat=False)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
        hint = f"; studies there: {', '.join(names[:10])}" if names else "; the storage holds no study"
        raise UserInputError(f"no study {name!r} in {spec.masked}{hint}") from None


def existing_storage(storage: str | None) -> StorageSpec:
    """The storage a reading command reads, refused when its file is not there (nothing is created)."""
    spec = parse_storage(storage, read_only=True)
    if not spec.exists():
        raise UserInputError(f"storage {spec.masked} does not exist yet; run a study first (ilr-search run --budget 1.5x)")
    return spec


def default_study(storage: str | None = None) -> tuple[str, str]:
    """(name, why) of the study a command without --study reads: the storage's only study, or else its most
    recently active one."""
    spec = existing_storage(storage)
    st = open_storage(spec, heartbeat=False)
    summaries = optuna.get_all_study_summaries(st, include_best_trial=False)
    if not summaries:
        raise UserInputError(f"storage {spec.masked} holds no study; run one first (ilr-search run --budget 1.5x)")
    if len(summaries) == 1:
        return summaries[0].study_name, f"the only study in {spec.masked}"

    def last_active(summary: optuna.study.StudySummary) -> float:
        trials = st.get_all_trials(study_id(summary), deepcopy=False)
        times = [t.datetime_complete or t.datetime_start for t in trials if t.datetime_complete or t.datetime_start]
        return max(times).timestamp() if times else 0.0

    name = max(summaries, key=last_active).study_name
    return name, f"the most recently active of {len(summaries)} studies in {spec.masked}; --study chooses another"


def list_studies(storage: str | None = None) -> list[dict[str, Any]]:
    spec = existing_storage(storage)
    st = open_storage(spec, heartbeat=False)
    rows = []
    for summary in optuna.get_all_study_summaries(st, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=st)
        config = stored_config(study.user_attrs)
        trials = listed_trials(study.get_trials(deepcopy=False))
        ppls = [t.val_ppl for t in trained_results(trials) if t.val_ppl is not None]
        store = open_store(spec, summary.study_name, read_only=True, storage=st)
        best = race_summary(trials, study.user_attrs, store.race_runs())["best"] if config else None
        rows.append({"study": summary.study_name, "n_trials": len(trials),
                     "n_complete": sum(t.state == TrialState.COMPLETE for t in trials),
                     "budget": config.budget_text if config else None,
                     "layers": config.space.model.n_layers if config else None,
                     "best": best["map"] if best else None,
                     "best_val_ppl": best["val_ppl"] if best else (min(ppls) if ppls else None),
                     "best_steps": best["steps"] if best else None,
                     "decided": (None if not best else "race open" if not best["done"]
                                 else "beats the baseline" if best["beats_baseline"] else "nothing beats the baseline"),
                     "proxy_best_val_ppl": min(ppls) if ppls else None})
    return rows


def list_trials(study_name: str, storage: str | None = None) -> list[dict[str, Any]]:
    return trials_report(study_name, storage)["trials"]


def trials_report(study_name: str, storage: str | None = None) -> dict[str, Any]:
    """`ilr-search trials`: every trial, the reference runs, every stored race run (race_run_rows), the
    study's fidelity (how far its proxy can be trusted), and the layouts its runs used (plan.stored_layouts)."""
    spec = parse_storage(storage, read_only=True)
    study = open_study(spec, study_name)
    trials = trial_records(study.get_trials(deepcopy=False))
    store = open_store(spec, study_name, read_only=True, storage=study_storage(study))
    listed = listed_trials(trials)
    curves = curves_of_trials(listed, store.curve_points(), store.train_curve_points())
    runs = store.race_runs()
    race = race_summary(trials, study.user_attrs, runs)
    return {"study": study_name, "trials": [trial_row(t) | {"curves": curves[t.number]} for t in listed],
            "references": reference_rows(study),
            "race_runs": race_run_rows(runs, study.user_attrs),
            "fidelity": fidelity_of(study, store, trials),
            "race": race["race"], "verdict": race["verdict"], "target_steps": race["target_steps"],
            "layouts": [layout.to_dict() | {"finished_trials": finished}
                        for layout, finished in stored_layouts(study.user_attrs)]}
