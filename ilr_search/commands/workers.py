"""`run --workers N`: N worker processes on one study and one device, with per-worker progress.

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
from dataclasses import dataclass
from typing import Any

import multiprocessing as mp
import queue

from ilr_search.commands.autofuse import check_memory
from ilr_search.config import SpaceConfig
from ilr_search.errors import UserInputError
from ilr_search.search.progress import RunReporter
from ilr_search.search.run import disk_full_is_reported, prepare_study, run_study
from ilr_search.training.device import resolve_device


@dataclass(frozen=True)
class RunArgs:
    """What every worker passes to `run_study`: the same study, the same settings."""
    space: SpaceConfig
    budget: str
    study_name: str | None
    storage: str | None
    n_trials: int | None
    timeout: float | None
    sampler: str | None
    pruner: str | None
    enqueue_maps: tuple[tuple[int, ...], ...] = ()  # tried first (the parent enqueues them)
    fuse: int = 1  # maps each worker trains at once in its own fused group (search/fused_trials.py)
    threads: int | None = None  # torch threads per worker on a CPU; None: the cores shared out evenly


class QueueReporter(RunReporter):
    """A worker's events, sent to the parent's display."""

    def __init__(self, events: Any, worker: int) -> None:
        self.events, self.worker = events, worker

    def study_started(self, study: str, target: int, finished: int) -> None:
        self.events.put(("study_started", self.worker, study, target, finished))

    def trial_started(self, number: int, reuse_map: list[int], steps: int, knobs: str = "") -> None:
        self.events.put(("trial_started", self.worker, number, reuse_map, steps, knobs))

    def step(self, step: int, steps: int, loss: float) -> None:
        self.events.put(("step", self.worker, step, steps, loss))

    def trial_finished(self, row: dict[str, Any], front: list[dict[str, Any]], finished: int) -> None:
        self.events.put(("trial_finished", self.worker, row, front, finished))

    def reference_started(self, name: str, index: int, count: int, steps: int) -> None:
        self.events.put(("reference_started", self.worker, name, index, count, steps))

    def reference_finished(self, name: str) -> None:
        self.events.put(("reference_finished", self.worker, name))

    def message(self, text: str) -> None:
        self.events.put(("message", self.worker, text))


def _worker_main(args: RunArgs, worker: int, workers: int, events: Any) -> None:
    """One worker process: the study's trials until it has n_trials, then its share of the reference runs."""
    import torch

    if resolve_device(args.space.train.device).type == "cpu":  # the cores are shared out, not oversubscribed
        torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // workers))
    reporter = QueueReporter(events, worker)
    try:
        summary = run_study(args.space, args.budget, args.study_name, args.storage, args.n_trials, args.timeout,
                            args.sampler, args.pruner, reporter, reference_share=(worker, workers), fuse=args.fuse)
    except KeyboardInterrupt:
        raise SystemExit(130)
    except UserInputError as e:
        reporter.message(f"error: {e}")
        raise SystemExit(2)
    raise SystemExit(130 if summary.get("interrupted") else 0)


def run_workers(args: RunArgs, workers: int, reporter: Any) -> dict[str, Any]:
    """Run the study with `workers` processes; returns the `run --json` summary (with per-worker exit codes)."""
    if workers < 1:
        raise UserInputError(f"--workers must be at least 1, got {workers}")
    with disk_full_is_reported():
        prepared = prepare_study(args.space, args.budget, args.study_name, args.storage, args.n_trials,
                                 args.timeout, args.sampler, args.pruner, [list(m) for m in args.enqueue_maps])
    plan = prepared.plan
    check_memory(plan, workers, args.fuse)
    if workers > 1 and resolve_device(plan.space.train.device).type == "cuda":
        reporter.message(f"{workers} worker processes share one GPU by time-slicing; on an H200 at the paper-small "
                         "proxy they gave no more trials per hour than one (README, 'On a GPU')")
    # Workers resume the study by name: a derived name is fixed here, so that none derives another.
    args = dataclasses.replace(args, study_name=plan.name, n_trials=prepared.target)  # the enqueued maps' too
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(args, k, workers, events), name=f"ilr-search worker {k}")
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

        summary = summarize_stored(args.storage, plan.name)
        summary["interrupted"] = True
    else:  # what a dead worker left undone, and the references still missing (the best map may have changed)
        summary = run_study(args.space, args.budget, plan.name, args.storage, args.n_trials, args.timeout,
                            args.sampler, args.pruner, reporter, fuse=args.fuse)
    summary["workers"] = [{"worker": k, "exit_code": code} for k, code in enumerate(codes)]
    return summary


def _relay(events: Any, procs: list[Any], reporter: Any) -> None:
    """Forward worker events to the reporter until every worker has ended and its events are shown."""
    while True:
        try:
            kind, worker, *rest = events.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                return
            continue
        getattr(reporter, f"worker_{kind}")(worker, *rest)
