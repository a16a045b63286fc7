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
import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import optuna

from ilr_search.commands.autofuse import check_memory
from ilr_search.commands.layout import process_threads
from ilr_search.errors import UserInputError
from ilr_search.interrupts import recorded
from ilr_search.search.progress import Event, Message, RunReporter
from ilr_search.search.race import MayStart, RaceRunner, race_checkpoints, run_race
from ilr_search.search.run import RunRequest, disk_full_is_reported, prepare_study, run_in_process
from ilr_search.search.studies import StudyReport
from ilr_search.training.device import resolve_device


class QueueReporter(RunReporter):
    """A worker's reporter: each event goes to the parent's queue (pickled as it is: the queue is its one
    serialisation) with the worker's number, and the parent hands it to its own reporter (`_relay`)."""

    def __init__(self, events: Any, worker: int) -> None:
        self.events, self.worker = events, worker

    def on(self, event: Event) -> None:
        self.events.put(dataclasses.replace(event, worker=self.worker))


def stop_with_parent(interval: float = 0.5) -> None:
    """Interrupt this worker process (as Ctrl-C would: its run is freed, finished results stay) once the process that
    started it is gone, killed with -9 say, instead of training on as an orphan. A process started with SIGINT
    ignored (a run started as a background job, or under nohup) would ignore that signal too, so the worker takes
    Python's own handler first: its SIGINT is always a KeyboardInterrupt."""
    import threading

    signal.signal(signal.SIGINT, signal.default_int_handler)
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGINT)
                return

    threading.Thread(target=watch, name="ilr-search parent watch", daemon=True).start()


def worker_process(
    work: Callable[[RunReporter], int], worker: int, threads: int | None, events: Any, optuna_verbosity: int
) -> NoReturn:
    """A worker process around its `work`: Optuna logs as in the process that started it, the worker stops with
    its parent, trains on `threads` torch threads (None: torch's own count), and sends its events to the parent's
    queue; it exits with work's code, 130 on Ctrl-C, and 2 on bad input (its error line sent as a message)."""
    import torch

    optuna.logging.set_verbosity(optuna_verbosity)
    stop_with_parent()
    if threads is not None:
        torch.set_num_threads(threads)
    reporter = QueueReporter(events, worker)
    try:
        with recorded():
            code = work(reporter)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except UserInputError as e:
        reporter.on(Message(f"error: {e}"))
        raise SystemExit(2) from e
    raise SystemExit(code)


def run_processes(
    target: Callable[..., None],
    request: RunRequest,
    workers: int,
    threads: int | None,
    reporter: RunReporter,
    label: str,
    unit: str,
) -> tuple[list[int | None], bool]:
    """Start `workers` spawned processes (CUDA cannot be forked) of target(request, k, workers, threads, events,
    Optuna's verbosity), named `ilr-search {label} k`, and relay their events to `reporter` until every one has
    ended; a Ctrl-C here is passed on to those still running, which are waited for. A worker that ended otherwise
    (neither done nor interrupted) is reported: its unfinished `unit` is retried. Returns the exit codes, and
    whether the run was interrupted (that Ctrl-C, or a worker that exited 130)."""
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    verbosity = optuna.logging.get_verbosity()  # a spawned process starts at Optuna's default
    procs = [
        ctx.Process(
            target=target, args=(request, k, workers, threads, events, verbosity), name=f"ilr-search {label} {k}"
        )
        for k in range(workers)
    ]
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
    for k, code in enumerate(codes):
        if code not in (0, 130):
            reporter.on(Message(f"{label} {k} ended with exit code {code}; its unfinished {unit} is retried"))
    return codes, interrupted or any(c == 130 for c in codes)


def _worker_main(
    request: RunRequest, worker: int, workers: int, threads: int | None, events: Any, optuna_verbosity: int
) -> None:
    """One worker process: the study's trials until it has n_trials, then its share of the reference runs; Optuna
    logs as in the process that started it."""
    race = partial(run_race, workers=workers)  # each wave of the race shared out among the workers

    def work(reporter: RunReporter) -> int:
        summary = run_in_process(request, reporter, reference_share=(worker, workers), race_runner=race)
        return 130 if summary.interrupted else 0

    # on a CPU the usable cores are shared out, not oversubscribed
    threads = threads if threads is not None else process_threads(request.space, workers)
    worker_process(work, worker, threads, events, optuna_verbosity)


def run_workers(request: RunRequest, workers: int, reporter: Any, threads: int | None = None) -> StudyReport:
    """Run the study `request` asks for with `workers` processes, each training up to request.trials_fuse maps at once
    in its own fused groups, with `threads` torch threads on a CPU (None: the usable cores shared out evenly);
    returns the study's report (with per-worker exit codes)."""
    if workers < 1:
        raise UserInputError(f"--workers must be at least 1, got {workers}")
    with disk_full_is_reported():
        prepared = prepare_study(request)
    plan = prepared.plan
    check_memory(plan, workers, request.trials_fuse)
    if workers > 1 and resolve_device(plan.space.train.device).type == "cuda":
        reporter.on(
            Message(
                f"{workers} worker processes share one GPU by time-slicing; on an H200 at the paper-small "
                "proxy they gave no more trials per hour than one (docs/gpu.md)"
            )
        )
    # Workers resume the study by name: a derived name is fixed here, so that none derives another; n_trials
    # includes the trials of the maps enqueued here, which the workers find in the study (not enqueued again).
    request = dataclasses.replace(request, study_name=plan.name, n_trials=prepared.n_trials, enqueue_maps=())
    codes, interrupted = run_processes(_worker_main, request, workers, threads, reporter, "worker", "trial")
    if interrupted:
        from ilr_search.search.studies import summarize_stored

        summary = dataclasses.replace(summarize_stored(request.storage, plan.name), interrupted=True)
    else:  # what a dead worker left undone, and the references still missing (the best map may have changed)
        summary = run_in_process(request, reporter)
    return dataclasses.replace(summary, workers=tuple(enumerate(codes)))


def _race_worker_main(
    request: RunRequest, worker: int, workers: int, threads: int, events: Any, optuna_verbosity: int
) -> None:
    """One race worker process: the study as the parent left it (trials and references done), and its share of
    each wave of the race, on `threads` torch threads; Optuna logs as in the process that started it."""
    from ilr_search.search.run import safe_name
    from ilr_search.storage import open_store, study_storage

    def work(reporter: RunReporter) -> int:
        with disk_full_is_reported():
            prepared = prepare_study(request)
            plan, study = prepared.plan, prepared.study
            store = open_store(prepared.spec, plan.name, storage=study_storage(study))
            folder = race_checkpoints(request.checkpoints / safe_name(plan.name))
            deadline = request.deadline  # the invocation's time budget, read against this process's clock
            run_race(
                plan,
                study,
                store,
                prepared.data,
                reporter,
                folder,
                request.trials_fuse,
                plan.space.search.max_race_steps,
                None if deadline is None else lambda: not deadline.spent(),
                workers=workers,
            )
        return 0

    worker_process(work, worker, threads, events, optuna_verbosity)


def race_in_workers(request: RunRequest, workers: int, threads: int = 1) -> RaceRunner:
    """A race runner that trains the race in `workers` processes of `threads` torch threads each (on a CPU, one
    process a core trains faster than one process on every core), sharing each wave through the race's claims;
    whatever they leave (a killed worker's run) is trained by the calling process afterwards. A race with nothing
    to train (off, done, or only runs that exist) starts no process."""

    def runner(
        plan: Any,
        study: Any,
        store: Any,
        data: Any,
        reporter: RunReporter,
        folder: Path,
        fuse: int,
        max_steps: int,
        may_start: MayStart | None = None,
    ) -> None:
        from ilr_search.search.race import open_race_jobs

        if open_race_jobs(study, store, max_steps)[0] and (may_start is None or may_start()):
            asked = dataclasses.replace(request, study_name=plan.name, enqueue_maps=())
            codes, interrupted = run_processes(
                _race_worker_main, asked, workers, threads, reporter, "race worker", "run"
            )
            if interrupted:
                raise KeyboardInterrupt
        run_race(plan, study, store, data, reporter, folder, fuse, max_steps, may_start)  # what a dead worker left

    return runner


def _relay(events: Any, procs: list[Any], reporter: RunReporter) -> None:
    """Forward worker events to the reporter until every worker has ended and its events are shown."""
    while True:
        try:
            event: Event = events.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                return
            continue
        reporter.on(event)
