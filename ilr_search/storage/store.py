"""The project's own records of a study, beside Optuna's trials: the `Store` interface and its record types.

A store keeps, per study: learning curves (every evaluation of every trial, which the pruner compares, and the
training loss as window means), why each pruned trial was pruned, the Pareto front each time a trial completes,
and its runs, each one Run: the race runs (the race's longer or extra-seed runs and the audit's longer
retrainings of chosen maps; the race reads the audit's runs as its own), the reference runs, the trials' runs
(a trial that trains a map claims its run, so that concurrent workers never train one map twice) and the
workers' registrations. Race, trial and worker runs are claimed by one protocol (claim_run, beat_run,
finish_run): one row per job, held by its worker while its heartbeat is fresh.
`SQLStore` keeps them in tables of the study's SQL database, `JournalStore` in a file beside a journal.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from ilr_search.knobs import KnobValue, config_key


@dataclass(frozen=True)
class RunJob:
    """What a run is claimed by: its map at `factor` x the proxy's steps, at one replicate (a seed, or in a frozen
    study a chunk of held-out units). A trial's run is its map at factor 1 and the proxy's seed; a worker's
    registration is worker_job(k)."""

    factor: str  # as text, e.g. "4"
    seed: int
    map_key: str


RunKind = Literal["trial", "reference", "race", "worker"]

ColumnValue = str | int | float | None  # a value of a stored run's field (Run.to_record)


@dataclass(frozen=True)
class Run:
    """One run of the study's ledger: map `map_key` (with its knobs) trained `steps` steps (`factor` x the proxy's)
    at `replicate` (a seed, or in a frozen study a chunk of held-out windows or items), with its FLOPs ratio, its
    `state` (running | complete | failed: diverged | interrupted | pruned) and, once finished, its losses, curve
    (step, validation loss), seconds, reason and a frozen run's score of each unit of its chunk, in unit order
    (what the race pairs by unit). `kind`: "trial" (the map claimed by the worker that trains it for a trial; once
    that trial is told, its result and Optuna's number of the trial, `trial`), "reference" (named `name`:
    baseline_seedN, second_seed, blockK; with its `schedule`, `reuse_map`, None for block recurrence, `knobs`,
    `block_map` and the trainer's `status`, ok | diverged), "race" (the race's or the audit's: the race reads the
    audit's runs as its own) or "worker" (a worker's registration, its number the replicate, alive while its
    trials run). A claimed run is held by `worker` while its `heartbeat` is fresh."""

    kind: RunKind
    map_key: str
    factor: str
    replicate: int
    state: str
    flops_ratio: float
    steps: int
    worker: str = ""
    heartbeat: float = 0.0
    val_loss: float | None = None
    val_ppl: float | None = None
    val_bpb: float | None = None
    curve: tuple[tuple[int, float], ...] = ()
    seconds: float | None = None
    reason: str | None = None
    scores: tuple[float, ...] = ()
    name: str = ""  # a reference's name
    trial: int | None = None  # a trial's number
    schedule: tuple[int, ...] | None = None
    reuse_map: tuple[int, ...] | None = None
    knobs: Mapping[str, KnobValue] = field(default_factory=dict)
    block_map: str | None = None
    status: str | None = None

    @property
    def seed(self) -> int:
        """Its replicate: a training seed, or a frozen study's chunk."""
        return self.replicate

    @property
    def job(self) -> RunJob:
        """What it is claimed by (a race, trial or worker run)."""
        return RunJob(self.factor, self.replicate, self.map_key)

    @property
    def finished(self) -> bool:
        """It has a final result: complete, or failed (diverged), which no worker trains again."""
        return self.state in FINAL_STATES

    @classmethod
    def from_record(cls, r: Mapping[str, Any], kind: RunKind = "race") -> Run:
        """The run from a stored record (a table row's mapping or a journal line): curve, scores, schedule, reuse
        map and knobs as JSON text."""

        def ints(text: str | None) -> tuple[int, ...] | None:
            return tuple(int(x) for x in json.loads(text)) if text is not None else None

        return cls(
            kind,
            r["map_key"],
            r["factor"],
            int(r["seed"]),
            r["state"],
            float(r["flops_ratio"]),
            int(r["steps"]),
            r["worker"],
            float(r["heartbeat"]),
            r.get("val_loss"),
            r.get("val_ppl"),
            r.get("val_bpb"),
            tuple((int(s), float(v)) for s, v in json.loads(r.get("curve") or "[]")),
            r.get("seconds"),
            r.get("reason"),
            tuple(float(v) for v in json.loads(r.get("scores") or "[]")),
            r["name"] if kind == "reference" else "",
            r.get("trial"),
            ints(r.get("schedule")),
            ints(r.get("reuse_map")),
            json.loads(r.get("knobs") or "{}"),
            r.get("block_map"),
            r.get("status"),
        )

    def to_record(self) -> dict[str, ColumnValue]:
        """The run as stored (from_record's input): every field, the tuples as JSON text."""
        return {
            "factor": self.factor,
            "seed": self.replicate,
            "map_key": self.map_key,
            "worker": self.worker,
            "heartbeat": self.heartbeat,
            "state": self.state,
            "flops_ratio": self.flops_ratio,
            "steps": self.steps,
            "val_loss": self.val_loss,
            "val_ppl": self.val_ppl,
            "val_bpb": self.val_bpb,
            "curve": json.dumps([list(p) for p in self.curve]),
            "seconds": self.seconds,
            "reason": self.reason,
            "scores": json.dumps(list(self.scores)) if self.scores else None,
            "trial": self.trial,
            # a reference's own fields
            "name": self.name,
            "schedule": json.dumps(list(self.schedule)) if self.schedule is not None else None,
            "reuse_map": json.dumps(list(self.reuse_map)) if self.reuse_map is not None else None,
            "knobs": json.dumps(dict(self.knobs)) if self.knobs else None,
            "block_map": self.block_map,
            "status": self.status,
        }

    def to_dict(self) -> dict[str, Any]:
        """A reference run as the `references` of the JSON reports show it: knobs only where set, `map` only for a
        block map."""
        return (
            {
                "schedule": list(self.schedule) if self.schedule is not None else None,
                "seed": self.replicate,
                "flops_ratio": self.flops_ratio,
                "reuse_map": list(self.reuse_map) if self.reuse_map is not None else None,
                "val_ppl": self.val_ppl,
                "val_bpb": self.val_bpb,
                "status": self.status,
                "steps": self.steps,
                "curve": [[step, loss] for step, loss in self.curve],
            }
            | ({"knobs": dict(self.knobs)} if self.knobs else {})
            | ({"map": self.block_map} if self.block_map else {})
        )


FINAL_STATES = ("complete", "failed")  # of a run; failed: it diverged, it is not trained again
ENDED_STATES = (*FINAL_STATES, "pruned")  # a claimed run in one of these is not trained again (pruned: a trial's)


def worker_job(number: int) -> RunJob:
    """The job of worker `number`'s registration (a run of kind "worker")."""
    return RunJob("0", number, "worker")


def reference_run(
    name: str,
    schedule: Sequence[int],
    seed: int,
    flops_ratio: float,
    reuse_map: Sequence[int] | None,
    knobs: Mapping[str, KnobValue],
    block_map: str | None,
    val_ppl: float | None,
    val_bpb: float | None,
    status: str | None,
    steps: int,
    curve: Sequence[tuple[int, float]],
) -> Run:
    """A finished reference run as the store keeps it: its map (with its knobs) at its seed and the proxy's length
    (factor 1; a block recurrence's map is empty: it has no reuse map), complete where it trained to a result; its
    loss is that of its perplexity (what the race reads)."""
    map_text = block_map or ",".join(map(str, reuse_map or ()))
    return Run(
        "reference",
        config_key(map_text, knobs) if map_text else "",
        "1",
        seed,
        "complete" if status == "ok" else "failed",
        flops_ratio,
        steps,
        val_loss=math.log(val_ppl) if val_ppl else None,
        val_ppl=val_ppl,
        val_bpb=val_bpb,
        curve=tuple((int(s), float(v)) for s, v in curve),
        name=name,
        schedule=tuple(schedule),
        reuse_map=tuple(reuse_map) if reuse_map is not None else None,
        knobs=dict(knobs),
        block_map=block_map,
        status=status,
    )


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation of a trial: its validation loss at `step`, with its map and FLOPs ratio."""

    trial_number: int
    step: int
    val_loss: float
    flops_ratio: float
    map_key: str
    tokens: int = 0  # training tokens seen at `step` (as stored; 0 where a caller builds a point without them)


@dataclass(frozen=True)
class TrainCurvePoint:
    """The training loss of a trial at `step`: the mean over the steps since the trainer's previous read of
    it (every 16 steps, train.py SYNC_EVERY), stored as the curve of kind "train" beside the validation one."""

    trial_number: int
    step: int
    tokens: int
    loss: float
    map_key: str


@dataclass(frozen=True)
class PruningRecord:
    """Why a trial was pruned: at `step`, its validation loss and FLOPs ratio there, the trials that dominated it
    and the pruner's reason."""

    step: int
    val_loss: float
    flops_ratio: float
    dominated_by: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class StoredFrontPoint:
    """A point of a stored front (save_front): its trial, reuse map, FLOPs ratio, perplexity, bits per byte and
    parameter count (None where the front was stored without them)."""

    trial: int
    reuse_map: tuple[int, ...]
    flops_ratio: float
    val_ppl: float
    val_bpb: float | None = None
    params: int | None = None

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> StoredFrontPoint:
        """The point from a journal line's front item (a dict as save_front was given it)."""
        return cls(r["trial"], tuple(r["reuse_map"]), r["flops_ratio"], r["val_ppl"], r.get("val_bpb"), r.get("params"))


def claimed_run(job: RunJob, worker: str, now: float, flops_ratio: float, steps: int) -> dict[str, Any]:
    """The stored fields of a run that `worker` claims at time `now`: `job`'s factor, seed and map, running."""
    return {
        "factor": job.factor,
        "seed": job.seed,
        "map_key": job.map_key,
        "worker": worker,
        "heartbeat": now,
        "state": "running",
        "flops_ratio": flops_ratio,
        "steps": steps,
    }


def run_held(row: Mapping[Any, Any], worker: str, now: float, stale_after: float) -> bool:
    """Whether `worker` may not claim a stored run (Store.claim_run): it ended (complete, failed: diverged, or a
    trial's pruned), or it is running under another worker whose heartbeat is at most `stale_after` seconds old."""
    return row["state"] in ENDED_STATES or (
        row["state"] == "running" and row["worker"] != worker and now - row["heartbeat"] <= stale_after
    )


class Store(ABC):
    """Runs, curves, pruning records and fronts of one study; every method is safe with several workers writing
    at once."""

    def register_worker(self, worker: str) -> int:
        """A number no other worker of this study was given: the lowest whose registration (worker_job) `worker`
        claims; a registration is never claimed again, however old its heartbeat."""
        k = 0
        while not self.claim_run("worker", worker_job(k), worker, 0.0, 0, stale_after=math.inf):
            k += 1
        return k

    @abstractmethod
    def holds_records(self) -> bool:
        """Whether anything (a run, a curve point, a front) is stored under this study's name."""

    @abstractmethod
    def add_curve_point(self, point: CurvePoint, tokens: int) -> None:
        """Record one evaluation of a trial (replacing an earlier record of the same trial and step)."""

    @abstractmethod
    def curve_points(self, step: int | None = None) -> list[CurvePoint]:
        """Every recorded evaluation of the study (only those at `step` if given), by trial then step."""

    @abstractmethod
    def add_train_curve(self, points: list[TrainCurvePoint]) -> None:
        """Record training-loss points, in one write (replacing earlier records of the same trial and step)."""

    @abstractmethod
    def train_curve_points(self) -> list[TrainCurvePoint]:
        """Every recorded training-loss point of the study, by trial then step (none in a study stored before
        they were kept)."""

    @abstractmethod
    def record_pruning(
        self, trial_number: int, step: int, val_loss: float, flops_ratio: float, dominated_by: list[int], reason: str
    ) -> None:
        """Record why `trial_number` was pruned (replacing an earlier record of that trial)."""

    @abstractmethod
    def pruning_records(self) -> dict[int, PruningRecord]:
        """Trial number -> its pruning record."""

    @abstractmethod
    def save_front(self, n_complete: int, front: list[dict[str, Any]]) -> None:
        """Store the front computed from `n_complete` completed trials (the set only grows, so one count is
        one set: concurrent workers that save the same count save the same front)."""

    @abstractmethod
    def front_history(self) -> dict[int, list[StoredFrontPoint]]:
        """Number of completed trials -> the front computed from them."""

    @abstractmethod
    def claim_run(
        self, kind: RunKind, job: RunJob, worker: str, flops_ratio: float, steps: int, stale_after: float
    ) -> bool:
        """Claim the run of `kind` and `job` for `worker`: True if it was free, interrupted, or held by a worker
        whose heartbeat is older than `stale_after` seconds (a dead worker); False if it ended (complete, failed:
        diverged, or pruned) or is held by a live worker."""

    @abstractmethod
    def beat_run(self, kind: RunKind, job: RunJob, worker: str) -> None:
        """Renew the heartbeat of the running run of `kind` and `job` if `worker` holds it."""

    def finish_run(
        self,
        kind: RunKind,
        job: RunJob,
        worker: str,
        state: str,
        val_loss: float | None,
        val_ppl: float | None,
        val_bpb: float | None,
        curve: Sequence[tuple[int, float]],
        seconds: float | None,
        reason: str | None,
        scores: Sequence[float] = (),
        trial: int | None = None,
    ) -> bool:
        """Store the result (a frozen run's: with its units' `scores`; a trial run's: the number of the trial told
        with it) if `worker` still holds the run; False if another worker took it over."""
        result = {
            "state": state,
            "val_loss": val_loss,
            "val_ppl": val_ppl,
            "val_bpb": val_bpb,
            "curve": json.dumps([list(p) for p in curve]),
            "seconds": seconds,
            "reason": reason,
            "scores": json.dumps([float(v) for v in scores]) if scores else None,
            "trial": trial,
        }
        return self._finish_run(kind, job, worker, result)

    @abstractmethod
    def _finish_run(self, kind: RunKind, job: RunJob, worker: str, result: dict[str, Any]) -> bool:
        """Write `result` (stored field -> value, the curve as JSON text) and a fresh heartbeat on the run's row if
        `worker` holds it; False if another worker took it over."""

    @abstractmethod
    def save_reference(self, run: Run) -> None:
        """Store a finished reference run (kind "reference") in one write, replacing an earlier run of its name."""

    @abstractmethod
    def runs(self) -> list[Run]:
        """Every stored run of the study, in one read: the race runs (the latest row of each), by factor, seed and
        map, then the reference runs, by name in a database (as Optuna read the study attributes of a SQLite one),
        in the order first stored on a journal (as Optuna's journal keeps them), then the trials' and the workers'
        runs."""

    def race_runs(self) -> list[Run]:
        """The race runs of `runs`."""
        return [r for r in self.runs() if r.kind == "race"]

    def reference_runs(self) -> list[Run]:
        """The reference runs of `runs`."""
        return [r for r in self.runs() if r.kind == "reference"]

    def worker_beats(self) -> dict[str, float]:
        """The registered workers' last heartbeats, by worker name."""
        return {r.worker: r.heartbeat for r in self.runs() if r.kind == "worker"}


def study_ledger(stored: Iterable[Run]) -> list[Run]:
    """The results of a study's ledger, in one list: the trial runs told with a result (complete, pruned or
    diverged), by trial number; the reference runs, by name; the race runs. `stored`: the store's runs
    (Store.runs)."""
    stored = list(stored)
    return (
        sorted(
            (r for r in stored if r.kind == "trial" and r.trial is not None and r.state in ENDED_STATES),
            key=lambda r: cast(int, r.trial),
        )
        + sorted((r for r in stored if r.kind == "reference"), key=lambda r: r.name)
        + [r for r in stored if r.kind == "race"]
    )


def stored_references(runs: Iterable[Run]) -> dict[str, Run]:
    """The reference runs of `runs` (Store.runs or Store.reference_runs; the race's are passed over) by name, in
    the store's order."""
    return {run.name: run for run in runs if run.kind == "reference"}
