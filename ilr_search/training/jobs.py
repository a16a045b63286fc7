"""One way to train a list of proxies: `train_jobs` groups the jobs that can train together (one model, one set of
training settings but the seed) into fused groups of at most K (fused.py) and trains the rest one at a time
(train.py), with one progress callback a group. The trials, the reference runs, the race and the audit all train
through it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ilr_search.config import ModelConfig, TrainConfig

if TYPE_CHECKING:  # torch is loaded only to train: grouping jobs (and reading a race) loads none
    from ilr_search.data.tokens import TokenData
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
    """Whether the fused trainer supports this model (some recurrence knobs add parameters or ops it does not)."""
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


def train_jobs(jobs: Sequence[Job], data: TokenData, fuse: int = 1, on_step: OnStep | None = None) -> list[TrainResult]:
    """Train every job (see the module docstring); one TrainResult a job, in their order. `on_step` sees the steps
    of the group training (of its first member)."""
    from ilr_search.training.train import train_proxy

    results: dict[int, TrainResult] = {}
    for members in groups(jobs, fuse):
        first = jobs[members[0]]
        if len(members) == 1:
            results[members[0]] = train_proxy(
                first.model,
                first.schedule,
                data,
                first.train_cfg,
                on_eval=first.on_eval,
                on_step=on_step,
                checkpoint_path=first.checkpoint,
            )
            continue
        from ilr_search.training.fused import train_fused

        fused = train_fused(
            first.model,
            [jobs[i].schedule for i in members],
            data,
            first.train_cfg,
            on_eval=[jobs[i].on_eval for i in members],
            on_step=[on_step] + [None] * (len(members) - 1),
            checkpoint_paths=[jobs[i].checkpoint for i in members],
            seeds=[jobs[i].train_cfg.seed for i in members],
        )
        results.update(zip(members, fused, strict=True))
    return [results[i] for i in range(len(jobs))]
