"""What a command shows on stderr while it works: progress bars (a training's steps; a run's study, training and race
rows with an ETA from the times it measured) and a line per event of the run (search/progress.py)."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ilr_search.cli.ui import FRONT_COLUMNS, cell_value, err, fmt, release_notes, with_knobs_column
from ilr_search.commands import events
from ilr_search.commands.events import Replicates


class LazyProgress(Progress):
    """Progress bars that start drawing at their first task added or updated: a command that fails before any
    work prints its `error:` line with no blank line before it (a started Progress leaves one on stop)."""

    _wanted = False

    def start(self) -> None:
        self._wanted = True

    def _draw(self) -> None:
        if self._wanted and not self.live.is_started:
            release_notes()
            super().start()

    def add_task(self, *args: Any, **kwargs: Any) -> Any:
        self._draw()
        return super().add_task(*args, **kwargs)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._draw()
        super().update(*args, **kwargs)

    def stop(self) -> None:
        self._wanted = False
        if self.live.is_started:
            super().stop()


def bars(info: str, **options: Any) -> LazyProgress:
    """Progress bars on stderr, each a line: what it does, its bar, done of total, `info` (a template of its task's
    fields), the time it took and the time it has left (EtaColumn); `options` as Progress takes them."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(info))
    return LazyProgress(*columns, TimeElapsedColumn(), TextColumn("eta"), EtaColumn(), console=err, **options)


@contextmanager
def step_progress(enabled: bool = True, total: int | None = None, description: str = "train") -> Iterator[Any]:
    """A progress bar of training steps with the loss and an ETA; yields an on_step(step, loss) callback."""
    if not enabled:
        yield None
        return
    progress = bars("loss {task.fields[loss]}", transient=True)
    task = progress.add_task(description, total=total, loss="-")

    def on_step(step: int, steps: int, loss: float) -> None:
        progress.update(task, completed=step, total=steps, loss=f"{loss:.3f}")

    with progress:
        yield on_step


@dataclass
class StudyEta:
    """The time a run has left, from what it measured: from the first trial on (its progress counts before it
    ends), each trial or reference run left costs the mean time of those this run did so far."""

    started: float  # when the run began (a monotonic clock)

    def seconds_left(self, now: float, runs_done: int, current_fraction: float, runs_left: int) -> float | None:
        """Seconds left at `now`: `runs_done` trials (and reference runs) finished in this run, the one training
        `current_fraction` through, `runs_left` still to finish (the one training included). None until some
        work is measured."""
        done = runs_done + current_fraction
        if done <= 0:
            return None
        return max(0.0, (runs_left - current_fraction) * (now - self.started) / done)


class EtaColumn(TimeRemainingColumn):
    """Rich's remaining time, or the task's own estimate where it has one (the study row: from measured trial
    times, which rich's 30-second speed window cannot give when a trial takes longer)."""

    def render(self, task: Any) -> Text:
        if "eta" not in task.fields:
            return super().render(task)
        seconds = task.fields["eta"]
        if seconds is None:
            return Text("-:--:--", style="progress.remaining")
        minutes, secs = divmod(int(round(seconds)), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{hours}:{minutes:02d}:{secs:02d}", style="progress.remaining")


class ConsoleReporter(events.RunReporter):
    """A run's events on stderr (search/progress.py), for a run in this process or in worker processes alike: the
    study's row (its trials, then its reference runs, then its race, with an ETA from the times it measured), a
    training row a process (the run's own, or one per worker: what it trains, its steps and loss), and a line per
    trial finished (the front after it, when it changed), per race run, per message; lines from a worker process
    say which."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.progress = bars("{task.fields[info]}", disable=not enabled)
        self.study_task = None
        self.rows: dict[int | None, Any] = {}  # worker -> its training row
        self.eta: StudyEta | None = None
        self.n_trials = self.finished_at_start = self.finished = 0
        self.references: tuple[int, int] | None = None  # (index, count) of the reference run training
        self.runs_done: int | None = None  # race (or audit) runs stored, once the race started
        self.printed_front: list[Any] | None = None  # the trials of the front last printed
        self.words = Replicates()  # the study's words, chosen at its StudyStarted

    def __enter__(self) -> ConsoleReporter:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    @functools.singledispatchmethod
    def on(self, event: events.Event) -> None:
        """Draw one event: each event type has its own method below, registered by its annotation (a test checks
        that every event of search/progress.py has one)."""
        raise TypeError(f"no renderer for {type(event).__name__}")

    def print(self, event: events.Event, text: str) -> None:
        release_notes()
        if self.enabled:
            self.progress.console.print(("" if event.worker is None else f"worker {event.worker}: ") + text)

    def _row(self, worker: int | None, label: str, steps: int) -> None:
        """The process's training row, now training `label` for `steps` steps."""
        task = self.rows.get(worker)
        if task is None:
            self.rows[worker] = self.progress.add_task(
                "train" if worker is None else f"worker {worker}", total=steps, info=label
            )
        else:
            self.progress.update(task, completed=0, total=steps, info=label)

    @on.register
    def _study_started(self, event: events.StudyStarted) -> None:
        self.words = event.words
        if self.study_task is not None:  # the workers' studies: the first one says it
            return
        self.print(
            dataclasses.replace(event, worker=None),
            f"study {event.study}: {event.finished} of {event.n_trials} {self.words.finished}",
        )
        self.study_task = self.progress.add_task(
            "study", total=event.n_trials, completed=event.finished, info=self.words.maps, eta=None
        )
        self.eta = StudyEta(time.monotonic())
        self.n_trials, self.finished_at_start, self.finished = event.n_trials, event.finished, event.finished

    @on.register
    def _trial_started(self, event: events.TrialStarted) -> None:
        named = self.words.named(event.map or fmt(event.reuse_map)) + (f" with {event.knobs}" if event.knobs else "")
        label = f"trial {event.number} {named}"
        if event.worker is None:
            self.print(event, f"trial {event.number}: {self.words.doing(named)}")
        self._row(event.worker, label, event.steps)

    @on.register
    def _reference_started(self, event: events.ReferenceStarted) -> None:
        """The study row counts the reference runs after the trials (its timer runs on)."""
        if self.study_task is not None and event.worker is None:
            self.progress.update(
                self.study_task,
                total=self.n_trials + event.count,
                completed=self.n_trials + event.index,
                info="references",
            )
            self.references = (event.index, event.count)
        self._row(event.worker, f"reference {event.name}", event.steps)

    @on.register
    def _reference_finished(self, event: events.ReferenceFinished) -> None:
        if self.study_task is not None and self.references is not None and event.worker is None:
            last = self.references[0] + 1 == self.references[1]
            self.progress.update(
                self.study_task, completed=self.n_trials + self.references[0] + 1, **({"eta": 0.0} if last else {})
            )

    @on.register
    def _runs_started(self, event: events.RunsStarted) -> None:
        """Race (or audit) runs: the study row becomes the race's (runs stored so far; how many it will take is the
        race's to decide), and the training row the runs'."""
        if self.runs_done is None:
            self.runs_done = 0
            if self.study_task is not None and event.kind == "race":
                self.progress.update(
                    self.study_task, description="race", total=None, completed=0, info="race runs stored: 0", eta=None
                )
        runs = "; ".join(f"{self.words.named(key)} {self.words.where(steps, seed)}" for key, steps, seed in event.runs)
        self.print(
            event,
            f"{event.kind} run{'s' if len(event.runs) > 1 else ''}: {runs}"
            + (f" (fused, {len(event.runs)} at once)" if len(event.runs) > 1 else ""),
        )
        key, steps, seed = event.runs[0]
        more = f" and {len(event.runs) - 1} more" if len(event.runs) > 1 else ""
        self._row(event.worker, f"{event.kind} run {self.words.named(key)} {self.words.unit} {seed}{more}", steps)

    @on.register
    def _run_finished(self, event: events.RunFinished) -> None:
        self.runs_done = (self.runs_done or 0) + 1
        if self.study_task is not None and event.kind == "race":
            self.progress.update(self.study_task, info=f"race runs stored: {self.runs_done}")
        elif self.study_task is not None:  # the audit: its row counts its runs
            self.progress.update(self.study_task, advance=1)
        self.print(
            event,
            f"{event.kind} run done: {self.words.named(event.map_key)} "
            f"{self.words.where(event.steps, event.seed)}: "
            f"{self.words.score(event.val_ppl)}",
        )

    @on.register
    def _step(self, event: events.Step) -> None:
        task = self.rows.get(event.worker)
        if task is not None:
            info = self.progress.tasks[task].fields["info"].split(" loss ")[0]
            self.progress.update(task, completed=event.step, total=event.steps, info=f"{info} loss {event.loss:.3f}")
        if self.study_task is not None and self.eta is not None and event.worker is None and self.runs_done is None:
            trials_done = max(0, min(self.finished, self.n_trials) - self.finished_at_start)
            if self.references is None:
                done, left = trials_done, max(1, self.n_trials - self.finished)
            else:
                done, left = trials_done + self.references[0], self.references[1] - self.references[0]
            fraction = event.step / event.steps if event.steps else 0.0
            self.progress.update(self.study_task, eta=self.eta.seconds_left(time.monotonic(), done, fraction, left))

    @on.register
    def _trial_finished(self, event: events.TrialFinished) -> None:
        t, front = event.trial, event.front
        self.finished = event.finished
        if self.study_task is not None and self.runs_done is None:
            self.progress.update(self.study_task, completed=event.finished)
        knobs = events.format_knobs(t.knobs) if t.knobs else ""
        reuse_map = list(t.reuse_map) if t.reuse_map is not None else None
        named = self.words.named(events.map_text(t.map_key)) if t.map_key else f"map {fmt(reuse_map)}"
        self.print(
            event,
            f"trial {t.number} {t.state.name.lower()}: {named}"
            + (f" with {knobs}" if knobs else "")
            + f", {fmt(t.flops_ratio)}x, "
            f"{self.words.score(t.val_ppl)}"
            + (f" (reused trial {t.reused_from})" if t.reused_from is not None else "")
            + (f" ({t.reason})" if t.state.name != "COMPLETE" and t.reason else ""),
        )
        front_trials = [p.trial for p in front]
        live = self.words.trains  # a frozen study's chunk 0 ranks the maps for the race: its front decides nothing
        if not live or not self.enabled or not front or front_trials == self.printed_front:  # only when it changed
            return
        self.printed_front = front_trials
        table = Table(title="current front", title_justify="left")
        rows = [p.to_dict() for p in front]  # a table's cells by column name
        columns = with_knobs_column(FRONT_COLUMNS, rows)
        for col in columns:
            table.add_column(col)
        for p in rows:
            table.add_row(*(fmt(cell_value(p, c)) for c in columns))
        self.progress.console.print(table)

    @on.register
    def _message(self, event: events.Message) -> None:
        self.print(event, event.text)
