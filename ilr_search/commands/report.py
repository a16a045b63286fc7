"""Reading a finished (or running) study: its front, figures and exports. Behind `pareto` and `export`."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import optuna

from ilr_search.analysis.blocks import MARKS_LINE, BlockGrid, block_grid, block_place
from ilr_search.analysis.fidelity import mark_ties, noise_band
from ilr_search.analysis.page import write_figure_html
from ilr_search.analysis.plots import PlottedTrial, pareto_figure
from ilr_search.analysis.race_report import RaceReport
from ilr_search.analysis.results import (
    CurveRow,
    FrontRow,
    LayerView,
    curve_of,
    curve_rows,
    curves_by_trial,
    knobs_text,
    listed_trials,
    map_text,
    race_run_rows,
    reference_rows,
    study_front,
)
from ilr_search.config import SpaceConfig
from ilr_search.errors import UserInputError
from ilr_search.knobs import KNOB_CHOICES, format_knobs
from ilr_search.records import record_json
from ilr_search.search.plan import CONFIG_ATTR
from ilr_search.search.race_results import decided_front
from ilr_search.search.studies import FrontView, StudyReport, open_study, study_report
from ilr_search.storage import StorageSpec, Store, open_store, parse_storage, study_storage
from ilr_search.storage.trials import TrialRecord, study_trials, trained_results

if TYPE_CHECKING:
    import plotly.graph_objects as go


FRONT_FORMATS = (".html", ".png", ".svg", ".csv", ".json")
EXPORT_FORMATS = (".csv", ".parquet")
IMAGE_WIDTH = 1100  # pixels of a .png/.svg figure (the .html one takes its page's width)


def check_out_path(out: str | Path, formats: tuple[str, ...]) -> Path:
    """Refuse an unknown extension or an unwritable place before any work is done."""
    path = Path(out)
    if path.suffix.lower() not in formats:
        raise UserInputError(
            f"cannot write {str(path)!r}: unknown extension {path.suffix or '(none)'!r}; "
            f"use one of {', '.join(formats)}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UserInputError(f"--out {str(path)!r} is a folder; give a file name")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise UserInputError(f"cannot write {str(path)!r}: {e.strerror or e} in {str(parent)!r}") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise UserInputError(f"cannot write {str(path)!r}: the file is read-only")
    return path


def _atomic_write(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def layer_view(trials: list[TrialRecord], front: Sequence[FrontRow]) -> LayerView:
    """Reuse counts of the `front`'s maps (the decided front: the race's where the study was raced), and the
    importance for perplexity of each layer's count and of each searched knob, from Optuna's evaluator, computed
    on the maps that were trained (not the sampler's proposals, which the budget may have repaired)."""
    evaluated = trained_results(trials)
    importance: dict[str, float] = {}
    if len(evaluated) >= 3 and front:
        n_layers = len(front[0].reuse_map or ())
        maps = {t.number: cast(tuple[int, ...], t.reuse_map) for t in evaluated}  # trained results have their maps
        top = max(max(maps[t.number]) for t in evaluated)
        dist = optuna.distributions.IntDistribution(1, max(2, top))
        importance = _importances(
            evaluated,
            {t.number: {f"layer {i}": r for i, r in enumerate(maps[t.number])} for t in evaluated},
            {f"layer {i}": dist for i in range(n_layers)},
        )
    return LayerView(tuple(front), importance)


BLOCK_IMPORTANCE_TRIALS = 10  # block results a study needs before its block parameters' importances are drawn


def block_importance(trials: list[TrialRecord], n_layers: int) -> dict[str, float]:
    """The importance for perplexity of a block's first layer, last layer and repeat count (and of each searched
    knob), from Optuna's evaluator over the trained block maps (the plain model and maps that are no single block
    left out); empty under BLOCK_IMPORTANCE_TRIALS of them."""
    places = {t.number: block_place(cast(str, t.map_key), n_layers) for t in trained_results(trials)}
    evaluated = [t for t in trained_results(trials) if places[t.number] is not None]
    if len(evaluated) < BLOCK_IMPORTANCE_TRIALS:
        return {}
    layer = optuna.distributions.IntDistribution(0, n_layers - 1)
    top = max(cast(Any, places[t.number]).repeats for t in evaluated)
    params = {
        t.number: {"block start": p.start, "block end": p.end, "block repeats": p.repeats}
        for t in evaluated
        if (p := places[t.number]) is not None
    }
    return _importances(
        evaluated,
        params,
        {
            "block start": layer,
            "block end": layer,
            "block repeats": optuna.distributions.IntDistribution(2, max(3, top)),
        },
    )


def _importances(
    evaluated: list[TrialRecord],
    params: Mapping[int, Mapping[str, Any]],
    distributions: Mapping[str, optuna.distributions.BaseDistribution],
) -> dict[str, float]:
    """Each parameter's importance for perplexity (and each searched knob's), from Optuna's evaluator over a
    study of the `evaluated` trials with `params` (by trial number) in `distributions`; empty where nothing can be
    attributed."""
    knobs = sorted({k for t in evaluated for k in t.knobs})  # a trial without a knob has its default (the first)
    knob_dists = {  # over the settings the trials had (a damping grid is the study's own)
        k: optuna.distributions.CategoricalDistribution(
            sorted({t.knobs[k] for t in evaluated if k in t.knobs} | {KNOB_CHOICES[k][0]}, key=str)
        )
        for k in knobs
    }
    shadow = optuna.create_study()
    for t in evaluated:
        shadow.add_trial(
            optuna.trial.create_trial(
                params=dict(params[t.number]) | {f"knob {k}": t.knobs.get(k, KNOB_CHOICES[k][0]) for k in knobs},
                distributions=dict(distributions) | {f"knob {k}": d for k, d in knob_dists.items()},
                value=t.val_ppl,
            )
        )
    try:
        raw = optuna.importance.get_param_importances(shadow)
    except (ValueError, RuntimeError):  # e.g. every trial has the same map: nothing to attribute
        return {}
    return {name: raw.get(name, 0.0) for name in [*distributions, *(f"knob {k}" for k in knobs)]}


def searched_families(study_attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """The map families the study's trials propose ([search] families; none for a study not made by ilr-search)."""
    config = study_attrs.get(CONFIG_ATTR)
    return tuple(SpaceConfig.from_dict(config).search.families) if config is not None else ()


def study_block_grid(study_attrs: Mapping[str, Any], race: RaceReport | None) -> BlockGrid | None:
    """The block grid (analysis/blocks.py) of a study that searches block maps, from its race's results and
    comparisons; None for a study that does not (or has no race: one not made by ilr-search)."""
    if race is None or "blocks" not in searched_families(study_attrs):
        return None
    n_layers = SpaceConfig.from_dict(study_attrs[CONFIG_ATTR]).model.n_layers
    baseline = ",".join(["1"] * n_layers)
    return block_grid(race.results, race.state.comparisons, n_layers, baseline, race.settings)


@dataclass(frozen=True)
class BlockView:
    """`pareto --view blocks`: the study's pareto report and its block grid. to_json: the report's, with the grid
    under `blocks`."""

    report: StudyReport
    grid: BlockGrid

    @property
    def marks(self) -> str:
        """What the marks of the grid's cells mean."""
        return MARKS_LINE

    def to_json(self) -> dict[str, Any]:
        return self.report.to_json() | {"blocks": self.grid.to_dict()}


def pareto_report(
    study_name: str, storage: str | None = None, out: str | Path | None = None, view: str = "front"
) -> StudyReport:
    """The study's report with its front view (the race's front with noise ties, the proxy's, the stored
    fronts; the layer view where `view` is "layers"), optionally written as .html (interactive, offline),
    .png/.svg (kaleido), .csv or .json."""
    path = _front_path(out)
    drawn = path is not None and path.suffix.lower() in (".html", ".png", ".svg")
    return _pareto(study_name, storage, "layers" if drawn else view, path)[0]


def pareto_blocks(study_name: str, storage: str | None = None, out: str | Path | None = None) -> BlockView:
    """`pareto --view blocks`: the pareto report (the figure or table written to `out` as pareto_report does) and
    the study's block grid; a study that searches no block maps is refused."""
    report, _, grid = _pareto(study_name, storage, "blocks", _front_path(out))
    assert grid is not None  # _pareto refuses a study without one
    return BlockView(report, grid)


def _front_path(out: str | Path | None) -> Path | None:
    """The file a pareto view writes (None: none), checked before any work (an image: kaleido and a browser)."""
    path = check_out_path(out, FRONT_FORMATS) if out is not None else None
    if path is not None and path.suffix.lower() in (".png", ".svg"):
        check_image_export()
    return path


def front_figure(study_name: str, storage: str | None = None) -> go.Figure:
    """The figure `pareto --out FILE.html` (or .png, .svg) writes."""
    return _pareto(study_name, storage, "layers")[1]()


def _opened(study_name: str, storage: str | None) -> tuple[StorageSpec, optuna.Study, Store]:
    """The storage, the study and its store, opened read-only."""
    spec = parse_storage(storage, read_only=True)
    study = open_study(spec, study_name)
    return spec, study, open_store(spec, study_name, read_only=True, storage=study_storage(study))


def _pareto(
    study_name: str, storage: str | None, view: str, out: Path | None = None
) -> tuple[StudyReport, Callable[[], go.Figure], BlockGrid | None]:
    """The pareto report (with the layer view where `view` is "layers" or "blocks", and the file `out` it is written
    to, once it is), what draws its figure, and the block grid of a study that searches block maps (else None; with
    `view` "blocks" such a study is refused before anything is written)."""
    spec, study, store = _opened(study_name, storage)
    report = study_report(study, spec, store)
    trials = study_trials(study, store.runs())
    noise = noise_band(trials, report.references)
    front = mark_ties(study_front(trials), noise)
    race_front = mark_ties(report.front, noise)  # each point at its longest raced length
    decided = race_front if report.race is not None else decided_front(trials, None)  # with its noise ties
    layers = layer_view(trials, decided) if view in ("layers", "blocks") else None
    report = dataclasses.replace(
        report,
        front_view=FrontView(
            tuple(race_front),
            tuple(front),
            noise,
            {str(k): [p.trial for p in v] for k, v in sorted(store.front_history().items())},
            layers,
            str(out) if out is not None else None,
        ),
    )

    grid = study_block_grid(study.user_attrs, report.race)
    if grid is None and view == "blocks":
        raise UserInputError(
            f"study {study_name!r} searches no block maps ([search] families has no 'blocks'): --view blocks "
            "draws the grid of a block search; use --view front or layers"
        )

    def figure() -> go.Figure:
        curves = curves_by_trial(store.curve_points())
        rows = [PlottedTrial.of(t, curve_of(t, curves)) for t in trials]
        drawn_layers = layers
        if grid is not None and "ilr" not in searched_families(study.user_attrs):  # block maps only: their parameters
            importance = block_importance(trials, grid.n_layers)
            drawn_layers = LayerView((), importance) if importance else None
        return pareto_figure(
            study_name, rows, front, noise, drawn_layers, report.fidelity, report.race, report.answer, grid
        )

    if out is not None:
        _write_front(out, report, figure)
    return report, figure, grid


def check_image_export() -> None:
    import importlib.util

    if importlib.util.find_spec("kaleido") is None:
        raise UserInputError(
            "static images need kaleido and a Chrome/Chromium browser: pip install "
            "'ilr-search[images]' and install chromium; or write .html instead"
        )
    if not _find_browser():
        raise UserInputError(
            "static images need a Chrome/Chromium browser for kaleido: install chromium "
            "(e.g. apt-get install chromium) or write .html instead"
        )


def _find_browser() -> str | None:
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return os.environ.get("BROWSER_PATH")


def _write_front(path: Path, report: StudyReport, figure: Callable[[], go.Figure]) -> None:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame = integer_frame(report.to_json()["pareto"])  # trial and params as integers, not floats
        frame["reuse_map"] = frame["reuse_map"].map(lambda m: ",".join(map(str, m))) if len(frame) else []
        _write_table(path, frame)
        return
    if suffix == ".json":
        shown = report.to_json()
        text = json.dumps(
            {k: shown[k] for k in ("study", "pareto", "verdict", "answer", "target_steps", "noise")}, indent=1
        )
        _atomic_write(path, lambda p: p.write_text(text))
        return
    fig = figure()
    if suffix == ".html":
        _atomic_write(path, lambda p: write_figure_html(fig, p))
        return
    browser = _find_browser()
    if browser and "BROWSER_PATH" not in os.environ:
        os.environ["BROWSER_PATH"] = browser  # where kaleido (choreographer) looks for Chrome
    try:
        _atomic_write(path, lambda p: fig.write_image(p, format=suffix[1:], width=IMAGE_WIDTH, scale=2))
    except Exception as e:  # kaleido reports a missing or broken browser in several ways
        raise UserInputError(
            f"kaleido could not render {suffix} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "install chromium or write .html instead"
        ) from None


RACE_RUN_STATE = "RACE_RUN"  # the `state` of a race run's row in the export (its own state is in `run_state`)


def integer_frame(records: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> Any:
    """The records as a pandas DataFrame in which every column whose values are all integers (or missing) has the
    nullable Int64 dtype: a column that some rows lack (a reference or race run has no trial number, a trial no
    pruning step) stays integer (trial 0, params 139808) where pandas would make it float."""
    import pandas as pd

    frame = pd.DataFrame.from_records(list(records), columns=list(columns) if columns is not None else None)
    for name in frame.columns:
        values = [r[name] for r in records if r.get(name) is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            frame[name] = frame[name].astype("Int64")
    return frame


def _write_table(path: Path, frame: Any) -> None:
    if path.suffix.lower() == ".csv":
        _atomic_write(path, lambda p: frame.to_csv(p, index=False))
    else:
        _atomic_write(path, lambda p: frame.to_parquet(p, index=False))


@dataclass(frozen=True)
class ExportedTable:
    """What `export` wrote: the table `out` of `rows` rows (the trials, then `references` reference runs and
    `race_runs` race runs), and where asked the curves table `curves_out` of `curve_points` points. to_json is
    `export --json`."""

    study: str
    out: Path
    rows: int
    references: int
    race_runs: int
    curves_out: Path | None = None
    curve_points: int = 0

    @property
    def trials(self) -> int:
        return self.rows - self.references - self.race_runs

    def to_json(self) -> dict[str, Any]:
        omit = ("curves_out", "curve_points") if self.curves_out is None else ()
        return record_json(self, omit=omit, out=str(self.out), curves_out=str(self.curves_out))


def export_trials(
    study_name: str, storage: str | None, out: str | Path, curves_out: str | Path | None = None
) -> ExportedTable:
    """One row per trial (map, state, objectives, parameters, steps, seed, pruning rung, durations), per reference
    run, and per race run (state RACE_RUN: map, factor, steps, seed, result and `run_state`, every one stored,
    whatever its state; a frozen run's score of each window or item of its chunk, in the order the race paired
    them, as the JSON list `unit_scores`) as CSV or parquet, integer columns as integers; with `curves_out`, the
    learning curves too, as a long table (curve_rows: a race run's points named by map, seed and run_steps)."""
    path = check_out_path(out, EXPORT_FORMATS)
    curves_path = check_out_path(curves_out, EXPORT_FORMATS) if curves_out is not None else None
    _, study, store = _opened(study_name, storage)
    pruning = store.pruning_records()
    config = study.user_attrs.get(CONFIG_ATTR)
    seed = int(config["train"]["seed"]) if config is not None else None  # every trial trains at the space's seed
    records = []
    for t in listed_trials(study_trials(study, store.runs())):
        record = {
            "trial": t.number,
            "reference": None,
            "state": t.state.name,
            "reuse_map": (map_text(t.map_key) if t.map_key else ",".join(map(str, t.reuse_map)))
            if t.reuse_map
            else None,
            "map_key": t.map_key or None,
            "knobs": knobs_text(t),
            "flops_ratio": t.flops_ratio,
            "val_ppl": t.val_ppl,
            "val_bpb": t.val_bpb,
            "val_loss": t.val_loss,
            "objective_values": json.dumps(t.values) if t.values else None,
            "steps": t.steps,
            "seed": seed,
            "pruned_at_step": t.pruned_at_step,
            "pruning_reason": pruning[t.number].reason if t.number in pruning else None,
            "reused_from": t.reused_from,
            "status": t.status,
            "reason": t.reason,
            "params": t.param_count,
            "proposed_map": ",".join(map(str, t.proposed_map)) if t.proposed_map else None,
            "train_seconds": t.train_seconds,
            "duration_seconds": t.seconds,
            "datetime_start": t.datetime_start.isoformat() if t.datetime_start else None,
        }
        record |= {f"param_{k}": v for k, v in sorted(t.params.items())}
        records.append(record)
    references = reference_rows(store)
    for ref in references:  # marked by their name in `reference`, state REFERENCE, no trial number
        records.append(
            {
                "trial": None,
                "reference": ref.name,
                "state": "REFERENCE",
                "knobs": format_knobs(ref.knobs) if ref.knobs else None,
                "flops_ratio": ref.flops_ratio,
                "val_ppl": ref.val_ppl,
                "val_bpb": ref.val_bpb,
                "steps": ref.steps,
                "status": ref.status,
                "reuse_map": ref.block_map or ",".join(map(str, ref.reuse_map)) if ref.reuse_map else None,
                "schedule": ",".join(map(str, ref.schedule)) if ref.schedule else None,
                "seed": ref.seed,
            }
        )
    runs = race_run_rows(store.race_runs(), study.user_attrs)
    for row in runs:  # state RACE_RUN, no trial number; named by (map_key, steps, seed)
        run = row.run
        records.append(
            {
                "trial": None,
                "reference": None,
                "state": RACE_RUN_STATE,
                "reuse_map": map_text(run.job.map_key) if row.key else None,
                "train_seconds": run.seconds,
                "run_state": run.state,
                "map_key": run.job.map_key,
                "knobs": row.key.knobs or None if row.key else None,
                "flops_ratio": run.flops_ratio,
                "val_ppl": run.val_ppl,
                "val_bpb": run.val_bpb,
                "val_loss": run.val_loss,
                "steps": run.steps,
                "seed": run.job.seed,
                "factor": run.job.factor,
                "reason": run.reason,
                "unit_scores": json.dumps(list(run.scores)) if run.scores else None,
            }
        )
    frame = integer_frame(records)
    _write_table(path, frame)
    report = ExportedTable(study_name, path, len(frame), len(references), len(runs))
    if curves_path is not None:
        columns = [f.name for f in dataclasses.fields(CurveRow)]
        curves = integer_frame([dataclasses.asdict(r) for r in curve_rows(study, store)], columns)
        _write_table(curves_path, curves)
        report = dataclasses.replace(report, curves_out=curves_path, curve_points=len(curves))
    return report
