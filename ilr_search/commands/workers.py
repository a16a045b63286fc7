"""`run --workers N`: N worker processes on one study and one device, with per-worker progress. Each trains its
share of the trials, the reference runs and each wave of the race.

The parent prepares the study (checks, tokens, settings, first maps) so that workers only load it, checks
that N proxies fit in the device's memory, starts the workers (spawned: CUDA cannot be forked), shows
their progress, and once they end resumes the study itself: whatever a dead worker left undone and the
reference runs still missing are done there, and the summary is made from the storage. Workers share the
study's storage (SQLite included: short transactions, a 60 s busy timeout); claims keep any two of them from
training one map, and each worker samples from its own stream.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Protocol

import multiprocessing as mp
import queue

from ilr_search.commands.autofuse import check_memory
from ilr_search.errors import UserInputError
from ilr_search.search.progress import RunReporter
from ilr_search.search.race import run_race
from ilr_search.search.run import RunRequest, disk_full_is_reported, prepare_study, run_study
from ilr_search.training.device import resolve_device




class WorkerEventReporter(Protocol):
    """What the parent's reporter shows of its workers (cli/ui.py WorkersReporter, commands/tracking.py)."""

    def worker_study_started(self, worker: int, study: str, target: int, finished: int) -> None: ...
    def worker_trial_started(self, worker: int, number: int, reuse_map: list[int], steps: int, knobs: str = "") -> None: ...
    def worker_step(self, worker: int, step: int, steps: int, loss: float) -> None: ...
    def worker_trial_finished(self, worker: int, row: dict[str, Any], front: list[dict[str, Any]], finished: int) -> None: ...
    def worker_reference_started(self, worker: int, name: str, index: int, count: int, steps: int) -> None: ...
    def worker_reference_finished(self, worker: int, name: str) -> None: ...
    def worker_message(self, worker: int, text: str) -> None: ...


# A worker's events, one dataclass per kind, sent to the parent over a multiprocessing queue (pickled as they
# are: the queue is their one serialisation) and handed to the parent's reporter by `deliver`, which calls the
# reporter's worker_* method of that kind (cli/ui.py WorkersReporter, commands/tracking.py).


@dataclass(frozen=True)
class StudyStarted:
    worker: int
    study: str
    target: int
    finished: int

    def deliver(self, reporter: WorkerEventReporter) -> None:
        reporter.worker_study_started(self.worker, self.study, self.target, self.finished)


@dataclass(frozen=True)
class TrialStarted:
    worker: int
    number: int
    reuse_map: list[int]
    steps: int
    knobs: str = ""

    def deliver(self, reporter: WorkerEventReporter) -> None:
        reporter.worker_trial_started(self.worker, self.number, self.reuse_map, self.steps, self.knobs)


@dataclass(frozen=True)
class Step:
    worker: int
    step: int
    steps: int
    loss: float

    def deliver(self, reporter: WorkerEventReporter) -> None:
        reporter.worker_step(self.worker, self.step, self.steps, self.loss)


@dataclass(frozen=True)
class TrialFinished:
    worker: int
    row: dict[str, Any]
    front: list[dict[str, Any]]
    finished: int

    def deliver(self, reporter: WorkerEventReporter) -> None:
        reporter.worker_trial_finished(self.worker, self.row, self.front, self.finished)


@dataclass(frozen=True)
class ReferenceStarted:
    worker: int
    name: str
    index: int
    count: int
    steps: int

    def deliver(self, reporter: WorkerEventReporter) -> None:
        reporter.worker_reference_started(self.worker, self.name, self.index, self.count, self.steps)


@dataclass(frozen=True)
class ReferenceFinished:
    worker: int
    name: str

    def deliver(self, reporter: WorkerEventReporter) -> None:
        reporter.worker_reference_finished(self.worker, self.name)


@dataclass(frozen=True)
class Message:
    worker: int
    text: str

    def deliver(self, reporter: WorkerEventReporter) -> None:
        reporter.worker_message(self.worker, self.text)


WorkerEvent = StudyStarted | TrialStarted | Step | TrialFinished | ReferenceStarted | ReferenceFinished | Message


class QueueReporter(RunReporter):
    """A worker's reporter: each call becomes its WorkerEvent on the parent's queue."""

    def __init__(self, events: Any, worker: int) -> None:
        self.events, self.worker = events, worker

    def send(self, event: WorkerEvent) -> None:
        self.events.put(event)

    def study_started(self, study: str, target: int, finished: int) -> None:
        self.send(StudyStarted(self.worker, study, target, finished))

    def trial_started(self, number: int, reuse_map: list[int], steps: int, knobs: str = "") -> None:
        self.send(TrialStarted(self.worker, number, list(reuse_map), steps, knobs))

    def step(self, step: int, steps: int, loss: float) -> None:
        self.send(Step(self.worker, step, steps, loss))

    def trial_finished(self, row: dict[str, Any], front: list[dict[str, Any]], finished: int) -> None:
        self.send(TrialFinished(self.worker, row, front, finished))

    def reference_started(self, name: str, index: int, count: int, steps: int) -> None:
        self.send(ReferenceStarted(self.worker, name, index, count, steps))

    def reference_finished(self, name: str) -> None:
        self.send(ReferenceFinished(self.worker, name))

    def message(self, text: str) -> None:
        self.send(Message(self.worker, text))


def stop_with_parent(interval: float = 0.5) -> None:
    """Interrupt this worker process (as Ctrl-C would: its run is freed, finished results stay) once the process that
    started it is gone, killed with -9 say, instead of training on as an orphan."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGINT)
                return

    threading.Thread(target=watch, name="ilr-search parent watch", daemon=True).start()


def _worker_main(request: RunRequest, worker: int, workers: int, threads: int | None, events: Any) -> None:
    """One worker process: the study's trials until it has n_trials, then its share of the reference runs."""
    import torch

    stop_with_parent()
    if resolve_device(request.space.train.device).type == "cpu":  # the cores are shared out, not oversubscribed
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // workers))
    reporter = QueueReporter(events, worker)

    def race(*args: Any) -> object:  # each wave of the race shared out among the workers
        return run_race(*args, workers=workers)

    try:
        summary = run_study(request, reporter, reference_share=(worker, workers), race_runner=race)
    except KeyboardInterrupt:
        raise SystemExit(130)
    except UserInputError as e:
        reporter.message(f"error: {e}")
        raise SystemExit(2)
    raise SystemExit(130 if summary.get("interrupted") else 0)


def run_workers(request: RunRequest, workers: int, reporter: Any, threads: int | None = None) -> dict[str, Any]:
    """Run the study `request` asks for with `workers` processes, each training up to request.fuse maps at once
    in its own fused groups, with `threads` torch threads on a CPU (None: the cores shared out evenly); returns
    the `run --json` summary (with per-worker exit codes)."""
    if workers < 1:
        raise UserInputError(f"--workers must be at least 1, got {workers}")
    with disk_full_is_reported():
        prepared = prepare_study(request)
    plan = prepared.plan
    check_memory(plan, workers, request.fuse)
    if workers > 1 and resolve_device(plan.space.train.device).type == "cuda":
        reporter.message(f"{workers} worker processes share one GPU by time-slicing; on an H200 at the paper-small "
                         "proxy they gave no more trials per hour than one (README, 'On a GPU')")
    # Workers resume the study by name: a derived name is fixed here, so that none derives another; the target
    # includes the trials of the maps enqueued here, which the workers find in the study (not enqueued again).
    request = dataclasses.replace(request, study_name=plan.name, n_trials=prepared.target, enqueue_maps=())
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(request, k, workers, threads, events), name=f"ilr-search worker {k}")
             for k in range(workers)]
    for p in procs:
        p.start()
    interrupted = False
    try:
        _relay(events, procs, reporter)
    except KeyboardInterrupt:  # workers in the same terminal got the SIGINT too; tell the others
        interrupted = True
        for p in procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGINT)
        for p in procs:
            p.join()
    codes = [p.exitcode for p in procs]
    interrupted = interrupted or any(c == 130 for c in codes)
    for k, code in enumerate(codes):
        if code not in (0, 130):
            reporter.message(f"worker {k} ended with exit code {code}; its unfinished trial is retried")
    if interrupted:
        from ilr_search.search.studies import summarize_stored

        summary = summarize_stored(request.storage, plan.name)
        summary["interrupted"] = True
    else:  # what a dead worker left undone, and the references still missing (the best map may have changed)
        summary = run_study(request, reporter)
    summary["workers"] = [{"worker": k, "exit_code": code} for k, code in enumerate(codes)]
    return summary


def _relay(events: Any, procs: list[Any], reporter: Any) -> None:
    """Forward worker events to the reporter until every worker has ended and its events are shown."""
    while True:
        try:
            event: WorkerEvent = events.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                return
            continue
        event.deliver(reporter)
