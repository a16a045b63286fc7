"""`JournalStore`: the project's records of a study on journal storage (no SQL database), as JSON lines in a
file beside the journal, serialised by an flock. A claimed run of kind K is a line of kind "K_run" (race_run,
trial_run, worker_run), each change a new line: the latest line of a job stands."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ilr_search.storage.store import (
    CurvePoint,
    PruningRecord,
    Run,
    RunJob,
    RunKind,
    Store,
    StoredFrontPoint,
    TrainCurvePoint,
    claimed_run,
    run_held,
)

LEDGER_LINE = "ledger"  # the line saying a study's trials were imported into their runs (study_import.import_journal)
CLAIMED_KINDS: tuple[RunKind, ...] = ("race", "trial", "worker")  # the runs claimed by a worker (claim_run)
# A claimed run's every change is a new line, its heartbeats too (every few seconds a worker, for as long as a study
# runs), and every read parses the whole file. Once lines that a later line of the same run supersedes number
# COMPACT_AFTER and half the file, the file is rewritten with the latest line of each run: its size follows its
# records, not the hours its workers beat.
COMPACT_AFTER = 1000


@contextmanager
def flocked(lock_path: str | Path) -> Iterator[None]:
    """An exclusive flock on the file `lock_path` (created where missing) while the block runs; the kernel releases
    it when its holder dies."""
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, in file order; none where it does not exist."""
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_records(path: Path, records: list[dict[str, Any]], mode: str) -> None:
    """Write `records` as JSON lines to `path`, opened in `mode` ("a" appends, "w" replaces), synced to disk."""
    with open(path, mode, encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.flush()
        os.fsync(f.fileno())


def superseded_lines(records: list[dict[str, Any]]) -> set[int]:
    """The indices of the claimed-run lines (any study's) that a later line of the same run replaces."""
    latest: dict[tuple[Any, ...], int] = {}
    superseded: set[int] = set()
    for i, r in enumerate(records):
        if r.get("kind") in {f"{kind}_run" for kind in CLAIMED_KINDS}:
            key = (r["study"], r["kind"], r["factor"], r["seed"], r["map_key"])
            if key in latest:
                superseded.add(latest[key])
            latest[key] = i
    return superseded


def compact(path: Path, records: list[dict[str, Any]], superseded: set[int]) -> None:
    """Replace the side file at `path` by `records` less the `superseded` lines, in their order: written beside it
    and renamed over it, so that a crash leaves the old file or the new one whole. Called under the file's lock."""
    fresh = path.with_name(path.name + ".compact")
    write_records(fresh, [r for i, r in enumerate(records) if i not in superseded], "w")
    os.replace(fresh, path)


class JournalStore(Store):
    """For journal storage: a JSON-lines side file next to the journal, serialised by an flock."""

    def __init__(self, journal_path: str, study: str) -> None:
        self.path = Path(journal_path + ".ilr")
        self.study = study
        self.compact_after = COMPACT_AFTER

    @contextmanager
    def _locked(self) -> Iterator[list[dict[str, Any]]]:
        with flocked(str(self.path) + ".lock"):
            yield read_records(self.path)

    def _append(self, record: dict[str, Any]) -> None:
        write_records(self.path, [{"study": self.study, **record}], "a")

    def _mine(self, records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        return [r for r in records if r["study"] == self.study and r["kind"] == kind]

    def holds_records(self) -> bool:
        if not self.path.exists():
            return False
        with self._locked() as records:
            return any(r["study"] == self.study and r["kind"] != LEDGER_LINE for r in records)

    def add_curve_point(self, point: CurvePoint, tokens: int) -> None:
        with self._locked():
            self._append({"kind": "curve", **dataclasses.asdict(point), "tokens": tokens})

    def curve_points(self, step: int | None = None) -> list[CurvePoint]:
        with self._locked() as records:
            latest = {(r["trial_number"], r["step"]): r for r in self._mine(records, "curve")}
        return [
            CurvePoint(r["trial_number"], r["step"], r["val_loss"], r["flops_ratio"], r["map_key"], r.get("tokens", 0))
            for key, r in sorted(latest.items())
            if step is None or r["step"] == step
        ]

    def add_train_curve(self, points: list[TrainCurvePoint]) -> None:
        if not points:
            return
        with self._locked():
            self._append(
                {
                    "kind": "train_curve",
                    "points": [[p.trial_number, p.step, p.tokens, p.loss, p.map_key] for p in points],
                }
            )

    def train_curve_points(self) -> list[TrainCurvePoint]:
        with self._locked() as records:
            latest = {
                (p[0], p[1]): TrainCurvePoint(*p) for r in self._mine(records, "train_curve") for p in r["points"]
            }
        return [latest[k] for k in sorted(latest)]

    def record_pruning(
        self, trial_number: int, step: int, val_loss: float, flops_ratio: float, dominated_by: list[int], reason: str
    ) -> None:
        with self._locked():
            self._append(
                {
                    "kind": "pruning",
                    "trial_number": trial_number,
                    "step": step,
                    "val_loss": val_loss,
                    "flops_ratio": flops_ratio,
                    "dominated_by": dominated_by,
                    "reason": reason,
                }
            )

    def pruning_records(self) -> dict[int, PruningRecord]:
        with self._locked() as records:
            return {
                r["trial_number"]: PruningRecord(
                    r["step"], r["val_loss"], r["flops_ratio"], tuple(r["dominated_by"]), r["reason"]
                )
                for r in self._mine(records, "pruning")
            }

    def save_front(self, n_complete: int, front: list[dict[str, Any]]) -> None:
        with self._locked():
            self._append({"kind": "front", "n_complete": n_complete, "front": front})

    def front_history(self) -> dict[int, list[StoredFrontPoint]]:
        with self._locked() as records:
            return {
                r["n_complete"]: [StoredFrontPoint.from_record(p) for p in r["front"]]
                for r in self._mine(records, "front")
            }

    def _runs_latest(self, records: list[dict[str, Any]], kind: RunKind) -> dict[tuple[str, int, str], dict[str, Any]]:
        latest: dict[tuple[str, int, str], dict[str, Any]] = {}
        for r in self._mine(records, f"{kind}_run"):  # in file order, so the latest line wins
            latest[(r["factor"], r["seed"], r["map_key"])] = r
        return latest

    def claim_run(
        self, kind: RunKind, job: RunJob, worker: str, flops_ratio: float, steps: int, stale_after: float
    ) -> bool:
        now = time.time()
        with self._locked() as records:
            row = self._runs_latest(records, kind).get((job.factor, job.seed, job.map_key))
            if row is not None and run_held(row, worker, now, stale_after):
                return False
            self._append({"kind": f"{kind}_run", **claimed_run(job, worker, now, flops_ratio, steps)})
            return True

    def _run_update(self, kind: RunKind, job: RunJob, worker: str, running: bool, **values: Any) -> bool:
        with self._locked() as records:
            row = self._runs_latest(records, kind).get((job.factor, job.seed, job.map_key))
            if row is None or row["worker"] != worker or running and row["state"] != "running":
                return False
            line = {"study": self.study, **row, **values}
            write_records(self.path, [line], "a")
            superseded = superseded_lines([*records, line])
            if len(superseded) >= self.compact_after and 2 * len(superseded) >= len(records) + 1:
                compact(self.path, [*records, line], superseded)
            return True

    def beat_run(self, kind: RunKind, job: RunJob, worker: str) -> None:
        self._run_update(kind, job, worker, True, heartbeat=time.time())

    def _finish_run(self, kind: RunKind, job: RunJob, worker: str, result: dict[str, Any]) -> bool:
        return self._run_update(kind, job, worker, False, heartbeat=time.time(), **result)

    def save_reference(self, run: Run) -> None:
        with self._locked():
            self._append({**run.to_record(), "kind": "reference"})

    def runs(self) -> list[Run]:
        with self._locked() as records:
            claimed = {kind: self._runs_latest(records, kind) for kind in CLAIMED_KINDS}
            references = {r["name"]: r for r in self._mine(records, "reference")}  # a name keeps its first place
        return (
            [Run.from_record(r) for _, r in sorted(claimed["race"].items())]
            + [Run.from_record(r, "reference") for r in references.values()]
            + [Run.from_record(r, kind) for kind in CLAIMED_KINDS[1:] for _, r in sorted(claimed[kind].items())]
        )
