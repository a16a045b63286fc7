"""`run --track tensorboard:DIR | mlflow:URI`: each finished trial (its validation curve, map, knobs and final
values) and, at the end, each reference run, logged with the tracker's own client: TensorBoard's SummaryWriter
(one run per trial under DIR/STUDY/) or MLflow's MlflowClient (one experiment per study, one run per trial).

The tracker sits beside the run's reporter: it sees what the reporter is told when a trial finishes and reads
the trial's curve from the study's store (the one place curves live), so the search itself is unchanged."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ilr_search.errors import UserInputError
from ilr_search.knobs import format_knobs
from ilr_search.search.progress import Event, RunReporter, StudyStarted, TrialFinished
from ilr_search.training.schedule import format_reuse_map, map_text

if TYPE_CHECKING:
    from ilr_search.storage import Run
    from ilr_search.storage.trials import TrialRecord

TRACKERS = ("tensorboard", "mlflow")


@dataclass(frozen=True)
class TrackSpec:
    kind: str  # tensorboard | mlflow
    target: str  # a folder (tensorboard) or a tracking URI (mlflow)


def parse_track(text: str, open_uri: bool = True) -> TrackSpec:
    """`tensorboard:DIR` or `mlflow:URI`; the tracker's package must be importable and, with `open_uri`, an
    MLflow tracking URI must open (checked before any work; a dry run opens nothing)."""
    kind, sep, target = text.partition(":")
    if kind not in TRACKERS or not sep or not target:
        raise UserInputError(f"--track {text!r}: use tensorboard:DIR or mlflow:URI (e.g. mlflow:file:./mlruns)")
    if kind == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError:
            raise UserInputError("--track tensorboard needs the tensorboard package: pip install tensorboard") from None
        path = Path(target)
        if path.exists() and not path.is_dir():
            raise UserInputError(f"--track tensorboard:{target}: {target!r} is a file; give a folder")
    else:
        try:
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise UserInputError(
                "--track mlflow needs the mlflow package: pip install mlflow-skinny (or use --track tensorboard:DIR)"
            ) from None
        if open_uri:  # the tracking URI is opened now, so that a bad one is refused before the run starts
            try:
                MlflowClient(tracking_uri=target).search_experiments(max_results=1)
            except MlflowException as e:
                raise UserInputError(f"--track mlflow:{target}: {' '.join(str(e.message).split())}") from None
    return TrackSpec(kind, target)


@dataclass(frozen=True)
class TrialLog:
    """What a tracker records of one finished trial or reference run."""

    name: str  # trial-0007, or reference-baseline_seed1
    state: str
    reuse_map: list[int] | None
    knobs: str
    flops_ratio: float | None
    val_ppl: float | None
    val_bpb: float | None
    steps: int
    pruned_at_step: int | None
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    map: str = ""  # the map as its key writes it (parts, a block), where its counts do not say it

    def final_values(self) -> dict[str, float]:
        values = {
            "val_ppl": self.val_ppl,
            "val_bpb": self.val_bpb,
            "flops_ratio": self.flops_ratio,
            "steps": float(self.steps),
        }
        return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}

    def params(self) -> dict[str, str | int]:
        p: dict[str, str | int] = {
            "map": self.map or (format_reuse_map(self.reuse_map) if self.reuse_map else "-"),
            "knobs": self.knobs or "none",
            "state": self.state,
        }
        for i, r in enumerate(self.reuse_map or []):
            p[f"r{i}"] = r
        if self.pruned_at_step is not None:
            p["pruned_at_step"] = self.pruned_at_step
        return p


class Tracker(Protocol):
    def log(self, entry: TrialLog) -> None: ...


class TensorBoardTracker:
    """One SummaryWriter run per trial, DIR/STUDY/trial-0007: curves overlay in TensorBoard's scalars view, and
    the map, knobs and final values are in its hparams view."""

    def __init__(self, folder: Path, study: str) -> None:
        self.root = folder / _safe(study)

    def log(self, entry: TrialLog) -> None:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(self.root / entry.name))
        try:
            for step, loss in entry.curve:
                writer.add_scalar("val_loss", loss, step)
            for name, value in entry.final_values().items():
                writer.add_scalar(f"final/{name}", value, entry.steps)
            writer.add_text("map", f"{entry.params()['map']} (knobs {entry.params()['knobs']}, {entry.state.lower()})")
            final = entry.final_values()
            writer.add_hparams(entry.params(), {f"hparam/{k}": v for k, v in final.items()}, run_name=".")
        finally:
            writer.close()


class MlflowTracker:
    """One MLflow experiment per study and one run per trial (params: map, r0.., knobs; metrics: val_loss by
    step and the final values), through MlflowClient."""

    def __init__(self, uri: str, study: str) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(study)
        self.experiment = found.experiment_id if found is not None else self.client.create_experiment(study)

    def log(self, entry: TrialLog) -> None:
        from mlflow.entities import Metric, Param

        run = self.client.create_run(self.experiment, run_name=entry.name, tags={"state": entry.state})
        metrics = [Metric("val_loss", loss, 0, step) for step, loss in entry.curve]
        metrics += [Metric(k, v, 0, entry.steps) for k, v in entry.final_values().items()]
        self.client.log_batch(
            run.info.run_id, metrics=metrics, params=[Param(k, str(v)) for k, v in entry.params().items()]
        )
        self.client.set_terminated(run.info.run_id, "FINISHED" if entry.state == "COMPLETE" else "KILLED")


def open_tracker(spec: TrackSpec, study: str) -> Tracker:
    if spec.kind == "tensorboard":
        return TensorBoardTracker(Path(spec.target), study)
    return MlflowTracker(spec.target, study)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


class TrackingReporter(RunReporter):
    """A run's reporter that also logs each finished trial, and the reference runs at the end, to a tracker; every
    event goes on to the wrapped reporter."""

    def __init__(self, inner: Any, spec: TrackSpec, storage: str | None) -> None:
        self.inner, self.spec, self.storage = inner, spec, storage
        self.study: str | None = None
        self.tracker: Tracker | None = None
        self.store: Any = None
        self.references_before: dict[str, Run] = {}

    def __enter__(self) -> TrackingReporter:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.tracker is not None:
                self._log_references(self.tracker)
        finally:
            self.inner.__exit__(*exc)

    def on(self, event: Event) -> None:
        self.inner.on(event)
        if isinstance(event, StudyStarted):
            self._open(event.study)
        elif isinstance(event, TrialFinished):
            self._log_trial(event.trial)

    def _open(self, study: str) -> None:
        if self.tracker is None:
            self.study = study
            self.tracker = open_tracker(self.spec, study)
            self.references_before = self._references()

    def _log_trial(self, t: TrialRecord) -> None:
        if self.tracker is None:
            return
        from ilr_search.analysis.results import curve_of, curves_by_trial

        curve = sorted(curve_of(t, curves_by_trial(self._store().curve_points())).items())
        self.tracker.log(
            TrialLog(
                f"trial-{t.number:04d}",
                t.state.name,
                list(t.reuse_map) if t.reuse_map is not None else None,
                format_knobs(t.knobs),
                t.flops_ratio,
                t.val_ppl,
                t.val_bpb,
                t.steps,
                t.pruned_at_step,
                curve,
                map_text(t.map_key) if t.map_key else "",
            )
        )

    def _store(self) -> Any:
        from ilr_search.storage import open_store, parse_storage

        if self.store is None:
            self.store = open_store(parse_storage(self.storage), self.study or "", read_only=True)
        return self.store

    def _references(self) -> dict[str, Run]:
        from ilr_search.search.studies import open_study
        from ilr_search.storage import parse_storage, study_references

        spec = parse_storage(self.storage)
        if not spec.exists() or self.study is None:
            return {}
        try:
            return study_references(spec, open_study(spec, self.study))
        except UserInputError:  # not created yet
            return {}

    def _log_references(self, tracker: Tracker) -> None:
        """The reference runs (extra baseline seeds, second seed, block K) this run trained: those stored now
        that were not, or differed, when it started."""
        for name, ref in self._references().items():
            if self.references_before.get(name) == ref:
                continue
            state = "COMPLETE" if ref.status == "ok" else str(ref.status or "").upper()
            tracker.log(
                TrialLog(
                    f"reference-{name}",
                    state,
                    list(ref.reuse_map) if ref.reuse_map is not None else None,
                    format_knobs(ref.knobs),
                    ref.flops_ratio,
                    ref.val_ppl,
                    ref.val_bpb,
                    int(ref.steps or 0),
                    None,
                    list(ref.curve),
                    ref.block_map or "",
                )
            )
