"""Tabular benchmark tables: every feasible map of a small space trained once, with its full learning curve, so
that samplers and pruning can be replayed over the table in seconds instead of hours, against a known exhaustive
Pareto front (the way NAS-Bench-style tabular benchmarks work)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ilr_search.analysis.pareto import non_dominated
from ilr_search.analysis.results import curves_by_trial
from ilr_search.commands.report import _atomic_write, check_out_path
from ilr_search.config import SIZE_MAXIMA
from ilr_search.errors import UserInputError
from ilr_search.options import BenchBuildOptions
from ilr_search.search.plan import plan_study
from ilr_search.search.progress import RunReporter
from ilr_search.search.run import RunRequest, run_in_process
from ilr_search.search.studies import open_study
from ilr_search.space import load_space
from ilr_search.storage import open_store, parse_storage, stored_references, study_storage
from ilr_search.storage.trials import study_trials, trained_results
from ilr_search.training.schedule import Map, format_reuse_map

if TYPE_CHECKING:
    import pandas as pd


def feasible_maps(n_layers: int, max_reuse: int, max_layer_runs: int) -> list[list[int]]:
    """Every reuse map with counts in 1..max_reuse whose schedule fits the budget."""
    return [list(m) for m in itertools.product(range(1, max_reuse + 1), repeat=n_layers) if sum(m) <= max_layer_runs]


def read_frame(path: str | Path, what: str, columns: set[str], hint: str = "") -> pd.DataFrame:
    """A table file (Parquet where its name ends in .parquet, else CSV) that has `columns` and at least one row; a
    UserInputError where it is missing, unreadable or not such a table. `what` names it in the errors ("bench
    table"), `hint` says where one comes from."""
    import pandas as pd

    if not Path(path).is_file():
        raise UserInputError(f"{what} {str(path)!r} does not exist")
    try:
        frame = pd.read_parquet(path) if str(path).endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise UserInputError(f"cannot read {what} {str(path)!r}: {e}") from None
    missing = columns - set(frame.columns)
    if missing or frame.empty:
        raise UserInputError(
            f"{str(path)!r} is not a {what}{hint}: " + (f"columns {sorted(missing)} missing" if missing else "no rows")
        )
    return frame


@dataclass(frozen=True)
class BuiltTable:
    """`ilr-search bench build`: the table written (where, its rows), the feasible maps of the space, the seconds
    this run took and the study the table's maps were trained in. to_json is its --json."""

    out: str
    maps: int
    feasible_maps: int
    build_seconds_this_run: float
    study: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def table_rows(study_name: str, storage: str | None, steps: int) -> list[dict[str, Any]]:
    """A bench table's rows from study `study_name` of `storage`, trained `steps` steps: each trained result (its
    result on its map's run where Optuna holds none, study_trials) and each stack reference (blockK), with its
    curve."""
    rows: list[dict[str, Any]] = []
    study = open_study(parse_storage(storage), study_name)
    store = open_store(parse_storage(storage), study_name, read_only=True, storage=study_storage(study))
    curves = curves_by_trial(store.curve_points())
    for t in trained_results(study_trials(study, store.runs())):
        rows.append(
            {
                "reuse_map": format_reuse_map(cast(tuple[int, ...], t.reuse_map)),  # a trained result's map
                "flops_ratio": t.flops_ratio,
                "val_ppl": t.val_ppl,
                "val_bpb": t.val_bpb,
                "curve": json.dumps(sorted(curves[t.number].items())),
                "steps": steps,
                "trial": t.number,
                "train_seconds": t.train_seconds,
            }
        )
    for key, ref in sorted(stored_references(store.reference_runs()).items()):
        if Map.form_of(key) == "stack" and ref.val_ppl is not None and ref.curve:
            rows.append(
                {
                    "reuse_map": key,
                    "flops_ratio": ref.flops_ratio,
                    "val_ppl": ref.val_ppl,
                    "val_bpb": ref.val_bpb,
                    "curve": json.dumps([list(point) for point in ref.curve]),
                    "steps": steps,
                    "trial": -1,
                    "train_seconds": None,
                }
            )
    return rows


def build_table(opts: BenchBuildOptions, reporter: RunReporter | None = None) -> BuiltTable:
    """`ilr-search bench build`: train every feasible map of the space (or a seeded sample of `sample` maps, the
    baseline always among them) as a brute-force study, so the build resumes, and write the table. Block recurrence
    K is added as a `blockK` row where the space's families include it and the budget allows it."""
    path = check_out_path(opts.out, (".parquet", ".csv"))
    if opts.sample is not None and opts.sample < 1:
        raise UserInputError(f"--sample must be at least 1 map, got {opts.sample}")
    space = load_space(
        opts.space, {"search": {"enqueue_paper_maps": False, "noise_seeds": 0}, "train": {"steps": opts.steps}}
    )
    plan = plan_study(space, opts.budget, None)
    candidates = space.search.max_reuse**plan.model.n_layers
    if candidates > SIZE_MAXIMA["search", "n_trials"]:
        raise UserInputError(
            f"bench build goes through every map, and this space has {candidates:,} "
            f"(max_reuse {space.search.max_reuse} ^ {plan.model.n_layers} layers), above "
            f"{SIZE_MAXIMA['search', 'n_trials']:,}; give a smaller space"
        )
    maps = feasible_maps(plan.model.n_layers, space.search.max_reuse, plan.budget.max_layer_runs(plan.model))
    if opts.sample is not None and opts.sample < len(maps):
        baseline = [1] * plan.model.n_layers
        others = [m for m in maps if m != baseline]
        maps = [baseline] + sorted(random.Random(opts.seed).sample(others, opts.sample - 1))
    name = opts.study or (
        f"bench-{Path(opts.space).stem}-{plan.budget.text}"
        + (f"-{opts.steps}steps" if opts.steps else "")
        + (f"-sample{opts.sample}-seed{opts.seed}" if opts.sample else "")
    )
    started = time.perf_counter()
    run_in_process(
        RunRequest(
            space,
            opts.budget,
            name,
            opts.storage,
            n_trials=len(maps),
            sampler="random",
            pruner="none",
            enqueue_maps=tuple(map(tuple, maps)),
            race=False,
        ),
        reporter,
    )  # the table: every map once, no race
    seconds = time.perf_counter() - started
    rows = table_rows(name, opts.storage, space.train.steps)
    import pandas as pd

    frame = pd.DataFrame(rows).sort_values("reuse_map").reset_index(drop=True)
    meta = {
        "space": str(opts.space),
        "budget": opts.budget,
        "n_layers": plan.model.n_layers,
        "max_reuse": space.search.max_reuse,
        "max_layer_runs": plan.budget.max_layer_runs(plan.model),
        "steps": space.train.steps,
        "rungs": space.train.eval_steps[:-1],
        "study": name,
        "sample": opts.sample,
        "sample_seed": opts.seed if opts.sample else None,
    }
    frame["meta"] = json.dumps(meta)
    if path.suffix == ".parquet":
        _atomic_write(path, lambda p: frame.to_parquet(p, index=False))
    else:
        _atomic_write(path, lambda p: frame.to_csv(p, index=False))
    return BuiltTable(
        str(path),
        len(frame),
        len(feasible_maps(plan.model.n_layers, space.search.max_reuse, plan.budget.max_layer_runs(plan.model))),
        seconds,
        name,
    )


@dataclass(frozen=True)
class TableRow:
    map_key: str  # "2,1,1,1", or "blockK" for block recurrence
    reuse_map: tuple[int, ...] | None  # None for a block-recurrence row
    flops_ratio: float
    val_ppl: float
    curve: dict[int, float]  # step -> validation loss


@dataclass(frozen=True)
class Table:
    """A table in the bench format: one row per trained map (reuse_map, flops_ratio, val_ppl, curve as JSON
    [[step, loss], ...], steps), optionally with a `meta` column (written by `bench build`). It may hold only
    some maps of a space, and block-recurrence rows (`block2`)."""

    n_layers: int
    max_reuse: int
    max_layer_runs: int
    steps: int
    rungs: tuple[int, ...]
    rows: tuple[TableRow, ...]  # in table order

    @classmethod
    def read(cls, path: str | Path) -> Table:
        frame = read_frame(path, "bench table", {"reuse_map", "flops_ratio", "val_ppl", "curve"})
        rows = []
        for r in frame.to_dict("records"):
            key = str(r["reuse_map"]).strip()
            reuse = None if Map.form_of(key) == "stack" else Map.parse(key).counts
            rows.append(
                TableRow(
                    key,
                    reuse,
                    float(r["flops_ratio"]),
                    float(r["val_ppl"]),
                    {int(s): float(v) for s, v in json.loads(r["curve"])},
                )
            )
        meta = json.loads(frame["meta"].iloc[0]) if "meta" in frame.columns else {}
        maps = [r.reuse_map for r in rows if r.reuse_map is not None]
        steps = int(
            meta.get("steps") or (frame["steps"].max() if "steps" in frame.columns else max(max(r.curve) for r in rows))
        )
        n_layers = int(meta.get("n_layers") or len(maps[0]))
        return cls(
            n_layers,
            int(meta.get("max_reuse") or max(max(m) for m in maps)),
            int(meta.get("max_layer_runs") or max(sum(m) for m in maps)),
            steps,
            tuple(meta.get("rungs") or sorted({s for r in rows for s in r.curve if s < steps})),
            tuple(rows),
        )

    def points(self) -> list[tuple[float, float]]:
        return [(r.val_ppl, r.flops_ratio) for r in self.rows]

    def front_keys(self) -> list[str]:
        return [self.rows[i].map_key for i in non_dominated(self.points())]

    def rungs_at(self, fractions: Sequence[float]) -> tuple[int, ...]:
        return tuple(r for r in self.rungs if any(abs(r - f * self.steps) < 0.5 + 1e-9 for f in fractions))
