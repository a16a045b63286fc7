"""One way to train a list of proxies: `train_jobs` groups the jobs that can train together (one model, one set of
training settings but the seed) into fused groups of at most K (fused.py) and trains the rest one at a time
(train.py), with one progress callback a group. The trials, the reference runs, the race and the audit all train
through it.

With `lanes` L > 1 the groups train in L Python threads of one process at once (each at the process's torch
threads: one, on a CPU), a group split in halves where there are fewer groups than lanes. torch's intra-op threads
wait on each other at every operation, which costs little on a quiet machine and a great deal beside other programs;
lanes share no operation (benchmarks/lanes.py measures both). A job's numbers depend only on the jobs it trains
with, never on the lanes' timing: the evaluation callbacks (which may read each other's points, as pruning does) run
one at a time, each at step s once the jobs of the groups before its own have passed step s or ended (`EvalOrder`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ilr_search.config import ModelConfig, TrainConfig

if TYPE_CHECKING:  # torch is loaded only to train: grouping jobs (and reading a race) loads none
    from ilr_search.records import EvalPoint
    from ilr_search.training.frozen import EvalData
    from ilr_search.training.train import OnEval, OnStep, TrainResult


@dataclass(frozen=True)
class Job:
    """One proxy: a model and its schedule, trained with `train_cfg` (its seed included); `on_eval` sees each of
    its evaluations (return True to stop it: pruning); `checkpoint` is where it keeps (and resumes from) its
    state."""

    model: ModelConfig
    schedule: list[int]
    train_cfg: TrainConfig
    on_eval: OnEval | None = None
    checkpoint: Path | None = None


def fusable(model: ModelConfig) -> bool:
    """Whether the fused trainer supports this model (fused.check_fusable)."""
    from ilr_search.training.fused import FusionUnsupported, check_fusable

    try:
        check_fusable(model)
        return True
    except FusionUnsupported:
        return False


def groups(jobs: Sequence[Job], fuse: int) -> list[list[int]]:
    """The jobs' positions in the groups they train in, in order: jobs of one fusable model and one set of training
    settings (the seed apart) in groups of at most `fuse`, each other job (and each frozen one, of no step) alone."""
    out: list[list[int]] = []
    open_groups: dict[tuple[ModelConfig, TrainConfig], list[int]] = {}
    for i, job in enumerate(jobs):
        if fuse <= 1 or not fusable(job.model) or job.train_cfg.steps == 0:  # (a frozen run trains nothing to fuse)
            out.append([i])
            continue
        key = (job.model, dataclasses.replace(job.train_cfg, seed=0))
        group = open_groups.get(key)
        if group is None or len(group) >= fuse:
            group = []
            open_groups[key] = group
            out.append(group)
        group.append(i)
    return out


def lane_units(job_groups: Sequence[Sequence[int]], lanes: int) -> list[list[int]]:
    """The groups to train in `lanes` lanes: the first largest group split into contiguous halves until there are
    `lanes` groups or none has two jobs left."""
    units = [list(g) for g in job_groups]
    while units and len(units) < lanes:
        largest = max(range(len(units)), key=lambda i: len(units[i]))
        if len(units[largest]) < 2:
            break
        group, half = units[largest], (len(units[largest]) + 1) // 2
        units[largest : largest + 1] = [group[:half], group[half:]]
    return units


class LanesStopped(Exception):
    """A lane stops at its next training window: another lane failed, or the run was interrupted."""


class EvalOrder:
    """The evaluation callbacks of jobs training in lanes, called one at a time in an order that does not depend on
    timing: a callback at step s of a job of group u waits until every job of the groups before u has had its
    callback at step s or later, or has ended (within a group the trainer calls them in its own fixed order). So a
    callback sees at its step the points it would see if the groups trained one after another. Each lane trains its
    groups in order, so the first group still training never waits: no deadlock."""

    def __init__(self, units: Sequence[Sequence[int]]) -> None:
        n = sum(len(u) for u in units)
        self._cond = self.callbacks = threading.Condition()  # held while a callback runs
        self._reached = [0] * n
        self._ended = [False] * n
        self._before: list[list[int]] = [[] for _ in range(n)]
        for u, unit in enumerate(units):
            for i in unit:
                self._before[i] = [j for earlier in units[:u] for j in earlier]
        self.stopped = False

    def _may_run(self, i: int, step: int) -> bool:
        return self.stopped or all(self._ended[j] or self._reached[j] >= step for j in self._before[i])

    def ordered(self, i: int, on_eval: OnEval | None) -> OnEval:
        """Job i's callback (`on_eval`, or none), called in the order above."""

        def callback(point: EvalPoint) -> bool:
            with self._cond:
                self._cond.wait_for(lambda: self._may_run(i, point.step))
                if self.stopped:
                    raise LanesStopped
                try:
                    stop = bool(on_eval(point)) if on_eval is not None else False
                finally:
                    self._reached[i] = point.step
                    self._cond.notify_all()
                if stop:
                    self._ended[i] = True
                return stop

        return callback

    def end(self, jobs: Sequence[int]) -> None:
        with self._cond:
            for i in jobs:
                self._ended[i] = True
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


def _train_group(
    jobs: Sequence[Job], members: Sequence[int], data: EvalData, on_step: OnStep | None, fuse: int
) -> list[TrainResult]:
    """One group of jobs trained together; results in `members` order. Where the caller fuses (`fuse` > 1) and the
    model can be, the group trains through the fused trainer even when it is one job: a fused member's numbers do
    not depend on the members beside it, so that a run gives the same numbers in any group it lands in (the race's
    workers claim runs by timing)."""
    from ilr_search.training.train import train_proxy

    first = jobs[members[0]]
    if len(members) == 1 and not (fuse > 1 and fusable(first.model) and first.train_cfg.steps > 0):
        return [
            train_proxy(
                first.model,
                first.schedule,
                data,
                first.train_cfg,
                on_eval=first.on_eval,
                on_step=on_step,
                checkpoint_path=first.checkpoint,
            )
        ]
    from ilr_search.data.tokens import TokenData
    from ilr_search.training.fused import train_fused

    assert isinstance(data, TokenData)  # frozen runs (of task items too) are never fused: groups()
    return train_fused(
        first.model,
        [jobs[i].schedule for i in members],
        data,
        first.train_cfg,
        on_eval=[jobs[i].on_eval for i in members],
        on_step=[on_step] + [None] * (len(members) - 1),
        checkpoint_paths=[jobs[i].checkpoint for i in members],
        seeds=[jobs[i].train_cfg.seed for i in members],
    )


def train_jobs(
    jobs: Sequence[Job], data: EvalData, fuse: int = 1, on_step: OnStep | None = None, lanes: int = 1
) -> list[TrainResult]:
    """Train every job (see the module docstring); one TrainResult a job, in their order. `on_step` sees the steps
    of each group's training (of its first member; in lanes, of the first lane's groups)."""
    job_groups = groups(jobs, fuse)
    units = lane_units(job_groups, lanes)
    if lanes > 1 and len(units) > 1:
        results = _train_in_lanes(jobs, units, data, on_step, lanes, fuse)
    else:
        results = {}
        for members in job_groups:
            results.update(zip(members, _train_group(jobs, members, data, on_step, fuse), strict=True))
    return [results[i] for i in range(len(jobs))]


def _train_in_lanes(
    jobs: Sequence[Job], units: list[list[int]], data: EvalData, on_step: OnStep | None, lanes: int, fuse: int
) -> dict[int, TrainResult]:
    """Train the units in `lanes` threads, unit u in lane u % lanes, each lane its units in order. A failure in one
    lane stops the others at their next training window and is raised here; Ctrl-C (which reaches this thread)
    stops them too before it is raised again."""
    order = EvalOrder(units)
    ordered = [dataclasses.replace(job, on_eval=order.ordered(i, job.on_eval)) for i, job in enumerate(jobs)]
    results: dict[int, TrainResult] = {}
    failures: list[BaseException] = []

    def lane_step(lane: int) -> OnStep:
        def step(s: int, total: int, loss: float) -> None:
            if order.stopped:
                raise LanesStopped
            if lane == 0 and on_step is not None:
                with order.callbacks:  # never beside an evaluation callback: both may report to the run's output
                    on_step(s, total, loss)

        return step

    ended = [threading.Event() for _ in range(lanes)]

    def lane(k: int) -> None:
        try:
            for members in units[k::lanes]:
                try:
                    results.update(zip(members, _train_group(ordered, members, data, lane_step(k), fuse), strict=True))
                except LanesStopped:
                    return
                except BaseException as e:  # raised again in the calling thread
                    failures.append(e)
                    order.stop()
                    return
                finally:
                    order.end(members)
        finally:
            ended[k].set()

    def wait_for_lanes() -> None:
        # Events, not Thread.join: a join that Ctrl-C interrupts can leave its thread seen as ended (CPython
        # 3.11), and lanes must not train on unseen.
        for event in ended:
            event.wait()
        for t in threads:
            t.join()

    threads = [threading.Thread(target=lane, args=(k,), name=f"lane-{k}", daemon=True) for k in range(lanes)]
    for t in threads:
        t.start()
    try:
        wait_for_lanes()
    except BaseException:
        order.stop()
        while True:  # the lanes end within a training window; a second Ctrl-C meanwhile is this one
            try:
                wait_for_lanes()
                break
            except KeyboardInterrupt:
                pass
        raise
    if failures:
        raise failures[0]
    return results
