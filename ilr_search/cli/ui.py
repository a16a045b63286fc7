"""What a command prints: its tables and lines on stdout (fitted to the console), its notes on stderr (held until it
goes ahead). Its live progress is live.py's."""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.table import Table

from ilr_search.commands import events
from ilr_search.commands.events import Replicates

if TYPE_CHECKING:
    from ilr_search.commands.api import FlopsReport
    from ilr_search.commands.audit import StudyAudit
    from ilr_search.commands.bench.pruning import TableReplay
    from ilr_search.commands.dryrun import DryRunReport
    from ilr_search.commands.export import ExportedModel
    from ilr_search.commands.recipe import TrainReport
    from ilr_search.commands.report import BlockView, ExportedTable
    from ilr_search.commands.studies import FrontRow, StudyListing, StudyReport


def console(stderr: bool = False) -> Console:
    """A console on stdout or stderr: on a terminal, rich's own (its width, its wrapping); into a file or a pipe, no
    width and no wrapping, so that a line (a pruning reason, the verdict) stays one line that grep finds."""
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    return Console(stderr=stderr, width=None if terminal else UNWRAPPED_WIDTH, soft_wrap=not terminal)


UNWRAPPED_WIDTH = 100_000  # a table into a file takes the width of its content
out = console()
err = console(stderr=True)


held_notes: list[str] = []  # informational lines for stderr, held until the command is known to go ahead


def hold_note(text: str) -> None:
    """A line for stderr (which study a command took, which map) that is printed once the command goes ahead (its
    first output or progress, or its end), and never when it fails: an `error:` line stays alone."""
    held_notes.append(text)


def release_notes() -> None:
    """Print the held notes on stderr, in order."""
    while held_notes:
        err.print(held_notes.pop(0), soft_wrap=True, markup=False, highlight=False)


def fmt(x: Any, digits: int = 4) -> str:
    """A value as a cell or a line writes it: None as -, a float to `digits` significant digits, a list joined by
    commas."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    if isinstance(x, list):
        return ",".join(str(v) for v in x)
    return str(x)


def key_value_table(title: str, rows: dict[str, Any]) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in rows.items():
        table.add_row(key, fmt(value, 6))
    out.print(table)


def print_flops(report: FlopsReport) -> None:
    """Every `flops --json` key and value, the schedule last."""
    rows = report.to_json()
    key_value_table("FLOPs", {k: v for k, v in rows.items() if k != "schedule"} | {"schedule": rows["schedule"]})


def print_train(report: TrainReport) -> None:
    """The `train --json` keys and values but the curve and schedule, then the validation curve."""
    rows = {k: v for k, v in report.to_json().items() if k not in ("curve", "schedule")}
    key_value_table(f"proxy {fmt(list(report.reuse_map))}", rows)
    curve = Table(title="validation curve")
    for col in ("step", "tokens", "val_loss"):
        curve.add_column(col, justify="right")
    for p in report.result.curve:
        curve.add_row(str(p.step), str(p.tokens), f"{p.val_loss:.4f}")
    out.print(curve)


def with_knobs_column(columns: list[str], rows: list[dict[str, Any]]) -> list[str]:
    """The columns, with `knobs` after `reuse_map` when some row has knobs on (a study that searches them)."""
    if not any(r.get("knobs") for r in rows) or "reuse_map" not in columns:
        return columns
    at = columns.index("reuse_map") + 1
    return columns[:at] + ["knobs"] + columns[at:]


KEPT_WHOLE = ("reuse_map", "study", "map_key", "best")  # never folded nor dropped, header included: what you copy
LEFT_ALIGNED = (*KEPT_WHOLE, "knobs", "state", "decided", "status", "confirmed", "source", "reference", "schedule")
KNOB_FLOOR = 12  # a knob settings cell folds to lines this wide before a column is dropped


def significant_decimals(values: list[Any], significant: int = 4) -> int:
    """The decimals that give the largest of `values` `significant` digits: one count for a whole column, so that
    its numbers line up (4.917, 4.830, 4.600; 122.1, 124.0)."""
    finite = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    largest = max(finite, default=0.0)
    return max(0, significant - (len(str(int(largest))) if largest >= 1 else 1))


def fixed(value: Any, decimals: int) -> str:
    """A number with `decimals` decimals (None as -, inf and nan as Python writes them)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return fmt(value)
    return f"{value:.{decimals}f}" if math.isfinite(value) else str(value)


def column_cells(column: str, values: list[Any]) -> list[str]:
    """One column's cells: a FLOPs ratio with its x (1.50x); perplexities and bits per byte with one number of
    decimals over the column (significant_decimals); the rest as fmt writes them."""
    if column == "flops_ratio":
        return [f"{v:.2f}x" if isinstance(v, (int, float)) and math.isfinite(v) else fmt(v) for v in values]
    if column.endswith(("ppl", "bpb")) and all(v is None or isinstance(v, (int, float)) for v in values):
        finite = [abs(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v]
        if finite and max(finite) / min(finite) > 100:  # across decades: each value its own 4 significant digits
            return [fmt(float(v)) if isinstance(v, (int, float)) else fmt(v) for v in values]
        decimals = significant_decimals(values)
        return [fixed(v, decimals) for v in values]
    return [fmt(v) for v in values]


def fit_columns(
    columns: list[str], heads: list[str], cells: list[list[str]], width: int, droppable: list[str]
) -> tuple[list[int], list[int | None]]:
    """(the columns shown, by index, and their widths) that fit a table in `width`. A column's floor is its longest
    word, header and values alike (a number is one word: never split; a header folds between its words, never
    a letter a line); a key column (KEPT_WHOLE) keeps its whole width, and knob settings fold down to KNOB_FLOOR.
    While the floors do not fit, the `droppable` columns go, first listed first; then the columns give room,
    the most generous first, down to their floors, and, only if that is not enough, below them (never a key
    column); headers fold before values do, and the table's outer edges lose their space. Widths None everywhere
    when the table fits as it is."""
    n = len(columns)
    natural = [max([len(heads[i])] + [len(row[i]) for row in cells]) for i in range(n)]
    words = [
        max([len(w) for w in heads[i].split()] + [len(w) for row in cells for w in row[i].split()] + [1])
        for i in range(n)
    ]
    floors = [
        natural[i] if c in KEPT_WHOLE else min(words[i], KNOB_FLOOR) if c == "knobs" else words[i]
        for i, c in enumerate(columns)
    ]

    shown = list(range(n))
    if sum(natural) + 3 * n + 1 <= width:  # a border and a space either side of each column
        return shown, [None] * n

    def room(shown: list[int], widths: list[int]) -> int:  # fitted: no space at the table's outer edges
        return sum(widths[i] for i in shown) + 3 * len(shown) - 1

    for column in droppable:
        if room(shown, floors) <= width:
            break
        if column in columns and columns.index(column) in shown:
            shown.remove(columns.index(column))
    widths = list(natural)
    excess = room(shown, widths) - width
    values = [max([1] + [len(row[i]) for row in cells]) for i in range(n)]
    whole_values = [max(floors[i], values[i]) if c != "knobs" else floors[i] for i, c in enumerate(columns)]
    smallest = [natural[i] if c in KEPT_WHOLE else 4 for i, c in enumerate(columns)]
    for lowest in (whole_values, floors, smallest):  # headers fold first, then values between words, then below
        for i in sorted(shown, key=lambda i: lowest[i] - widths[i]):
            give = max(0, min(excess, widths[i] - lowest[i]))
            widths[i] -= give
            excess -= give
    return shown, [widths[i] for i in shown]


def cell_value(row: dict[str, Any], column: str) -> Any:
    """A row's value in `column`; the reuse_map column shows the map as its key writes it (a block map's
    block:I-J:R, not its per-layer counts) where the row has one."""
    return row.get("map") or row.get(column) if column == "reuse_map" else row.get(column)


def rows_table(
    title: str,
    rows: list[dict[str, Any]],
    columns: list[str],
    headers: dict[str, str] | None = None,
    droppable: list[str] | None = None,
) -> None:
    """A table of `rows` by `columns` (their keys), each headed by its key (underscores as spaces) or by
    `headers[key]`, fitted to the console (fit_columns: on a narrow one the `droppable` columns go first)."""
    columns = with_knobs_column(columns, rows)
    by_column = [column_cells(c, [cell_value(row, c) for row in rows]) for c in columns]
    cells = [list(row) for row in zip(*by_column, strict=True)] if rows else []
    heads = [(headers or {}).get(c, c.replace("_", " ")) for c in columns]
    shown, widths = fit_columns(columns, heads, cells, out.width, list(droppable or ()))
    table = Table(title=title, pad_edge=widths[0] is None if widths else True)
    for i, width in zip(shown, widths, strict=True):
        col = columns[i]
        table.add_column(
            heads[i],
            justify="left" if col in LEFT_ALIGNED else "right",
            overflow="fold",
            no_wrap=col in KEPT_WHOLE,
            width=width,
            min_width=width if col in KEPT_WHOLE else None,
        )
    for row in cells:
        table.add_row(*(row[i] for i in shown))
    out.print(table)


FRONT_COLUMNS = ["trial", "reuse_map", "flops_ratio", "val_ppl", "val_bpb"]  # the current front (live.py)
TRIAL_COLUMNS = ["trial", "state", "reuse_map", "flops_ratio", "val_ppl", "val_bpb", "steps", "pruned_at_step"]
FROZEN_TRIAL_COLUMNS = ["trial", "state", "reuse_map", "flops_ratio", "val_ppl", "val_bpb"]  # evaluated: no step
TRIAL_COLUMNS_DROPPED = ["pruned_at_step", "val_bpb", "steps", "state"]  # on a narrow console, first dropped first


def study_words(report: StudyReport) -> Replicates:
    """The words of a study's report, chosen from its race's settings (a study with no race: seeds, perplexity)."""
    return Replicates.of(report.race.settings if report.race is not None else None)


# The front as run and pareto print it: each point at its length, with its seeds and interval (trial numbers,
# bpb and parameters are in --json); seven columns fit 80 characters.
RACE_FRONT_COLUMNS = ["reuse_map", "flops_ratio", "steps", "seeds", "val_ppl", "interval", "confirmed"]
RACE_FRONT_HEADERS = {"flops_ratio": "FLOPs", "val_ppl": "ppl", "interval": "90% interval"}
RACE_FRONT_DROPPED = ["steps", "seeds", "interval"]  # on a narrow console, first dropped first
FROZEN_FRONT_COLUMNS = [c for c in RACE_FRONT_COLUMNS if c != "steps"]  # a frozen study's front: no step trained
COMPARISON_COLUMNS = ["reuse_map", "seeds", "loss_diff", "interval", "p", "level", "status"]  # against the baseline


CONFIRMED_WORDS = ("yes", "no", "reference")  # the front's `confirmed` column: claimed better, not, the baseline


def race_front_rows(front: list[FrontRow], words: Replicates | None = None) -> list[dict[str, Any]]:
    """Front points as a table's rows (cells by column name): the score in the study's measure (`words`: ppl where
    not given), the interval as low-high (with the scores' decimals; an accuracy's from high to low), confirmed as a
    word of CONFIRMED_WORDS."""
    words = words or Replicates()
    yes, no, baseline = CONFIRMED_WORDS
    decimals = significant_decimals([words.value(p.val_ppl) for p in front])

    def interval(p: FrontRow) -> str:
        if p.interval[0] is None or p.interval[1] is None:
            return "-"
        low, high = sorted(v for v in (words.value(p.interval[0]), words.value(p.interval[1])) if v is not None)
        return f"{fixed(low, decimals)}-{fixed(high, decimals)}"

    return [
        p.to_dict()
        | {
            "val_ppl": words.value(p.val_ppl),
            "interval": interval(p),
            "confirmed": baseline if p.is_baseline else yes if p.confirmed else no,
        }
        for p in front
    ]


def print_answer(report: StudyReport, details: bool = True) -> None:
    """The study's answer line (`use MAP ...`, `no map beat ...` or `no decision yet: ...`) and, with `details`,
    what it rests on as a short list under it (wrapped at a terminal's width; one line each into a file)."""
    out.print(report.answer.line, markup=False, highlight=False)
    if details:
        for line in report.answer.details:
            out.print(f"  - {line}", markup=False, highlight=False)


def print_race(report: StudyReport) -> None:
    """What the race's answer rests on (the verdict itself is in `--json`; the answer and its details say it in
    words): its runs beyond the proxy (the fixed race: each run; the adaptive race: each map's seeds at the target),
    the comparisons with the baseline, the equal-compute model."""
    race = report.race
    if race is None:
        return
    settings = race.settings
    runs = sorted(race.runs, key=lambda r: (r.map_key, r.seed))
    by_map: dict[str, list[Any]] = {}
    for r in runs:
        by_map.setdefault(r.map_key, []).append(r)
    decimals = significant_decimals([r.val_ppl for r in runs])
    words = study_words(report)
    if runs and not words.trains:  # no step trained: a seed is a chunk of held-out windows or items
        places = significant_decimals([words.value(r.val_ppl) for r in runs])
        rows_table(
            f"race evaluations {words.at(0)} (frozen; {words.one(settings.seeds[0])} scored the trials, the rest test)",
            [
                {
                    "map": words.shown(k),
                    "chunks": ",".join(str(r.seed) for r in v),
                    "score": " ".join(fixed(words.value(r.val_ppl), places) for r in v),
                }
                for k, v in sorted(by_map.items())
            ],
            ["map", "chunks", "score"],
            {"chunks": words.plural, "score": words.column},
        )
    elif runs and settings.policy == "adaptive":
        rows_table(
            f"race runs at {settings.target_steps} steps (proxy {settings.base_steps}; seed {settings.seeds[0]} "
            f"screens, the rest test)",
            [
                {
                    "reuse_map": k,
                    "seeds": ",".join(str(r.seed) for r in v),
                    "ppl": " ".join(fixed(r.val_ppl, decimals) for r in v),
                }
                for k, v in sorted(by_map.items())
            ],
            ["reuse_map", "seeds", "ppl"],
        )
    elif runs:
        rows_table(
            f"race runs (proxy {settings.base_steps} steps, target {settings.target_steps}, seeds "
            f"{fmt(list(settings.seeds))})",
            [dataclasses.asdict(r) for r in runs],
            ["map_key", "steps", "seed", "val_ppl", "schedule", "source"],
            droppable=["schedule", "source"],
        )
    if race.state.comparisons:
        rows = [
            {
                "reuse_map": c.map_key,
                "map": None if words.trains else words.shown(c.map_key),  # trained: as the study's key writes it
                "seeds": c.n,
                "loss_diff": c.mean_diff,
                "interval": "-" if not c.interval else f"{c.interval[0]:+.4f} to {c.interval[1]:+.4f}",
                "p": c.p_value,
                "level": c.level,
                "status": c.status,
            }
            for c in race.state.comparisons
        ]
        diff = f"loss_diff: the map's {words.loss} minus the baseline's, below 0 is better"
        if words.trains:
            rows_table(
                f"against the baseline at the target (test seeds; {diff})",
                rows,
                COMPARISON_COLUMNS,
                {"seeds": "test seeds"},
                droppable=["level", "p"],
            )
        else:
            rows_table(
                f"against the baseline {words.at(0)} (test {words.plural}, paired by {words.paired}; {diff})",
                rows,
                COMPARISON_COLUMNS,
                {"seeds": f"test {words.plural}", "reuse_map": "map"},
                droppable=["level", "p"],
            )
    for key, why in race.state.eliminated.items():
        out.print(f"eliminated {words.shown(key)}: {why}", soft_wrap=True)
    equal = race.equal_compute
    if equal and equal.val_ppl is not None:
        out.print(
            f"equal compute: {equal.deep_key} (a plain {equal.layers}-layer model, "
            f"{fmt(equal.flops_ratio)}x FLOPs, {equal.params} parameters, {equal.params_ratio:.2f}x "
            f"the baseline's) ppl {fmt(equal.val_ppl)} over seeds {fmt(list(equal.seeds))}",
            soft_wrap=True,
        )
    if report.answer.trust is not None:
        out.print(f"trust: {report.answer.trust.text()}", soft_wrap=True)


def print_front(report: StudyReport, front: list[FrontRow]) -> None:
    """The decided front as run and pareto print it (a frozen study's without its steps, its maps as a study writes
    them, its seeds chunks and its scores in its measure)."""
    words, title = study_words(report), f"Pareto front of {report.study}"
    if words.trains:  # in perplexity, whatever it judged (a trained study's answer loss is its held-out text's)
        rows_table(title, race_front_rows(front), RACE_FRONT_COLUMNS, RACE_FRONT_HEADERS, RACE_FRONT_DROPPED)
    else:
        rows_table(
            title,
            [r | {"map": words.shown(r["map"])} for r in race_front_rows(front, words)],
            FROZEN_FRONT_COLUMNS,
            RACE_FRONT_HEADERS | {"seeds": words.plural, "reuse_map": "map", "val_ppl": words.column},
            RACE_FRONT_DROPPED,
        )


def print_run(report: StudyReport) -> None:
    """The front, the counts, the fidelity, the race and the run's phases; the answer's details, then the answer as
    the last line."""
    print_front(report, list(report.front))
    for name, ref in report.references.items():
        out.print(f"reference {name}: {fmt(ref.flops_ratio)}x, ppl {fmt(ref.val_ppl)}")
    everything = report.steps_trained + report.reference_steps + report.race_steps
    words = study_words(report)
    if words.trains:
        out.print(
            f"{report.n_complete} complete, {report.n_pruned} pruned, {report.n_failed} failed; "
            f"{everything} steps trained: {report.steps_trained} in the trials ({report.steps_saved_by_pruning} "
            f"saved by pruning), {report.reference_steps} in the reference runs, "
            f"{report.race_steps} in the race; storage {report.storage}"
        )
    else:
        out.print(
            f"{report.n_complete} evaluated, {report.n_failed} failed; frozen: no step trained, every result the "
            f"pretrained weights evaluated {words.at(0)}; storage {report.storage}"
        )
    _fidelity_lines(report)
    print_learned(report)
    print_race(report)
    print_phases(report)
    if report.interrupted:
        out.print("interrupted: finished trials are saved; run the same command again to resume")
    for line in report.answer.details:
        out.print(f"  - {line}", markup=False, highlight=False)
    print_answer(report, details=False)


def print_learned(report: StudyReport) -> None:
    """`run --learn`: the learned gates, a row a layer and a column a pass, then the map and what learning cost."""
    learned = report.learned
    if learned is None:
        return
    passes = max((len(row) for row in learned["gates"]), default=0)
    rows_table(
        f"learned gates (a pass is kept where its gate is >= {learned['kept_at']:g})",
        [{"layer": i} | {f"pass {k + 1}": g for k, g in enumerate(row)} for i, row in enumerate(learned["gates"])],
        ["layer", *(f"pass {k + 1}" for k in range(passes))],
    )
    trial = f", trial {learned['trial']}" if learned.get("trial") is not None else ""
    out.print(
        f"learned map {learned['map']}{trial}: {learned['steps']} steps in {learned['seconds']:.1f} s"
        f"{' (frozen: the gates alone)' if learned['frozen'] else ''}; expected FLOPs "
        f"{learned['expected_flops_ratio']:.3f}x of the budget's {learned['budget_ratio']:.3f}x, the budget's "
        f"logit shift {learned['shift']:.3g}",
        markup=False,
        highlight=False,
    )


def print_judge(report: StudyReport) -> None:
    """`judge`: the answer (a line a candidate) first, then the race against the model and the phases."""
    print_answer(report, details=True)
    print_race(report)
    print_phases(report)
    if report.interrupted:
        out.print("interrupted: finished evaluations are saved; run the same command again to resume")


def print_phases(report: StudyReport) -> None:
    """Where the run's time went, phase by phase."""
    if report.phases:
        rows_table(
            "phases (cpu%: of one core)",
            [
                {
                    "phase": p.phase,
                    "wall s": round(p.wall_seconds, 1),
                    "tokens": p.tokens,
                    "tokens/s": round(p.tokens_per_second),
                    "cpu s": round(p.cpu_seconds, 1),
                    "cpu%": round(p.cpu_percent),
                }
                for p in report.phases
            ],
            ["phase", "wall s", "tokens", "tokens/s", "cpu s", "cpu%"],
        )


def print_studies(listing: StudyListing) -> None:
    """The studies as a table, then each study's answer on a line of its own."""
    rows_table(
        "studies (best: the map the race reports, at its decided length)",
        [s.to_dict() for s in listing.studies],  # a table's cells by column name
        ["study", "n_trials", "budget", "layers", "best", "best_val_ppl", "best_steps", "decided"],
        {"n_trials": "trials"},
        droppable=["best_steps", "layers", "n_trials", "budget", "decided"],
    )
    for s in listing.studies:
        out.print(f"{s.study}: {s.answer}", markup=False, highlight=False)


def print_export(report: ExportedTable) -> None:
    out.print(
        f"wrote {report.trials} trials, {report.references} reference runs and {report.race_runs} race runs "
        f"to {report.out}"
    )
    if report.curves_out is not None:
        out.print(f"wrote {report.curve_points} curve points to {report.curves_out}")


def print_export_model(report: ExportedModel) -> None:
    what = (
        f"a mergekit passthrough config of {report.layers} layers"
        if report.format == "mergekit"
        else f"a {report.family} checkpoint of {report.layers} layers"
    )
    out.print(
        f"wrote {what} ({report.source}, map {report.map}, schedule {','.join(map(str, report.schedule))}) to "
        f"{report.out}",
        markup=False,
    )
    if report.format == "mergekit":
        out.print(f"build it with: mergekit-yaml {report.out} OUT_DIR", markup=False)
    if report.parts and report.format == "hf":
        out.print(
            "its one-branch passes are whole layers with the other branch's output projection zero: the exported "
            "model still computes that branch (its FLOPs) at every such pass",
            markup=False,
        )


def print_trials(report: StudyReport) -> None:
    """The answer and its details first, then every trial, the reference runs, the fidelity and the race."""
    print_answer(report)
    listing = report.listing
    if listing is not None:
        rows = [r.to_dict() for r in listing.rows]  # a table's cells by column name
        words = study_words(report)
        if not words.trains:
            rows_table(
                f"maps evaluated in {report.study} (on {words.one(0)})",
                [
                    r | {"map": words.shown(r.get("map") or r["reuse_map"]), "val_ppl": words.value(r["val_ppl"])}
                    for r in rows
                ],
                FROZEN_TRIAL_COLUMNS,
                {"reuse_map": "map", "val_ppl": words.column},
                droppable=["val_bpb", "state"],
            )
        else:
            rows_table(f"trials of {report.study}", rows, TRIAL_COLUMNS, droppable=TRIAL_COLUMNS_DROPPED)
        if listing.references:
            rows_table(
                "reference runs (trained outside the sampler's view)",
                [r.to_dict() for r in listing.references],
                ["reference", "reuse_map", "knobs", "flops_ratio", "val_ppl", "val_bpb", "seed", "status"],
                droppable=["val_bpb", "seed", "status"],
            )
    _fidelity_lines(report)
    print_learned(report)
    print_race(report)


def print_pareto(report: StudyReport) -> None:
    """The answer and its details first, then the decided front, the layer view, the fidelity and the race."""
    print_answer(report)
    view = report.front_view
    print_front(report, list(view.front) if view is not None else list(report.front))
    if view is not None and view.noise:
        out.print(
            f"baseline seed-to-seed spread at the proxy's length: {view.noise.spread:.4g} ppl over "
            f"{view.noise.n_seeds} seeds"
        )
    if view is not None and view.layers is not None:
        out.print(recurred_layers(view.layers.front_maps), soft_wrap=True)
        if view.layers.importance:
            rows_table(
                "layer importance for perplexity (Optuna PED-ANOVA)",
                [{"layer": k, "importance": f"{v:.2f}"} for k, v in view.layers.importance.items()],
                ["layer", "importance"],
            )
    _fidelity_lines(report)
    print_race(report)
    if view is not None and view.out:
        out.print(f"wrote {view.out}")


def print_blocks(view: BlockView) -> None:
    """`pareto --view blocks`: the answer and its details, then the block grid, a table per repeat count (and knob
    setting): a row per first layer I, a column per last layer J, each block's loss difference to the plain model
    (3 significant figures) and its mark (analysis/blocks.py MARKS), then a line of what the numbers and marks are."""
    report, grid = view.report, view.grid
    print_answer(report)
    words = Replicates.of(grid.settings)
    for panel in grid.panels():
        ends = sorted({c.end for c in panel.cells})
        table = Table(title=f"{panel.title}: blocks I..J run {panel.repeats} times", title_justify="left")
        table.add_column("I \\ J", justify="right")
        for end in ends:
            table.add_column(str(end), justify="right", no_wrap=True)
        for start in sorted({c.start for c in panel.cells}):
            cells = [panel.cell(start, end) for end in ends]
            table.add_row(
                str(start),
                *(
                    ""
                    if c is None
                    else f"{'diverged' if c.diff is None else f'{c.diff:+.3g}'}{c.mark if c.mark.strip() else ' '}"
                    for c in cells
                ),
            )
        out.print(table)
    plain = f", ppl {grid.plain_ppl:.4g}" if grid.plain_ppl is not None and grid.settings.judged == "ppl" else ""
    out.print(
        f"each cell: block:I-J:R's loss minus the plain model's ({events.shown_key(grid.baseline)}{plain}) in "
        f"{grid.unit}, below 0 better: the race's paired mean over its test {words.plural} where it raced the block, "
        f"else {words.screened(grid.screen_chunk)}; {view.marks}",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
    if report.front_view is not None and report.front_view.out:
        out.print(f"wrote {report.front_view.out}")


def recurred_layers(front: Sequence[FrontRow]) -> str:
    """One sentence: which layers the decided front's maps run more than once."""
    layers = sorted({i for p in front for i, count in enumerate(p.reuse_map or ()) if count > 1})
    if not layers:
        return "the decided front recurs no layer"
    names = [str(i) for i in layers]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"the decided front recurs layer{'s' if len(names) > 1 else ''} {listed}"


def _fidelity_lines(report: StudyReport) -> None:
    """The proxy's fidelity to the final ranking (a study that trains: a frozen one has no proxy to judge)."""
    fidelity = report.fidelity
    if fidelity is None or not study_words(report).trains:
        return
    if fidelity.rungs:
        rows_table(
            "rung agreement with the final ranking (complete maps)",
            [
                {"step": r.step, "fraction": r.fraction, "maps": r.n_maps, "spearman": r.spearman, "kendall": r.kendall}
                for r in fidelity.rungs
            ],
            ["step", "fraction", "maps", "spearman", "kendall"],
        )
    out.print(f"fidelity: {fidelity.verdict}")


def print_audit(audit: StudyAudit) -> None:
    """`audit`: each audited map's proxy and audited perplexity, by the audit's; the rank agreement and the finding."""
    report = audit.report
    factor = f"{audit.factor:g}x"
    rows = [  # keyed by header, but for the columns whose key sets their format (the map, the FLOPs)
        {
            "reuse_map": m.reuse_map,
            "flops_ratio": m.flops_ratio,
            "proxy": m.proxy_state.lower(),
            "proxy ppl": m.proxy_ppl,
            f"{factor} ppl": m.audit_ppl,
            "n": len(m.audit_ppls),
            "sd": statistics.stdev(m.audit_ppls) if len(m.audit_ppls) > 1 else None,
            "front": ("proxy " if m.on_proxy_front else "") + (factor if m.on_audit_front else ""),
        }
        for m in sorted(report.maps, key=lambda m: m.audit_ppl)
    ]
    rows_table(
        f"audit of {audit.study}: {audit.proxy_steps} -> {audit.steps} steps",
        rows,
        ["reuse_map", "flops_ratio", "proxy", "proxy ppl", f"{factor} ppl", "n", "sd", "front"],
        {"flops_ratio": "FLOPs"},
        droppable=["sd", "n", "proxy"],
    )
    out.print(
        f"Spearman {fmt(report.spearman)}, Kendall {fmt(report.kendall)} over {report.n_maps} maps; "
        f"front precision {fmt(report.front_precision)}, recall {fmt(report.front_recall)}; pruned maps on the "
        f"{audit.factor:g}x front: {', '.join(report.pruned_on_audited_front) or 'none'}"
    )
    out.print(f"finding: {report.finding}")


def print_pruning_replay(report: TableReplay) -> None:
    replay = report.replay
    rows_table(
        f"{replay.rule} over {report.table} ({replay.n_rows} rows, "
        f"{'table order' if replay.order_seed is None else 'order seed ' + str(replay.order_seed)})",
        [
            {
                "reuse_map": p.reuse_map,
                "step": p.step,
                "flops_ratio": p.flops_ratio,
                "front": "LOST" if p.reuse_map in replay.front_maps_lost else "",
            }
            for p in replay.pruned
        ],
        ["reuse_map", "step", "flops_ratio", "front"],
    )
    out.print(
        f"pruned {len(replay.pruned)} of {replay.n_rows} maps at rungs {list(replay.rungs)}; "
        f"steps saved {replay.steps_saved} ({replay.steps_saved_share:.1%}); table front "
        f"{', '.join(replay.front)}; front maps lost: {', '.join(replay.front_maps_lost) or 'none'}"
    )


def print_plan(report: DryRunReport) -> None:
    from ilr_search.commands.dryrun import AdaptiveRace, FixedRace  # loaded already: the report is one of its

    resume = report.resume
    rows = {
        "study": report.study
        + (f" (resume: {report.finished_trials} of {report.n_trials} trials finished)" if resume else " (new)"),
    }
    if report.finished:
        rows["left"] = cast(str, report.left)
    data, train = report.data, report.train
    words = Replicates(frozen=train.steps == 0)
    rows |= {
        f"{words.maps} to {words.verb}": f"{report.trials_to_train} (of {report.n_trials} wanted)",
        "references": ", ".join(report.references_to_train) or "none",
        "sampler": report.sampler,
        "pruner": report.pruner
        + (f" at steps {', '.join(map(str, report.pruning_rungs))}" if report.pruning_rungs else ""),
        "objective": report.objective,
        "budget": f"{report.budget.text} (at most {report.budget.max_layer_runs} layer runs)",
        "storage": report.storage + ("" if report.storage_exists else " (would be created)"),
        "space": report.space,
        "model": ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(report.model).items()),
        "data": f"{data.corpus}, {data.tokenizer}"
        + {True: " (tokens cached)", False: " (would be tokenized first)", None: ""}[data.tokens_cached],
        "train": f"{train.steps} steps, batch {train.batch_size}, lr {train.lr:g}, "
        f"{train.device} {train.dtype}, evaluations at {train.eval_steps}",
    }
    if not words.trains:
        del rows["train"], rows["references"]
        rows["evaluate"] = (
            f"frozen: no step trained; each map scores a chunk of {report.chunk_size} held-out windows or items, "
            f"batch {train.batch_size}, {train.device} {train.dtype}"
        )
    if report.knobs:
        rows["knobs"] = ", ".join(report.knobs)
    if len(report.parts) > 1:
        rows["parts"] = ", ".join(report.parts) + " (each repeated layer or block: whole, attention or MLP)"
    race, shape = report.race, report.race.shape
    left = " left" if resume else ""
    if race.decided:
        rows["race"] = (
            "decided"
            if not words.trains
            else f"{race.policy} at {race.target_steps} steps: decided ({race.steps_trained} steps trained)"
        )
    elif not words.trains and isinstance(shape, AdaptiveRace):
        rows["race"] = (
            f"frozen: {shape.screen} maps ranked on chunk 0 (the trials'), {shape.contenders} contenders (the plain "
            f"model among them) evaluated on {shape.first_test_seeds} to {shape.max_seeds - 1} test chunks, paired: "
            f"{race.runs_min} to {race.runs_max} evaluations{left}"
        )
    elif isinstance(shape, AdaptiveRace):
        rows["race"] = (
            f"adaptive at {race.target_steps} steps: {shape.screen} maps screened at seed 0, "
            f"{shape.contenders} contenders (the baseline among them) on {shape.first_test_seeds} to "
            f"{shape.max_seeds - 1} test seeds, equal compute {shape.equal_compute}: "
            f"{race.runs_min} to {race.runs_max} runs{left} ({race.steps_min} to "
            f"{race.steps_max} steps" + (f", capped at {race.cap}" if race.cap else "") + ")"
        )
    elif isinstance(shape, FixedRace):
        rows["race"] = (
            f"fixed: {shape.contenders} contenders at {shape.seeds} seeds at {shape.lengths} steps: "
            f"at most {race.steps_max} steps{left}"
        )
    else:
        rows["race"] = "off"
    if report.learn is not None:
        learn = report.learn
        rows["learn"] = (
            "learned already (the study holds its map)"
            if learn.learned
            else f"one gated model at the widest schedule ({learn.layer_runs} layer runs), {learn.steps} steps"
            + (" (the gates alone: weights fixed)" if learn.frozen else "")
            + (
                f", {_duration(report.estimate.learn_seconds)}"
                if report.estimate and report.estimate.learn_seconds
                else ""
            )
            + "; its map is then trained as a trial"
        )
    estimate = report.estimate
    if estimate is not None:
        rows["layout"] = estimate.layout
        for p in estimate.probes:
            per_step = f"{_milliseconds(p.seconds_per_step)}/step, " if words.trains else ""
            rows[f"probe {p.label}"] = (
                f"map {events.format_reuse_map(p.reuse_map)}: {per_step}{_milliseconds(p.seconds_per_eval)}/evaluation"
            )
        rows[f"per {words.map}"] = _duration(estimate.trial_seconds)
        low, high = estimate.seconds, estimate.seconds_max
        span = _duration(low) if _duration(low) == _duration(high) else f"{_duration(low)} to {_duration(high)}"
        rows["estimated time" + left] = f"{span} ({estimate.note})"
    if report.time_budget is not None:
        rows["time budget"] = f"{report.time_budget.text}: {report.time_budget.line}"
    key_value_table("dry run: nothing was written", rows)


def _milliseconds(seconds: float) -> str:
    """A probed time in milliseconds to three significant digits (0.0123 ms as such, never 0.0)."""
    return f"{seconds * 1000:.3g} ms"


def _duration(seconds: float) -> str:
    if seconds < 9.95:  # a short run in tenths, not 0m 00s
        return f"{seconds:.1f}s"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s"
