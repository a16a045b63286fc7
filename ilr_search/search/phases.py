"""Where a run's time went: the wall time, tokens trained (a frozen run's: evaluated) and CPU time of each of its
phases (`run --json`'s `phases`, and a small table at the end of `run`).

The meter watches the run's events as the run's own process sees them (a worker's are relayed to it): a phase
begins when its first run starts, and lasts until another phase's run starts or the run ends. Several worker
processes can be in two phases at once for a moment (one trains the last trial while another starts a reference
run); the time then goes to the phase that started last. Tokens are counted per run finished, in the phase that
run belongs to. CPU time is the run's process and its child processes (the workers), ended ones from
getrusage and running ones from /proc, so that a phase trained in workers counts their CPU.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from dataclasses import dataclass
from typing import Any, Literal

from ilr_search.config import SpaceConfig
from ilr_search.search.progress import (
    Event,
    ReferenceFinished,
    ReferenceStarted,
    RunFinished,
    RunReporter,
    RunsStarted,
    TrialFinished,
    TrialStarted,
)
from ilr_search.training.schedule import Map

Phase = Literal["trials", "references", "screen", "race", "equal_compute"]
PHASES: tuple[Phase, ...] = ("trials", "references", "screen", "race", "equal_compute")


@dataclass(frozen=True)
class PhaseRecord:
    """One phase of a run: its wall time, the tokens its finished runs trained, and the CPU time the run's processes
    spent in it (cpu_percent: of one core, so 200 is two cores busy)."""

    phase: Phase
    wall_seconds: float
    tokens: int
    cpu_seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def cpu_percent(self) -> float:
        return 100.0 * self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "wall_seconds": round(self.wall_seconds, 3),
            "tokens": self.tokens,
            "tokens_per_second": round(self.tokens_per_second, 1),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "cpu_percent": round(self.cpu_percent, 1),
        }


def _live_child_cpu_seconds(pid: int) -> float:
    """User and system CPU time of a running child process (0 where /proc cannot say)."""
    import os

    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_seconds() -> float:
    """CPU time of this process and its child processes so far: ended children (getrusage) and running ones."""
    live = multiprocessing.active_children()  # reaps ended ones first: their time moves into RUSAGE_CHILDREN
    own, ended = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime
    return total + sum(_live_child_cpu_seconds(p.pid) for p in live if p.pid is not None)


class PhaseMeter(RunReporter):
    """A reporter that passes every event on to `inner` and measures the run's phases (finish() returns them)."""

    def __init__(self, inner: RunReporter, space: SpaceConfig) -> None:
        self.inner = inner
        self.tokens_per_step = space.train.batch_size * space.train.grad_accum * space.model.seq_len
        self.screen_seed = space.train.seed if space.search.race_policy == "adaptive" else None
        self.current: Phase | None = None
        self.since, self.cpu_since = 0.0, 0.0
        self.wall: dict[Phase, float] = {}
        self.cpu: dict[Phase, float] = {}
        self.tokens: dict[Phase, int] = {}
        self.reference_steps: dict[tuple[int | None, str], int] = {}

    def race_phase(self, map_key: str, seed: int) -> Phase:
        if Map.form_of(map_key) == "deeper":
            return "equal_compute"
        return "screen" if seed == self.screen_seed else "race"

    def on(self, event: Event) -> None:
        if isinstance(event, TrialStarted):
            self.enter("trials")
        elif isinstance(event, TrialFinished):
            t = event.trial
            if t.steps == 0 and t.tokens_per_second and t.train_seconds and not t.is_reuse:  # frozen: evaluated
                self.tokens["trials"] = self.tokens.get("trials", 0) + round(t.tokens_per_second * t.train_seconds)
            self.add("trials", t.steps)
        elif isinstance(event, ReferenceStarted):
            self.enter("references")
            self.reference_steps[(event.worker, event.name)] = event.steps
        elif isinstance(event, ReferenceFinished):
            self.add("references", self.reference_steps.pop((event.worker, event.name), 0))
        elif isinstance(event, RunsStarted) and event.kind == "race" and event.runs:
            key, _, seed = event.runs[0]
            self.enter(self.race_phase(key, seed))
        elif isinstance(event, RunFinished) and event.kind == "race":
            phase = self.race_phase(event.map_key, event.seed)
            self.add(phase, event.steps)
            if event.steps == 0:  # frozen: the tokens it evaluated
                self.tokens[phase] = self.tokens.get(phase, 0) + event.tokens
        self.inner.on(event)

    def add(self, phase: Phase, steps: int) -> None:
        self.tokens[phase] = self.tokens.get(phase, 0) + steps * self.tokens_per_step

    def enter(self, phase: Phase) -> None:
        if phase == self.current:
            return
        self.close()
        self.current = phase

    def close(self) -> None:
        now, cpu = time.perf_counter(), cpu_seconds()
        if self.current is not None:
            self.wall[self.current] = self.wall.get(self.current, 0.0) + now - self.since
            self.cpu[self.current] = self.cpu.get(self.current, 0.0) + cpu - self.cpu_since
        self.since, self.cpu_since = now, cpu

    def finish(self) -> list[PhaseRecord]:
        """The phases the run went through, in PHASES order (the one in progress ends now)."""
        self.close()
        self.current = None
        return [
            PhaseRecord(p, self.wall.get(p, 0.0), self.tokens.get(p, 0), self.cpu.get(p, 0.0))
            for p in PHASES
            if p in self.wall or p in self.tokens
        ]
