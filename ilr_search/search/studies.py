"""Reading stored studies back: the study report (StudyReport), fidelity, the default study of a storage, listings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from ilr_search.analysis.answer import Answer
from ilr_search.analysis.fidelity import Fidelity, NoiseBand, audit_reports, study_fidelity
from ilr_search.analysis.race_report import DecidedBest, RaceReport
from ilr_search.analysis.results import (
    FrontRow,
    LayerView,
    RaceRunRow,
    ReferenceRow,
    TrialRow,
    curves_by_trial,
    listed_trials,
    race_run_rows,
    reference_rows,
    study_front,
    trial_rows,
)
from ilr_search.config import StudySettings
from ilr_search.errors import UserInputError
from ilr_search.search.learn import learned_record
from ilr_search.search.phases import PhaseRecord
from ilr_search.search.plan import SAMPLER_ATTR, StudyLayout, stored_config, stored_layouts
from ilr_search.search.race_results import RACE_POINT_FIELDS, foreign_answer, race_report
from ilr_search.storage import (
    Run,
    StorageSpec,
    Store,
    open_storage,
    open_store,
    parse_storage,
    stored_references,
    study_id,
    study_storage,
)
from ilr_search.storage.trials import FINISHED, TrialRecord, study_trials, trained_results

FRONT_FIELDS = ("trial", "reuse_map", "flops_ratio", "val_ppl", "val_bpb")  # of a front point in `run --json`
PARETO_FIELDS = ("trial", "reuse_map", "map", "knobs", "flops_ratio", "val_ppl", "val_bpb", "params", "within_noise_of")
# ... of a front point in `pareto --json`


@dataclass(frozen=True)
class TrialListing:
    """What `trials` lists beyond the report: each trial's row with its curves, the reference runs as rows, every
    stored race run (race_run_rows), and the layouts the study's runs used, each with the finished trials the study
    had when it began (plan.stored_layouts)."""

    rows: tuple[TrialRow, ...]
    references: tuple[ReferenceRow, ...]
    race_runs: tuple[RaceRunRow, ...]
    layouts: tuple[tuple[StudyLayout, int], ...] = ()


@dataclass(frozen=True)
class FrontView:
    """What `pareto` shows beyond the report: the decided front with its noise ties (`within_noise_of`), the proxy's
    front, the baseline's seed-to-seed spread, the stored fronts by trial count, the layer view (`--view layers`)
    and the file written."""

    front: tuple[FrontRow, ...]
    proxy_front: tuple[FrontRow, ...]
    noise: NoiseBand | None
    front_history: Mapping[str, list[int]]
    layers: LayerView | None = None
    out: str | None = None


@dataclass(frozen=True)
class StudyReport:
    """A study read back, built once (study_report) and shown by `run`, `trials`, `pareto` and the Python API: its
    trials (the listed ones), reference runs, race (analysis/race_report.py; None for a study not made by
    ilr-search), fidelity (how far its proxy can be trusted), sampler and pruner settings, and its answer: the one
    line a reader needs first (analysis/answer.py). `listing` and `front_view` hold what `trials` and `pareto` add;
    to_json is the one JSON form of each."""

    study: str
    storage: str  # its URL, the password masked
    trials: tuple[TrialRecord, ...]
    references: Mapping[str, Run]  # name -> the stored reference run (kind reference)
    race: RaceReport | None
    fidelity: Fidelity
    answer: Answer
    settings: StudySettings | None = None
    interrupted: bool = False
    time_budget: float | None = None  # the run's wall-clock budget in seconds (`run --time-budget`; None: none)
    out_of_time: bool = False  # the budget stopped the run before the study decided; the same command continues
    workers: tuple[tuple[int, int | None], ...] | None = None  # (worker, exit code) of a run with --workers
    layout: StudyLayout | None = None  # how the run that made this report used the machine (`run` only)
    phases: tuple[PhaseRecord, ...] | None = None  # where that run's time went, phase by phase (`run` only)
    listing: TrialListing | None = None
    front_view: FrontView | None = None
    # `run --learn`: the learned map, its gates per layer and pass, what learning cost, and its trial (search/learn.py)
    learned: Mapping[str, Any] | None = None

    @property
    def verdict(self) -> str:
        return self.race.verdict if self.race is not None else ""

    @property
    def target_steps(self) -> int | None:
        return self.race.target_steps if self.race is not None else None

    @property
    def front(self) -> tuple[FrontRow, ...]:
        """The decided front (the race's; for a study with no race, none)."""
        return self.race.front if self.race is not None else ()

    @property
    def proxy_front(self) -> list[FrontRow]:
        return study_front(list(self.trials))

    @property
    def n_trials(self) -> int:
        """Trials finished (complete, pruned) or failed."""
        return sum(t.state in FINISHED or t.state == TrialState.FAIL for t in self.trials)

    @property
    def n_complete(self) -> int:
        return sum(t.state == TrialState.COMPLETE for t in self.trials)

    @property
    def n_pruned(self) -> int:
        return sum(t.state == TrialState.PRUNED for t in self.trials)

    @property
    def n_failed(self) -> int:
        return sum(t.state == TrialState.FAIL for t in self.trials)

    @property
    def steps_trained(self) -> int:
        """Steps the trials trained (reference and race runs apart)."""
        return sum(t.steps for t in self.trials)

    @property
    def steps_saved_by_pruning(self) -> int:
        return sum(t.steps_saved for t in self.trials)

    @property
    def race_steps(self) -> int:
        return self.race.steps_trained if self.race is not None else 0

    @property
    def reference_steps(self) -> int:
        return sum(int(r.steps or 0) for r in self.references.values())

    def to_json(self) -> dict[str, Any]:
        """What `trials --json` (with a listing), `pareto --json` (with a front view) or `run --json` prints."""
        race = self.race
        common = {
            "verdict": self.verdict,
            "answer": self.answer.line,
            "answer_details": list(self.answer.details),
            "trust": self.answer.trust.text() if self.answer.trust is not None else None,
            "target_steps": self.target_steps,
        } | ({"learned": dict(self.learned)} if self.learned is not None else {})
        race_parts = {
            "detectable_gap": race.detectable_gap.to_dict() if race and race.detectable_gap else None,
            "equal_compute": race.equal_compute.to_dict() if race and race.equal_compute else None,
            "race": race.to_json() if race else None,
        }
        if self.listing is not None:
            return {
                "study": self.study,
                "trials": [r.to_dict() for r in self.listing.rows],
                "references": [r.to_dict() for r in self.listing.references],
                "race_runs": [r.to_dict() for r in self.listing.race_runs],
                "fidelity": self.fidelity.to_dict(),
                "race": race_parts["race"],
                **common,
                "layouts": [
                    layout.to_dict() | {"finished_trials": finished} for layout, finished in self.listing.layouts
                ],
            }
        if self.front_view is not None:
            view = self.front_view
            return (
                {
                    "study": self.study,
                    "pareto": [p.to_dict((*PARETO_FIELDS, *RACE_POINT_FIELDS)) for p in view.front],
                    "proxy_pareto": [p.to_dict(PARETO_FIELDS) for p in view.proxy_front],
                    **common,
                    **race_parts,
                    "noise": view.noise.to_dict() if view.noise is not None else None,
                    "front_history": dict(view.front_history),
                    "references": {name: r.to_dict() for name, r in self.references.items()},
                    "fidelity": self.fidelity.to_dict(),
                }
                | ({"layers": view.layers.to_dict()} if view.layers is not None else {})
                | ({"out": view.out} if view.out is not None else {})
            )
        report = {
            "study": self.study,
            "storage": self.storage,
            "n_trials": self.n_trials,
            "n_complete": self.n_complete,
            "n_pruned": self.n_pruned,
            "n_failed": self.n_failed,
            "steps_trained": self.steps_trained,
            "steps_saved_by_pruning": self.steps_saved_by_pruning,
            "reference_steps": self.reference_steps,
            "race_steps": self.race_steps,
            # a front point of `run --json`: its fields, and its knobs where any is on
            "pareto": [
                p.to_dict((*FRONT_FIELDS, *RACE_POINT_FIELDS)) | ({"knobs": p.knobs} if p.knobs else {})
                for p in self.front
            ],
            "proxy_pareto": [
                p.to_dict(FRONT_FIELDS) | ({"knobs": p.knobs} if p.knobs else {}) for p in self.proxy_front
            ],
            **common,
            **race_parts,
            "references": {name: r.to_dict() for name, r in self.references.items()},
            "fidelity": self.fidelity.to_dict(),
            "interrupted": self.interrupted,
            "time_budget_seconds": self.time_budget,
            "out_of_time": self.out_of_time,
            "sampler": self.settings.sampler.to_dict() if self.settings else None,
            "pruner": self.settings.pruner.name if self.settings else None,
        }
        if self.workers is not None:
            report["workers"] = [{"worker": k, "exit_code": code} for k, code in self.workers]
        if self.layout is not None:
            report["layout"] = self.layout.to_dict()
        if self.phases is not None:
            report["phases"] = [p.to_dict() for p in self.phases]
        return report


def study_report(study: optuna.Study, spec: StorageSpec, store: Store) -> StudyReport:
    """The study's report (StudyReport): what every command that shows a study reads, built here only."""
    runs = store.runs()
    records = study_trials(study, runs)
    race = race_report(records, study.user_attrs, runs)
    stored = study.user_attrs.get(SAMPLER_ATTR)
    return StudyReport(
        study=study.study_name,
        storage=spec.masked,
        trials=tuple(listed_trials(records)),
        references=stored_references(runs),
        race=race,
        fidelity=fidelity_of(study, store, records),
        answer=race.answer if race is not None else foreign_answer(records),
        settings=StudySettings.from_dict(stored) if stored else None,
        learned=learned_record(study.user_attrs, records),
    )


def summarize_stored(storage: str | None, study_name: str) -> StudyReport:
    """The `run` report of a stored study, trained nothing (an interrupted multi-worker run)."""
    spec = parse_storage(storage)
    study = open_study(spec, study_name)
    return study_report(study, spec, open_store(spec, study_name, storage=study_storage(study)))


def fidelity_of(study: optuna.Study, store: Store, trials: Sequence[TrialRecord]) -> Fidelity:
    """The study's fidelity (rung agreement, noise, second seed, audits, and one line of how far they agree) from
    its trials (each with its result on its map's run: study_trials) and rows."""
    config = stored_config(study.user_attrs)
    final_step = config.space.train.steps if config is not None else 0
    return study_fidelity(
        study.study_name,
        trials,
        curves_by_trial(store.curve_points()),
        stored_references(store.reference_runs()),
        final_step,
        audit_reports(trials, store.race_runs()),
    )


def open_study(spec: StorageSpec, name: str) -> optuna.Study:
    """An existing study, read-only use; a one-line error if it is not there (nothing is created)."""
    if not spec.exists():
        raise UserInputError(f"no study {name!r}: storage {spec.masked} does not exist yet")
    storage = open_storage(spec)
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
        raise UserInputError(
            f"storage {spec.masked} does not exist yet; run a study first (ilr-search run --budget 1.5x)"
        )
    return spec


def default_study(storage: str | None = None) -> tuple[str, str]:
    """(name, why) of the study a command without --study reads: the storage's only study, or else its most
    recently active one."""
    spec = existing_storage(storage)
    st = open_storage(spec)
    summaries = optuna.get_all_study_summaries(st, include_best_trial=False)
    if not summaries:
        raise UserInputError(f"storage {spec.masked} holds no study; run one first (ilr-search run --budget 1.5x)")
    if len(summaries) == 1:
        return summaries[0].study_name, f"the only study in {spec.masked}"

    def last_active(summary: optuna.study.StudySummary) -> float:
        trials = st.get_all_trials(study_id(summary), deepcopy=False)
        times = [time for t in trials if (time := t.datetime_complete or t.datetime_start) is not None]
        return max(times).timestamp() if times else 0.0

    name = max(summaries, key=last_active).study_name
    return name, f"the most recently active of {len(summaries)} studies in {spec.masked}; --study chooses another"


DECIDED_WORDS = ("race open", "beats the baseline", "nothing beats the baseline")  # the `decided` column of `studies`


@dataclass(frozen=True)
class StudySummary:
    """One study as `studies` lists it: its trials (listed, complete), budget, layers, the map the race reports
    (`best`: None before the race has a front, or for a study not made by ilr-search), the best perplexity (the
    race's map's, else the proxy's best), the proxy's best perplexity and the answer line."""

    study: str
    n_trials: int
    n_complete: int
    budget: str | None
    layers: int | None
    best: DecidedBest | None
    best_val_ppl: float | None
    proxy_best_val_ppl: float | None
    answer: str

    @property
    def decided(self) -> str | None:
        """Where the race stands, in DECIDED_WORDS; None before it has a best map."""
        if self.best is None:
            return None
        if not self.best.done:
            return DECIDED_WORDS[0]
        return DECIDED_WORDS[1] if self.best.beats_baseline else DECIDED_WORDS[2]

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "study": self.study,
            "n_trials": self.n_trials,
            "n_complete": self.n_complete,
            "budget": self.budget,
            "layers": self.layers,
            "best": best.map if best else None,
            "best_val_ppl": self.best_val_ppl,
            "best_steps": best.steps if best else None,
            "decided": self.decided,
            "proxy_best_val_ppl": self.proxy_best_val_ppl,
            "answer": self.answer,
        }


@dataclass(frozen=True)
class StudyListing:
    """What `studies` shows: every study of a storage (StudySummary). to_json is `studies --json`."""

    studies: tuple[StudySummary, ...]

    def to_json(self) -> dict[str, Any]:
        return {"studies": [s.to_dict() for s in self.studies]}


def list_studies(storage: str | None = None) -> StudyListing:
    spec = existing_storage(storage)
    st = open_storage(spec)
    rows = []
    for summary in optuna.get_all_study_summaries(st, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=st)
        config = stored_config(study.user_attrs)
        store = open_store(spec, summary.study_name, read_only=True, storage=st)
        runs = store.runs()
        trials = listed_trials(study_trials(study, runs))
        ppls = [t.val_ppl for t in trained_results(trials) if t.val_ppl is not None]
        race = race_report(trials, study.user_attrs, runs) if config else None
        best = race.best if race is not None else None
        if race is not None and race.settings.judged != "ppl":  # its losses are no log-perplexities: its answer says
            ppls = []
            best = dataclasses.replace(best, val_ppl=None) if best is not None else None
        rows.append(
            StudySummary(
                study=summary.study_name,
                n_trials=len(trials),
                n_complete=sum(t.state == TrialState.COMPLETE for t in trials),
                budget=config.budget.text if config else None,
                layers=config.space.model.n_layers if config else None,
                best=best,
                best_val_ppl=best.val_ppl if best else (min(ppls) if ppls else None),
                proxy_best_val_ppl=min(ppls) if ppls else None,
                answer=race.answer.line if race is not None else foreign_answer(trials).line,
            )
        )
    return StudyListing(tuple(rows))


def list_trials(study_name: str, storage: str | None = None) -> list[dict[str, Any]]:
    """The study's trials, each with its curves, as `trials --json` lists them (TrialRow.to_dict)."""
    listing = trials_report(study_name, storage).listing
    return [row.to_dict() for row in listing.rows] if listing is not None else []


def trials_report(study_name: str, storage: str | None = None) -> StudyReport:
    """`ilr-search trials`: the study's report with its listing: every trial with its curves, the reference runs,
    every stored race run (race_run_rows) and the layouts its runs used (plan.stored_layouts)."""
    spec = parse_storage(storage, read_only=True)
    study = open_study(spec, study_name)
    store = open_store(spec, study_name, read_only=True, storage=study_storage(study))
    report = study_report(study, spec, store)

    listing = TrialListing(
        tuple(trial_rows(list(report.trials), store.curve_points(), store.train_curve_points())),
        tuple(ReferenceRow(r) for r in reference_rows(store)),
        tuple(race_run_rows(store.race_runs(), study.user_attrs)),
        tuple(stored_layouts(study.user_attrs)),
    )
    return dataclasses.replace(report, listing=listing)
