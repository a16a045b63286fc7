"""A trial as ilr-search stores it: the names of the user attributes search/trial_groups.py writes
on a trial, shared by that writer and this reader, and TrialRecord, every one of them read once from Optuna's
FrozenTrial. A trial that trains a map writes its result on the map's run, which the study's ledger reads
(store.study_ledger): study_trials reads a study's trials into records, each with its result, the run's where
Optuna holds none (a trial failed under its worker, or not yet told); every reader of results goes through it (or,
holding one FrozenTrial that Optuna handed over, through trial_record). told_trials reads the trials in the states
Optuna was told, what the search counts to schedule trials. A study stored by an earlier version lacks some
attributes: they read as None (or their stated default)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final, TypedDict, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

from ilr_search.knobs import KnobValue
from ilr_search.storage.store import ENDED_STATES, Run
from ilr_search.training.schedule import Map

CONFIG_ATTR: Final = "ilr:config"  # the study attribute of its stored configuration (search/plan.py)


class TrialAttr:
    """The names of a trial's user attributes."""

    # the proposal, written before the trial trains
    REUSE_MAP: Final = "reuse_map"  # the layers' reuse counts, [2, 1, 1, 1]
    MAP_KEY: Final = "map_key"  # what the study dedupes and claims on: "2,1,1,1", "2,1,1,1|injection=add"
    FLOPS_RATIO: Final = "flops_ratio"
    PARAMS: Final = "params"  # the model's parameter count
    KNOBS: Final = "knobs"  # written only where a knob is searched
    PROPOSED_MAP: Final = "proposed_map"  # written only where the budget repaired the sampler's map
    # the result, written when the trial ends
    STATUS: Final = "status"  # ok | diverged | pruned
    REASON: Final = "reason"
    STEPS: Final = "steps"  # trained by this trial (0 for a reuse)
    RESUMED_FROM_STEP: Final = "resumed_from_step"
    VAL_LOSS: Final = "val_loss"
    VAL_PPL: Final = "val_ppl"
    VAL_BPB: Final = "val_bpb"
    TRAIN_SECONDS: Final = "train_seconds"
    TOKENS_PER_SECOND: Final = "tokens_per_second"
    PRUNED_AT_STEP: Final = "pruned_at_step"
    STEPS_SAVED: Final = "steps_saved"  # by pruning
    FUSED_GROUP: Final = "fused_group"  # trained in lockstep with this many maps (search/trial_groups.py)
    # capacity below 1 (train.routed_result): each routed pass's realised fraction, the realised FLOPs ratio
    ROUTE_FRACTIONS: Final = "route_fractions"
    REALISED_FLOPS_RATIO: Final = "realised_flops_ratio"
    # where a result came from
    REUSED_FROM: Final = "reused_from"  # the trial whose result this one reused (it trained nothing)
    RETRY_OF: Final = "retry_of"  # the interrupted trial this queued one retries
    # a trial asked while the trials before it already made the study's target (two workers counted at the same
    # moment): it trains nothing and ends FAIL with this mark (search/trial_groups.py refuse_surplus)
    SURPLUS: Final = "surplus"


class TrialResultAttrs(TypedDict, total=False):
    """A trial's result as written to its user attributes when it ends (TrialAttr's names)."""

    status: str | None
    reason: str | None
    steps: int
    resumed_from_step: int
    val_loss: float | None
    val_ppl: float | None
    val_bpb: float | None
    train_seconds: float
    tokens_per_second: float
    pruned_at_step: int | None
    steps_saved: int
    fused_group: int
    reused_from: int
    route_fractions: dict[str, float]
    realised_flops_ratio: float


FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a study: Optuna's own fields and every attribute the objective writes on it."""

    number: int
    state: TrialState
    params: dict[str, Any] = field(default_factory=dict)  # Optuna's parameters (the sampler's r0..rN, knobs)
    values: list[float] | None = None  # the objective values Optuna was told
    datetime_start: datetime | None = None
    datetime_complete: datetime | None = None
    reuse_map: tuple[int, ...] | None = None
    map_key: str | None = None
    flops_ratio: float | None = None
    param_count: int | None = None
    knobs: Mapping[str, KnobValue] = field(default_factory=dict)  # empty: every knob off, or none searched
    proposed_map: tuple[int, ...] | None = None
    status: str | None = None
    reason: str | None = None
    steps: int = 0
    resumed_from_step: int | None = None
    val_loss: float | None = None
    val_ppl: float | None = None
    val_bpb: float | None = None
    train_seconds: float | None = None
    tokens_per_second: float | None = None
    pruned_at_step: int | None = None
    steps_saved: int = 0
    fused_group: int | None = None
    route_fractions: dict[str, float] | None = None
    realised_flops_ratio: float | None = None
    reused_from: int | None = None
    retry_of: int | None = None
    surplus: bool = False

    @property
    def is_reuse(self) -> bool:
        """It reused another trial's result for its map and trained nothing."""
        return self.reused_from is not None

    @property
    def has_result(self) -> bool:
        """Its map was evaluated to the end, pruned, or diverged: its result stands for its map."""
        return self.state in FINISHED or (self.state == TrialState.FAIL and self.status == "diverged")

    @property
    def trained_its_map(self) -> bool:
        """It trained its map (complete, pruned or diverged), rather than reuse another trial's result. Such a
        trial has its map, key and FLOPs ratio (the proposal's attributes are written at once)."""
        return (
            self.has_result
            and not self.is_reuse
            and bool(self.map_key)
            and self.reuse_map is not None
            and self.flops_ratio is not None
        )

    @property
    def is_trained_result(self) -> bool:
        """Complete, trained by this trial (not reused) and with a perplexity: what fronts, rankings, noise
        bands and tables are made of."""
        return self.state == TrialState.COMPLETE and self.trained_its_map and self.val_ppl is not None

    @property
    def schedule(self) -> list[int]:
        """The order its map runs the layers, from its map key (a block map's order is not its counts'); needs
        the map (a trial that proposed)."""
        assert self.map_key and self.reuse_map is not None, f"trial {self.number} has no map"
        return Map.parse(self.map_key, len(self.reuse_map)).schedule()

    @property
    def seconds(self) -> float | None:
        """How long the trial ran, from its start to its end."""
        if self.datetime_start is None or self.datetime_complete is None:
            return None
        return (self.datetime_complete - self.datetime_start).total_seconds()

    def reused_result(self) -> TrialResultAttrs:
        """The attributes a trial that reuses this one's result copies (those this trial has)."""
        values: TrialResultAttrs = {
            TrialAttr.VAL_LOSS: self.val_loss,
            TrialAttr.VAL_PPL: self.val_ppl,
            TrialAttr.VAL_BPB: self.val_bpb,
            TrialAttr.STATUS: self.status,
            TrialAttr.REASON: self.reason,
            TrialAttr.PRUNED_AT_STEP: self.pruned_at_step,
        }
        return cast(TrialResultAttrs, {k: v for k, v in values.items() if v is not None})


def _ints(value: Any) -> tuple[int, ...] | None:
    return tuple(int(x) for x in value) if value is not None else None


def _number(value: Any, kind: type) -> Any:
    return kind(value) if value is not None else None


def trial_record(t: FrozenTrial) -> TrialRecord:
    """The record of a stored trial; attributes it lacks (a trial still proposing, or an older study) read as
    None, or as their default."""
    return attrs_record(
        t.number,
        t.state,
        t.user_attrs,
        params=dict(t.params),
        values=list(t.values) if t.values else None,
        datetime_start=t.datetime_start,
        datetime_complete=t.datetime_complete,
    )


def attrs_record(number: int, state: TrialState, a: Mapping[str, Any], **optuna_fields: Any) -> TrialRecord:
    """The record of trial `number` in `state` from its user attributes `a` (and Optuna's own `optuna_fields`)."""
    return TrialRecord(
        number=number,
        state=state,
        **optuna_fields,
        reuse_map=_ints(a.get(TrialAttr.REUSE_MAP)),
        map_key=a.get(TrialAttr.MAP_KEY),
        flops_ratio=_number(a.get(TrialAttr.FLOPS_RATIO), float),
        param_count=_number(a.get(TrialAttr.PARAMS), int),
        knobs=dict(a.get(TrialAttr.KNOBS) or {}),
        proposed_map=_ints(a.get(TrialAttr.PROPOSED_MAP)),
        status=a.get(TrialAttr.STATUS),
        reason=a.get(TrialAttr.REASON),
        steps=int(a.get(TrialAttr.STEPS) or 0),
        resumed_from_step=_number(a.get(TrialAttr.RESUMED_FROM_STEP), int),
        val_loss=_number(a.get(TrialAttr.VAL_LOSS), float),
        val_ppl=_number(a.get(TrialAttr.VAL_PPL), float),
        val_bpb=_number(a.get(TrialAttr.VAL_BPB), float),
        train_seconds=_number(a.get(TrialAttr.TRAIN_SECONDS), float),
        tokens_per_second=_number(a.get(TrialAttr.TOKENS_PER_SECOND), float),
        pruned_at_step=_number(a.get(TrialAttr.PRUNED_AT_STEP), int),
        steps_saved=int(a.get(TrialAttr.STEPS_SAVED) or 0),
        fused_group=_number(a.get(TrialAttr.FUSED_GROUP), int),
        route_fractions=a.get(TrialAttr.ROUTE_FRACTIONS),
        realised_flops_ratio=_number(a.get(TrialAttr.REALISED_FLOPS_RATIO), float),
        reused_from=_number(a.get(TrialAttr.REUSED_FROM), int),
        retry_of=_number(a.get(TrialAttr.RETRY_OF), int),
        surplus=bool(a.get(TrialAttr.SURPLUS, False)),
    )


def told_trials(study: optuna.Study) -> list[TrialRecord]:
    """The records of a study's trials, in their order, in the states Optuna was told, without the results on
    their maps' runs: what the search counts to schedule trials (how many are finished, in flight, surplus),
    where the queued retry of a trial failed under its worker stands for that trial."""
    return [trial_record(t) for t in study.get_trials(deepcopy=False)]


def study_trials(study: optuna.Study, runs: Iterable[Run]) -> list[TrialRecord]:
    """The records of a study's trials, in their order, each with its result: where Optuna holds none (a trial
    failed under its worker, or not yet told) once its result was on its map's run, the run's (_with_run_result).
    `runs`: the store's runs (Store.runs), read once by the caller with whatever else it reads of them."""
    named = {r.trial: r for r in runs if r.kind == "trial" and r.trial is not None and r.state in ENDED_STATES}
    return [_with_run_result(t, named[t.number]) if t.number in named else t for t in told_trials(study)]


RUN_STATES = {"complete": (TrialState.COMPLETE, "ok"), "pruned": (TrialState.PRUNED, "pruned")}


def _with_run_result(record: TrialRecord, run: Run) -> TrialRecord:
    """The record of the trial that `run` (a finished trial run) names, with the run's result where Optuna holds
    none."""
    if record.has_result:
        return record
    state, status = RUN_STATES.get(run.state, (TrialState.FAIL, "diverged"))
    complete = state == TrialState.COMPLETE
    return replace(
        record,
        state=state,
        status=status,
        reason=run.reason,
        steps=run.steps if complete else record.steps,
        val_loss=run.val_loss,
        val_ppl=run.val_ppl,
        val_bpb=run.val_bpb,
        train_seconds=run.seconds,
    )


def trained_results(trials: Iterable[TrialRecord]) -> list[TrialRecord]:
    """The complete trials that trained their map and have a perplexity (TrialRecord.is_trained_result)."""
    return [r for r in trials if r.is_trained_result]
