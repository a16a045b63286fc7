"""Figures of a study, built around its decision: the verdict as the title; on top, the perplexity at the decided
length (the race's, over its seeds, with intervals) against compute for the raced maps, the baseline as the
reference and the equal-compute deeper model; below, the proxy trials (complete ones at their final perplexity,
pruned and failed ones in a strip at the step they stopped), the layer view of the decided front, the proxies'
learning curves and the fidelity panel. A study that was not raced has its proxy trials on top.

Every panel has its own legend, to its right; every coloured trace has an entry there (or is in the group of
one that has), and every colour is a CSS colour."""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ilr_search.analysis.answer import Answer
from ilr_search.analysis.blocks import BlockCell, BlockGrid, BlockPanel
from ilr_search.analysis.fidelity import AuditReport, Fidelity, NoiseBand
from ilr_search.analysis.race_report import RaceReport
from ilr_search.analysis.replicates import Replicates
from ilr_search.analysis.results import (
    FrontRow,
    LayerView,
    as_list,
    is_baseline,
    knobs_text,
)
from ilr_search.analysis.stats import seed_interval
from ilr_search.storage.trials import TrialRecord
from ilr_search.training.schedule import Map, is_baseline_key, map_text

STATE_STYLE = {
    "COMPLETE": dict(symbol="circle", color="#1f77b4"),
    "PRUNED": dict(symbol="triangle-down-open", color="#ff7f0e"),
    "FAIL": dict(symbol="x", color="#d62728"),
}

LEGEND = {"COMPLETE": "complete trials"}
FRONT_COLOUR = "#d62728"  # the decided front
RACED_COLOUR = "#1f77b4"
SCREENED_COLOUR = "#7f7f7f"
DEEP_COLOUR = "#9467bd"
BASELINE_COLOUR = "#daa520"  # goldenrod: the star, its line and its band
BAND_COLOUR = "rgba(218,165,32,0.15)"
NOISE_COLOUR = "rgba(128,128,128,0.3)"

# Pixel sizes the figure is laid out in (its height is fixed, its width the page's: 800 px and up read well).
TOP_PX = 430  # the top panel (the decided one, or the proxy trials where the study was not raced)
PROXY_PX = 330  # the proxy trials under a decided panel
STRIP_ROW_PX = 26  # a line of the pruned / failed strip
CURVES_PX = 300
FIDELITY_PX = 270
GAP_PX = 100  # between panels: an x-axis title and the next panel's title
TITLE_CHARS = 100  # a line of the title (13 px text in about 700 px, the plot's width at 800 px)
LEGEND_CHARS = 30  # a line of a legend entry
LINE_PX = 18


@dataclass(frozen=True)
class PlottedTrial:
    """A trial as the figure draws it: its number, state, map, knobs (as text), FLOPs, perplexity and bits per
    byte, the perplexity it is drawn at (`plot_ppl`: its final one, or where it was pruned), its pruning step,
    why it failed, the trial whose result it reused, and its learning curve as (step, validation loss) points
    (none for a trial that reused another's result: that trial draws it)."""

    trial: int
    state: str
    reuse_map: tuple[int, ...] | None
    knobs: str | None
    flops_ratio: float | None
    val_ppl: float | None
    val_bpb: float | None
    plot_ppl: float | None
    pruned_at_step: int | None = None
    reason: str | None = None
    reused_from: int | None = None
    curve: tuple[tuple[int, float], ...] = ()
    map: str | None = None  # the map as its key writes it (a block map's block:I-J:R), where the trial has a key
    params: int | None = None  # the parameters its map uses (adapters included)

    @classmethod
    def of(cls, record: TrialRecord, curve: Mapping[int, float]) -> PlottedTrial:
        """The trial of `record` with its learning curve (its own, or that of the trial whose result it reused)."""
        return cls(
            record.number,
            record.state.name,
            record.reuse_map,
            knobs_text(record),
            record.flops_ratio,
            record.val_ppl,
            record.val_bpb,
            plot_ppl(record.val_ppl, curve),
            record.pruned_at_step,
            record.reason,
            record.reused_from,
            tuple(sorted(curve.items())) if not record.is_reuse else (),
            map_text(record.map_key) if record.map_key else None,
            record.param_count,
        )


def _hover(rows: list[PlottedTrial]) -> list[str]:
    """Each trial's hover text (_hover_text), with where it was pruned, why it failed and whose result it reused."""
    return [
        _hover_text(r, r.state, r.plot_ppl)
        + (f"<br>pruned at step {r.pruned_at_step} (ppl there)" if r.pruned_at_step else "")
        + (f"<br>{r.reason}" if r.state == "FAIL" and r.reason else "")
        + (f"<br>the result of trial {r.reused_from} (same map)" if r.reused_from is not None else "")
        for r in rows
    ]


def _hover_text(point: PlottedTrial | FrontRow, state: str, ppl: float | None) -> str:
    """A trial's (or a front point's) hover text: its trial, `state`, map (as its key writes it, where it has one;
    else its counts), knobs, FLOPs, parameters, perplexity `ppl` and bpb."""
    knobs_line = f"<br>knobs {point.knobs}" if point.knobs else ""
    shown = point.map or ",".join(map(str, point.reuse_map or []))
    params_text = f" · {point.params:,} params" if point.params is not None else ""
    flops_ratio = cast(float, point.flops_ratio)  # a plotted trial has its FLOPs
    return (
        f"trial {point.trial} ({state.lower()})<br>map {shown}{knobs_line}"
        f"<br>FLOP ratio {flops_ratio:.3f}{params_text}<br>ppl {_num(ppl)}<br>bpb {_num(point.val_bpb)}"
    )


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def _wrapped(text: str, width: int = LEGEND_CHARS) -> str:
    """Text broken into lines of at most `width` characters (plotly does not wrap: <br> does)."""
    return "<br>".join(textwrap.wrap(text, width, break_long_words=False)) or text


@dataclass(frozen=True)
class Place:
    """Where a panel draws: its figure, row and column, and the legend its traces are listed in."""

    fig: go.Figure
    row: int
    legend: str = "legend"
    col: int = 1

    def draw(self, trace: Any) -> None:
        """A made trace (a heatmap: listed in no legend) in this panel."""
        self.fig.add_trace(trace, row=self.row, col=self.col)

    def add(self, kind: Callable[..., Any], **props: Any) -> None:
        """A trace of `kind` (go.Scatter, go.Bar) with `props`, listed in this panel's legend."""
        self.draw(kind(legend=self.legend, **props))

    def x_axis(self, **props: Any) -> None:
        self.fig.update_xaxes(row=self.row, col=self.col, **props)

    def y_axis(self, **props: Any) -> None:
        self.fig.update_yaxes(row=self.row, col=self.col, **props)

    def axis_name(self) -> str:
        """Its x-axis as a trace or an axis refers to it ("x2" for "xaxis2")."""
        return cast(str, self.fig.get_subplot(self.row, self.col).xaxis.plotly_name.replace("axis", ""))


LOG_SPAN = 10.0  # a perplexity axis whose largest value is more than this many times its smallest is logarithmic


def log_axis(values: Sequence[float | None]) -> bool:
    """Whether perplexities `values` span decades (max / min > LOG_SPAN): a linear axis would flatten all but the
    largest to its floor."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return bool(finite) and max(finite) / min(finite) > LOG_SPAN


def ppl_axis(place: Place, values: Sequence[float | None], title: str) -> None:
    """A panel's perplexity axis, fitted to `values`: logarithmic where they span decades (log_axis), else linear."""
    if log_axis(values):
        logs = [math.log10(v) for v in values if v is not None and math.isfinite(v) and v > 0]
        place.y_axis(type="log", title_text=f"{title} (log scale)", range=fitted_range(logs))
    else:
        place.y_axis(title_text=title, range=fitted_range(list(values)), tickformat=".4g")


def spread_x(points: list[tuple[float, float]], span: float, step_share: float = 0.012) -> list[float]:
    """x positions that spread points sharing one FLOP ratio side by side (in order of their y), centred on
    the ratio, `step_share` of the axis span apart: eight maps at 1.476x are eight points, not one. A group keeps
    within 0.8 of the gap to the nearest other ratio (its points closer together where it must), so no point is
    drawn nearer another ratio than its own."""
    groups: dict[float, list[int]] = {}
    for i, (x, _) in enumerate(points):
        groups.setdefault(round(x, 6), []).append(i)
    steps = _group_steps({x: len(m) for x, m in groups.items()}, step_share * span)
    spread = [x for x, _ in points]
    for x, members in groups.items():
        members.sort(key=lambda i: points[i][1])
        for k, i in enumerate(members):
            spread[i] = points[i][0] + (k - (len(members) - 1) / 2) * steps[x]
    return spread


def _group_steps(sizes: dict[float, int], step: float) -> dict[float, float]:
    """The spacing of each group of points at one ratio (spread_x): `step`, or less where the group's width would
    pass 0.8 of the gap to the nearest other ratio."""
    ratios = sorted(sizes)
    steps = {}
    for k, x in enumerate(ratios):
        neighbours = ratios[max(0, k - 1) : k] + ratios[k + 1 : k + 2]
        room = 0.8 * min(abs(x - n) for n in neighbours) if neighbours else math.inf
        steps[x] = min(step, room / (sizes[x] - 1)) if sizes[x] > 1 else 0.0
    return steps


def fitted_range(values: Sequence[float | None], pad: float = 0.08) -> list[float] | None:
    """An axis range around `values` with `pad` of their span (or of their size, for one value) either side."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    lo, hi = min(finite), max(finite)
    margin = (hi - lo) * pad or abs(hi) * 0.02 or 1.0
    return [lo - margin, hi + margin]


def spread_range(xs: list[float], pad: float = 0.05, step_share: float = 0.012) -> list[float] | None:
    """fitted_range of `xs`, widened by the room that spread_x takes for the groups at the ends."""
    fitted = fitted_range(xs, pad)
    if fitted is None:
        return None
    counts: dict[float, int] = {}
    for x in xs:
        counts[round(x, 6)] = counts.get(round(x, 6), 0) + 1
    steps = _group_steps(counts, step_share * (fitted[1] - fitted[0]))
    lo, hi = min(counts), max(counts)
    return [
        fitted[0] - (counts[lo] - 1) / 2 * steps[lo] * 1.5,
        fitted[1] + (counts[hi] - 1) / 2 * steps[hi] * 1.5,
    ]


# ----------------------------------------------------------------------------------------------------
# The decided panel: the raced maps at the decided length.


@dataclass(frozen=True)
class RacedPoint:
    """A map at the decided length: its mean perplexity over its seeds there, with the race's interval (None
    with one seed). kind: "front" (on the decided front, not shown better than the baseline), "confirmed" (on
    it, claimed better), "baseline" (the reference), "raced" (off the front, several seeds), "screened" (off
    the front, one seed: the adaptive race's screen) or "deep" (the equal-compute plain model)."""

    map_key: str
    trial: int | None
    flops_ratio: float
    steps: int
    seeds: tuple[int, ...]
    val_ppl: float
    interval: tuple[float, float] | None
    kind: str


def is_raced(race: RaceReport | None) -> bool:
    """Whether the decided front is the race's: a point at more than one seed or past the proxy's length
    (else the decided front is the proxy's, and there is no decided panel)."""
    if race is None or not race.front:
        return False
    base = race.settings.base_steps
    return any(p.beyond_proxy(base) for p in race.front)


def decided_steps(race: RaceReport) -> int:
    """The length the decided front stands at (the target, once the race got there)."""
    return max(cast(int, p.steps) for p in race.front)  # a point of the race's front has its length


def raced_points(race: RaceReport) -> list[RacedPoint]:
    """Every map the race has results for at the decided length (the trials' maps, the baseline and the
    equal-compute model; not a pruned map an audit retrained), cheapest first: each one's mean and interval
    over its seeds there, at the race's confidence (as the race's own front computes them)."""
    steps, trial_maps = decided_steps(race), race.trial_maps
    front = {p.key: p for p in race.front}
    equal = race.equal_compute
    losses: dict[str, dict[int, float]] = {}
    flops: dict[str, float] = {}

    def counted(key: str) -> bool:
        if Map.form_of(key) == "deeper":
            return equal is not None and key == equal.deep_key
        return key in trial_maps or key in front or is_baseline_key(key)

    for r in race.results:
        if r.steps == steps and r.val_loss is not None and counted(r.map_key):
            losses.setdefault(r.map_key, {})[r.seed] = r.val_loss
            flops[r.map_key] = r.flops_ratio
    points = []
    for key, by_seed in losses.items():
        iv = seed_interval([by_seed[s] for s in sorted(by_seed)], race.settings.confidence)
        row = front.get(key)
        if Map.form_of(key) == "deeper":
            kind = "deep"
        elif is_baseline_key(key):
            kind = "baseline"
        elif row is not None:
            kind = "confirmed" if row.confirmed else "front"
        else:
            kind = "raced" if len(by_seed) > 1 else "screened"
        points.append(
            RacedPoint(
                key,
                row.trial if row else None,
                flops[key],
                steps,
                tuple(sorted(by_seed)),
                iv.val_ppl,
                iv.interval_ppl,
                kind,
            )
        )
    return sorted(points, key=lambda p: (p.flops_ratio, p.val_ppl, p.map_key))


RACED_STYLE: dict[str, tuple[str, dict[str, Any]]] = {  # kind -> legend entry and marker
    "confirmed": (
        "decided front: better than the baseline",
        dict(symbol="square", size=12, color=FRONT_COLOUR, line=dict(width=2, color=FRONT_COLOUR)),
    ),
    "front": (
        "decided front: not shown better",
        dict(symbol="square-open", size=12, color=FRONT_COLOUR, line=dict(width=2, color=FRONT_COLOUR)),
    ),
    "raced": ("raced, off the front", dict(symbol="circle", size=9, color=RACED_COLOUR)),
    "screened": (
        "screened at one seed (no interval)",
        dict(symbol="circle-open", size=9, color=SCREENED_COLOUR, line=dict(width=2, color=SCREENED_COLOUR)),
    ),
}


def _decided_panel(place: Place, race: RaceReport) -> None:
    """The raced maps at the decided length against their FLOP ratio, with error bars from the race's intervals; the
    decided front as a step line; the baseline as the reference (its star, a dashed line at its mean and a band over
    its interval across the panel); the equal-compute plain model. One y-axis, logarithmic where the perplexities
    span decades (log_axis)."""
    points = raced_points(race)
    words = Replicates.of(race.settings)
    pct = round(race.settings.confidence * 100)
    x_range = spread_range([p.flops_ratio for p in points], pad=0.08)
    span = (x_range[1] - x_range[0]) if x_range else 1.0
    at_x = dict(
        zip((p.map_key for p in points), spread_x([(p.flops_ratio, p.val_ppl) for p in points], span), strict=True)
    )

    def hover(p: RacedPoint) -> str:
        iv = f" [{p.interval[0]:.4g}, {p.interval[1]:.4g}]" if p.interval else f" (one {words.unit}: no interval)"
        trial = f" (trial {p.trial})" if p.trial is not None else ""
        where = f"{p.steps} steps, " if words.trains else ""
        return (
            f"map {p.map_key}{trial}<br>FLOP ratio {p.flops_ratio:.3f}<br>{where}{words.plural} "
            f"{','.join(map(str, p.seeds))}<br>ppl {p.val_ppl:.4g}{iv}"
        )

    def add_markers(group: list[RacedPoint], name: str, marker: dict[str, Any], **group_args: Any) -> None:
        """The points of `group` as markers with error bars over their intervals, in one legend entry; a point
        with no interval (one seed or chunk) has no bar (None, which plotly.js leaves undrawn)."""
        error_y = None
        if any(p.interval for p in group):
            error_y = dict(
                type="data",
                symmetric=False,
                color=marker["color"],
                thickness=1.5,
                width=5,
                array=[p.interval[1] - p.val_ppl if p.interval else None for p in group],
                arrayminus=[p.val_ppl - p.interval[0] if p.interval else None for p in group],
            )
        place.add(
            go.Scatter,
            x=[at_x[p.map_key] for p in group],
            y=[p.val_ppl for p in group],
            mode="markers",
            name=_wrapped(name),
            marker=marker,
            error_y=error_y,
            hovertext=[hover(p) for p in group],
            hoverinfo="text",
            **group_args,
        )

    front_keys = {r.key for r in race.front}
    on_front = [p for p in points if p.kind in ("confirmed", "front", "baseline") and p.map_key in front_keys]
    if len(on_front) > 1:
        place.add(
            go.Scatter,
            x=[at_x[p.map_key] for p in on_front],
            y=[p.val_ppl for p in on_front],
            mode="lines",
            line_shape="hv",
            line=dict(color=FRONT_COLOUR, width=2),
            name="decided front",
            hoverinfo="skip",
        )
    baseline = next((p for p in points if p.kind == "baseline"), None)
    if baseline is not None and x_range:
        low, high = baseline.interval or (baseline.val_ppl, baseline.val_ppl)
        # the baseline's interval band and its mean line: in the baseline's legend group, with no entry or hover
        band_and_line: dict[str, Any] = dict(mode="lines", hoverinfo="skip", showlegend=False, legendgroup="baseline")
        place.add(
            go.Scatter,
            x=[x_range[0], x_range[1], x_range[1], x_range[0], x_range[0]],
            y=[low, low, high, high, low],
            fill="toself",
            fillcolor=BAND_COLOUR,
            line=dict(width=0, color=BAND_COLOUR),
            **band_and_line,
        )
        line = dict(color=BASELINE_COLOUR, width=1.5, dash="dash")
        place.add(go.Scatter, x=x_range, y=[baseline.val_ppl] * 2, line=line, **band_and_line)
        add_markers(
            [baseline],
            f"the plain model (the reference): mean, {pct}% interval",
            dict(symbol="star", size=17, color=BASELINE_COLOUR, line=dict(width=1, color="black")),
            legendgroup="baseline",
        )
    for kind, (name, marker) in RACED_STYLE.items():
        group = [p for p in points if p.kind == kind]
        if kind == "screened" and not words.trains:
            name = f"screened on one {words.unit} (no interval)"
        if group:
            add_markers(group, name, marker)
    equal = race.equal_compute
    deep = next((p for p in points if p.kind == "deep"), None)
    if deep is not None:
        add_markers(
            [deep],
            f"{deep.map_key}: a plain {equal.layers if equal else '?'}-layer model of "
            f"{equal.map if equal else 'the best map'}'s FLOPs",
            dict(symbol="diamond", size=13, color=DEEP_COLOUR, line=dict(width=1, color="black")),
        )
    place.x_axis(title_text=FLOP_AXIS, range=x_range)
    ppl_axis(
        place,
        [v for p in points for v in (p.val_ppl, *(p.interval or ()))],
        f"perplexity {words.at(decided_steps(race))}",
    )


FLOP_AXIS = "FLOP ratio (forward compute / the plain model's)"


def verdict_title(study: str, answer: Answer | None, verdict: str = "") -> str:
    """The figure's title: the study's name and its answer line in bold, the trust line (the proxy-to-target rank
    agreement) in italics, then its verdict, a clause a line (wrapped at TITLE_CHARS); without an answer, the study's
    name."""
    if answer is None:
        return f"<b>{study}</b>"
    lines = [f"<b>{line}</b>" for line in textwrap.wrap(f"{study}: {answer.line}", TITLE_CHARS, break_long_words=False)]
    if answer.trust is not None:  # how far the proxy's order can be trusted, beside the answer
        lines += [f"<i>{line}</i>" for line in textwrap.wrap(f"trust: {answer.trust.text()}", TITLE_CHARS)]
    clauses = [c.strip() for c in verdict.split("; ")] if verdict else []
    for i, clause in enumerate(clauses):
        lines += textwrap.wrap(clause + (";" if i < len(clauses) - 1 else ""), TITLE_CHARS, break_long_words=False)
    return "<br>".join(lines)


# ----------------------------------------------------------------------------------------------------
# The whole figure.


@dataclass(frozen=True)
class Panel:
    """One row of the figure: what it shows, its subplot spec and titles, its height in pixels and its legend (the
    legend of panel `legend_of` where it shares that one's)."""

    kind: str
    spec: list[Any]
    titles: list[str]
    px: int
    legend: str = "legend"
    legend_of: str | None = None

    @classmethod
    def wide(cls, kind: str, title: str, px: int) -> Panel:
        """A panel that takes the whole row, under one title."""
        return cls(kind, [{"colspan": 2}, None], [title], px)


def pareto_figure(
    study: str,
    trials: list[PlottedTrial],
    front: list[FrontRow],
    noise: NoiseBand | None,
    layer_view: LayerView | None = None,
    fidelity: Fidelity | None = None,
    race: RaceReport | None = None,
    answer: Answer | None = None,
    blocks: BlockGrid | None = None,
) -> go.Figure:
    """The study's figure, titled with the study's answer and the race's verdict (`race`: the study's race,
    None where it has none). On top, for a study that searches block maps (`blocks`: its grid), the (start, end)
    grid of the blocks, a panel per repeat count (_blocks_panels); then, where the study was raced, the raced maps at
    the decided length (_decided_panel); then the proxy trials: complete ones by final perplexity against FLOP ratio
    (points at one ratio spread side by side, hover for the map), the proxy's front as a step line, the plain model
    (the baseline) and its seed-to-seed noise band, and pruned and failed trials in a strip below at their pruning step
    (their perplexity there is no final one: it stays off the perplexity axis, which fits the complete trials); the
    layer view of the decided front (`layer_view`: its reuse counts, where it has maps, and the importances), the
    proxies' learning curves, and a fidelity panel (rung agreement, proxy vs audit, the verdict). A frozen study
    (its maps evaluated on pretrained weights, no step trained) has no learning curves and no fidelity panel: both
    are about training."""
    words = Replicates.of(race.settings if race is not None else None)
    if not words.trains:
        fidelity = None
    audit = fidelity.audits[-1] if fidelity is not None and fidelity.audits else None
    decided = race if race is not None and is_raced(race) else None
    plotted = [t for t in trials if t.flops_ratio is not None]
    complete = [t for t in plotted if t.state == "COMPLETE" and t.plot_ppl is not None]
    apart = [t for t in plotted if t not in complete]  # pruned, failed (diverged), or with no perplexity
    curved = [t for t in plotted if t.curve] if words.trains else []
    block_panels = blocks.panels() if blocks is not None else []
    panels = _with_legends(
        [
            *_block_rows(blocks, block_panels),
            *([_decided_row(decided)] if decided is not None else []),
            _proxy_row(race, words, tall=decided is None and blocks is None),
            *([_apart_row(apart)] if apart else []),
            *_layers_rows(layer_view, decided),
            *([Panel.wide("curves", CURVES_TITLE, CURVES_PX)] if curved else []),
            *([_fidelity_row(audit)] if fidelity else []),
        ]
    )
    plot_px = sum(p.px for p in panels) + GAP_PX * (len(panels) - 1)
    fig = make_subplots(
        rows=len(panels),
        cols=2,
        specs=[p.spec for p in panels],
        row_heights=[p.px / sum(q.px for q in panels) for p in panels],
        vertical_spacing=GAP_PX / plot_px,
        horizontal_spacing=0.14 if not blocks else 0.08,
        subplot_titles=[t for p in panels for t in p.titles],
    )
    fig.update_annotations(font_size=13)  # the panels' titles
    place = {p.kind: Place(fig, i + 1, p.legend) for i, p in enumerate(panels)}
    if blocks is not None and block_panels:
        _blocks_panels(place["blocks0"], blocks, block_panels)
    if decided is not None:
        _decided_panel(place["decided"], decided)
    x_range = spread_range([cast(float, t.flops_ratio) for t in plotted])
    span = (x_range[1] - x_range[0]) if x_range else 1.0
    _proxy_panel(place["proxy"], complete, front, noise, x_range, span, words)
    if apart:
        _apart_strip(place["apart"], apart, span, x_range, place["proxy"])
    if "layers" in place and layer_view:
        _layers_panel(place["layers"], layer_view)
    if curved:
        front_trials = {p.trial for p in (decided.front if decided is not None else front) if p.trial is not None}
        _curves_panel(place["curves"], curved, front_trials)
    bottom = 60
    if fidelity:
        bottom = 90 + LINE_PX * _fidelity_panel(place["fidelity"], fidelity, audit)
    _place_legends(fig, panels, place)
    _title_and_size(fig, verdict_title(study, answer, race.verdict if race is not None else ""), plot_px, bottom)
    return fig


CURVES_TITLE = "validation loss against step (the decided front's maps in colour)"


def _block_rows(blocks: BlockGrid | None, block_panels: list[BlockPanel]) -> list[Panel]:
    """The block grid's rows: two panels a row (the last may be alone); the only one takes the row."""
    rows = []
    for i in range(0, len(block_panels), 2):
        pair = block_panels[i : i + 2]
        spec = [{}, {}] if len(pair) == 2 else [{"colspan": 2}, None] if len(block_panels) == 1 else [{}, None]
        titles = [block_title(panel, blocks) for panel in pair if blocks is not None]
        rows.append(Panel(f"blocks{i // 2}", spec, titles, BLOCKS_PX, legend_of="blocks0" if i else None))
    return rows


def _decided_row(race: RaceReport) -> Panel:
    words, pct = Replicates.of(race.settings), round(race.settings.confidence * 100)
    title = f"raced maps {words.at(decided_steps(race))}: mean perplexity over {words.plural}, {pct}% intervals"
    return Panel.wide("decided", title, TOP_PX)


def _proxy_row(race: RaceReport | None, words: Replicates, tall: bool) -> Panel:
    """The trials' row: the proxy's (at its length, a seed each), or a frozen study's screen (its first chunk);
    `tall` where it is the figure's top panel."""
    if race is not None and not words.trains:
        title = f"trials on {words.one(race.settings.seeds[0])} (the screen): perplexity vs compute"
    else:
        at = f" at {race.settings.base_steps} steps" if race is not None and race.settings.base_steps else ""
        title = f"proxy trials{at} (one seed each): perplexity vs compute"
    return Panel.wide("proxy", title, TOP_PX if tall else PROXY_PX)


def _apart_row(apart: list[PlottedTrial]) -> Panel:
    """The strip's row, a line per pruning step (and one for failed runs), in the proxy panel's legend."""
    title = "pruned and failed trials (at the step they stopped; not a final perplexity)"
    px = 30 + STRIP_ROW_PX * len({_apart_label(t) for t in apart})
    return dataclasses.replace(Panel.wide("apart", title, px), legend_of="proxy")


def _layers_rows(layer_view: LayerView | None, decided: RaceReport | None) -> list[Panel]:
    """The layer view's row: the front's reuse counts beside the importances, or a block study's importances."""
    if layer_view and layer_view.front_maps:
        where = "front's reuse counts" + (f", {decided_steps(decided)} steps" if decided is not None else "")
        px = max(200, 70 + 30 * len(layer_view.front_maps))
        return [Panel("layers", [{}, {}], [where, "layer importance (proxy trials)"], px)]
    if layer_view and layer_view.importance:  # a block study's: the importance of each block parameter alone
        return [Panel.wide("layers", "importance for perplexity (PED-ANOVA over the trials)", 240)]
    return []


def _fidelity_row(audit: AuditReport | None) -> Panel:
    audited = f"proxy vs {audit.factor}x training" if audit else "not audited (ilr-search audit)"
    return Panel("fidelity", [{}, {}], ["rung agreement (within the proxy)", audited], FIDELITY_PX)


def _with_legends(panels: list[Panel]) -> list[Panel]:
    """The panels, each with its legend: its own, or the one of the panel it shares a legend with."""
    legends = iter(["legend", "legend2", "legend3", "legend4", "legend5", "legend6"])
    named: dict[str, str] = {}
    for panel in panels:
        named[panel.kind] = named[panel.legend_of] if panel.legend_of else next(legends)
    return [dataclasses.replace(p, legend=named[p.kind]) for p in panels]


def _place_legends(fig: go.Figure, panels: list[Panel], place: dict[str, Place]) -> None:
    """Each legend at the right of its panel, from its top down (the blocks': under the colour scale)."""
    for panel in panels:
        if panel.legend_of:  # drawn with that panel's
            continue
        domain = fig.get_subplot(place[panel.kind].row, 1).yaxis.domain
        at_top = panel.kind != "blocks0"
        fig.update_layout(
            {
                panel.legend: dict(
                    x=1.02,
                    xanchor="left",
                    y=domain[1] if at_top else domain[0],
                    yanchor="top" if at_top else "bottom",
                    xref="paper",
                    yref="paper",
                    font=dict(size=11),
                    tracegroupgap=2,
                    bgcolor="rgba(255,255,255,0.9)",
                )
            }
        )


def _title_and_size(fig: go.Figure, title: str, plot_px: int, bottom: int) -> None:
    """The figure's title at its top left, and its height: the panels' and the margins' (the title's lines on top,
    the fidelity panel's lines below)."""
    top = 34 + LINE_PX * (title.count("<br>") + 1) + 46
    fig.update_layout(
        template="plotly_white",
        autosize=True,
        height=plot_px + top + bottom,
        title=dict(
            text=title,
            x=0,
            xref="paper",
            xanchor="left",
            y=1,
            yref="container",
            yanchor="top",
            pad=dict(t=34),
            font=dict(size=13),
        ),
        margin=dict(l=70, r=20, t=top, b=bottom),
    )


# ----------------------------------------------------------------------------------------------------
# The block grid: a panel per repeat count, start layer down, end layer across.

BLOCKS_PX = 470  # a row of block panels
# ColorBrewer's RdBu, blue (a lower loss than the plain model's) through near-white (level) to red (a higher one)
DIVERGING = ["#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b"]
MARK_STYLE: dict[str, tuple[str, dict[str, Any]]] = {  # a cell's decision -> legend entry and marker
    "claimed": (
        "claimed better than the plain model (paired test)",
        dict(symbol="star", color="#111111", line=dict(width=1, color="white")),
    ),
    "against": (
        "decided against: cannot win, dominated, worse or diverged",
        dict(symbol="x", color="#111111", line=dict(width=1, color="white")),
    ),
    "undecided": (
        "raced, undecided (open, or its chunks spent)",
        dict(symbol="circle-open", color="#111111", line=dict(width=2, color="#111111")),
    ),
}
CELL_TEXT_LAYERS = 12  # grids of up to this many layers print each cell's difference in it


def block_title(panel: BlockPanel, grid: BlockGrid) -> str:
    """A block panel's title: its repeat count (and knobs) and what its colour is."""
    runs = {2: "twice"}.get(panel.repeats, f"{panel.repeats} times")
    knobs = f", {panel.knobs}" if panel.knobs else ""
    what = Replicates.of(grid.settings).held_out
    return f"blocks run {runs} (R = {panel.repeats}{knobs}): {what} minus the plain model's"


def block_hover(cell: BlockCell, grid: BlockGrid) -> str:
    """A cell's hover text: its block, FLOPs, the difference (and as perplexity at the plain model's), the race's
    interval, status and chunks where it was raced, else the chunk it was screened on."""
    words, unit = Replicates.of(grid.settings), grid.unit
    layers = f"layer {cell.start}" if cell.start == cell.end else f"layers {cell.start} to {cell.end}"
    lines = [f"<b>{cell.map_key}</b> ({layers} run {cell.repeats} times)", f"FLOP ratio {cell.flops_ratio:.3f}"]
    if cell.diff is None:
        lines.append("no loss: it diverged")
    else:
        ppl = grid.ppl_diff(cell.diff)
        at = f" (ppl {ppl:+.3g} at the plain model's {grid.plain_ppl:.4g})" if ppl is not None else ""
        lines.append(f"loss minus the plain model's: {cell.diff:+.4g} {unit}{at}")
    if cell.interval is not None:
        pct = round(grid.settings.confidence * 100)
        lines.append(f"{pct}% interval {cell.interval[0]:+.4g} to {cell.interval[1]:+.4g} {unit}")
    if cell.source == "raced":
        paired = f", {cell.units} {words.paired}s paired" if cell.units else ""
        lines.append(f"{cell.status}: raced on {words.count(len(cell.chunks), test=True)}{paired}")
    else:
        lines.append(f"{cell.status}: {words.one(cell.chunks[0])} only (the screen)")
    return "<br>".join(lines)


def _blocks_panels(first: Place, grid: BlockGrid, panels: list[BlockPanel]) -> None:
    """The block grid's panels, two a row from `first`'s: each block's cell coloured by its difference to the plain
    model on one diverging scale centred on 0 (shared by the panels; clipped at BlockGrid.colour_limit, so that a
    catastrophe saturates: the hover has the true value), with the race's decision marked in the cell's corner."""
    fig, n = first.fig, grid.n_layers
    limit = grid.colour_limit()
    clipped = any(c.diff is not None and abs(c.diff) > limit for c in grid.cells)
    marker_size = max(6, min(12, round(240 / n)))
    shown: set[str] = set()
    for k, panel in enumerate(panels):
        place = dataclasses.replace(first, row=first.row + k // 2, col=k % 2 + 1)
        z: list[list[float | None]] = [[None] * n for _ in range(n)]
        hover = [[""] * n for _ in range(n)]
        text = [[""] * n for _ in range(n)]
        for c in panel.cells:
            z[c.start][c.end] = c.diff
            hover[c.start][c.end] = block_hover(c, grid)
            text[c.start][c.end] = f"{c.diff:+.2g}" if c.diff is not None else "diverged"
        small = n <= CELL_TEXT_LAYERS
        place.draw(
            go.Heatmap(
                z=z,
                x=list(range(n)),
                y=list(range(n)),
                coloraxis="coloraxis",
                hovertext=hover,
                hoverinfo="text",
                hoverongaps=False,
                xgap=1,
                ygap=1,
                showlegend=False,
                **(dict(text=text, texttemplate="%{text}", textfont=dict(size=11)) if small else {}),
            )
        )
        for decision, (name, style) in MARK_STYLE.items():
            cells = [c for c in panel.cells if c.decision == decision]
            if not cells:
                continue
            place.add(
                go.Scatter,  # in the cell's top right corner, clear of its number
                x=[c.end + 0.3 for c in cells],
                y=[c.start - 0.3 for c in cells],
                mode="markers",
                name=_wrapped(name),
                legendgroup=decision,
                showlegend=decision not in shown,
                marker=dict(size=marker_size, **style),
                hovertext=[block_hover(c, grid) for c in cells],
                hoverinfo="text",
            )
            shown.add(decision)
        plain: dict[str, Any] = dict(showgrid=False, zeroline=False)  # (the axes' settings keep this order)
        ticks = dict(dtick=1) if n <= 16 else dict(dtick=2 if n <= 32 else 4)
        x_title, x_range = "J: the block's last layer", [-0.5, n - 0.5]
        place.x_axis(title_text=x_title, range=x_range, **plain, constrain="domain", constraintoward="left", **ticks)
        y_range = [n - 0.5, -0.5]  # layer 0 at the top: the blocks lie above the diagonal
        anchor = place.axis_name()
        place.y_axis(
            title_text="I: its first layer", range=y_range, **plain, scaleanchor=anchor, constrain="domain", **ticks
        )
    top = fig.get_subplot(first.row, 1).yaxis.domain[1]
    scale = [-limit, -limit / 2, 0.0, limit / 2, limit]
    labels = [f"{v:+.2g}" if v else "0" for v in scale]
    if clipped:  # the ends stand for everything beyond them
        labels[0], labels[-1] = f"≤ {scale[0]:+.2g}", f"≥ {scale[-1]:+.2g}"
    fig.update_layout(
        coloraxis=dict(
            colorscale=[[i / (len(DIVERGING) - 1), c] for i, c in enumerate(DIVERGING)],
            cmin=-limit,
            cmax=limit,
            colorbar=dict(
                title=dict(text=f"block minus<br>plain model<br>({grid.unit})<br> ", side="top", font=dict(size=11)),
                x=1.02,
                xanchor="left",
                y=top,
                yanchor="top",
                len=BLOCKS_PX * 0.5,
                lenmode="pixels",
                thickness=14,
                tickvals=scale,
                ticktext=labels,
                tickfont=dict(size=10),
            ),
        )
    )


def _proxy_panel(
    place: Place,
    complete: list[PlottedTrial],
    front: list[FrontRow],
    noise: NoiseBand | None,
    x_range: list[float] | None,
    span: float,
    words: Replicates,
) -> None:
    """The complete proxy trials by final perplexity, the proxy's front, the plain model (the baseline), the noise
    band (a frozen study's: the trials on the screening chunk, their front)."""
    at_x: dict[int | None, float] = dict(  # trial -> x; a front point without a trial keeps its ratio
        zip(
            (t.trial for t in complete),
            spread_x([(cast(float, t.flops_ratio), cast(float, t.plot_ppl)) for t in complete], span),
            strict=True,
        )
    )
    if complete:
        place.add(
            go.Scatter,
            x=[at_x[t.trial] for t in complete],
            y=[t.plot_ppl for t in complete],
            mode="markers",
            name=LEGEND["COMPLETE"],
            marker=dict(size=9, **STATE_STYLE["COMPLETE"]),
            hovertext=_hover(complete),
            hoverinfo="text",
        )
    if front:
        place.add(
            go.Scatter,
            x=[at_x.get(p.trial, p.flops_ratio) for p in front],
            y=[p.val_ppl for p in front],
            mode="lines+markers",
            line_shape="hv",
            name=words.screen,
            line=dict(color="black", width=1.5),
            marker=dict(size=12, color="rgba(0,0,0,0)", line=dict(width=2, color="black")),
            hovertext=[_hover_text(p, "COMPLETE", p.val_ppl) for p in front],
            hoverinfo="text",
        )
    baseline = next((t for t in complete if is_baseline(as_list(t.reuse_map))), None)
    if baseline:
        place.add(
            go.Scatter,
            x=[at_x[baseline.trial]],
            y=[baseline.plot_ppl],
            mode="markers",
            name="the plain model",
            marker=dict(symbol="star", size=16, color=BASELINE_COLOUR, line=dict(width=1, color="black")),
            hoverinfo="skip",
        )
    y_values = [cast(float, t.plot_ppl) for t in complete]
    if noise and noise.spread:
        lo, hi = noise.min_ppl, noise.max_ppl
        y_values += [lo, hi]
        place.fig.add_hrect(y0=lo, y1=hi, fillcolor="#808080", opacity=0.15, line_width=0, row=place.row, col=1)
        place.add(  # the band's legend entry
            go.Scatter,
            x=[None],
            y=[None],
            mode="markers",
            hoverinfo="skip",
            name=_wrapped(f"baseline seed-to-seed spread ({noise.n_seeds} seeds)"),
            marker=dict(symbol="square", size=14, color=NOISE_COLOUR),
        )
    place.x_axis(title_text=FLOP_AXIS, range=x_range)
    ppl_axis(place, y_values, words.screen_axis)


def _layers_panel(place: Place, layer_view: LayerView) -> None:
    """The reuse counts of the decided front's maps (a heatmap, one row a map) and each layer's importance; a view
    without maps (a block study's) has its importances alone, across the row."""
    maps = layer_view.front_maps
    if maps:  # (the panel is drawn only where there are maps or importances)
        counts = [list(m.reuse_map or ()) for m in maps]

        def label(m: FrontRow) -> str:
            who = f"trial {m.trial}" if m.trial is not None else ",".join(map(str, m.reuse_map or ()))
            knobs = f"<br>{m.knobs}" if m.knobs else ""
            return f"{who}{knobs}<br>{m.flops_ratio:.2f}x, ppl {m.val_ppl:.5g}"

        place.draw(
            go.Heatmap(
                z=counts,
                x=[f"layer {i}" for i in range(len(counts[0]))],
                y=[label(m) for m in maps],
                colorscale="Blues",
                zmin=1,
                zmax=max([2] + [max(c) for c in counts]),
                showscale=False,
                texttemplate="%{z}",
                hovertemplate="%{y}<br>%{x}: %{z} runs<extra></extra>",
            )
        )
    importance = layer_view.importance
    if importance:
        dataclasses.replace(place, col=2 if maps else 1).add(
            go.Bar,
            x=list(importance),
            y=list(importance.values()),
            name="importance (PED-ANOVA)",
            marker_color="#2ca02c",
        )


# A label's size as a share of a small panel's axis spans (9 px text in a panel about 300 x 200 px: the
# figure at about 760 px wide; wider figures leave more room).
LABEL_CHAR_SHARE = 0.018
LABEL_HEIGHT_SHARE = 0.09
LABEL_PLACES = (
    "top center",
    "bottom center",
    "middle right",
    "middle left",
    "top right",
    "bottom left",
    "top left",
    "bottom right",
)


def label_positions(
    points: list[tuple[float, float]], labels: list[str], x_range: list[float] | None, y_range: list[float] | None
) -> list[str]:
    """A text position for each point's label that overlaps no label placed before it and no other point,
    within the axes where it can (the first free place of LABEL_PLACES; the first place if none is free)."""
    if not points or x_range is None or y_range is None:
        return ["top center"] * len(points)
    xs, ys = x_range[1] - x_range[0], y_range[1] - y_range[0]
    boxes: list[tuple[float, float, float, float]] = []
    marker = (0.012 * xs, 0.03 * ys)  # half the size of a point's marker
    dots = [(x - marker[0], y - marker[1], x + marker[0], y + marker[1]) for x, y in points]

    def box(i: int, place: str) -> tuple[float, float, float, float]:
        (x, y), w, h = points[i], len(labels[i]) * LABEL_CHAR_SHARE * xs, LABEL_HEIGHT_SHARE * ys
        vertical, horizontal = place.split()
        cx = {"center": x, "right": x + marker[0] + w / 2, "left": x - marker[0] - w / 2}[horizontal]
        cy = {"top": y + marker[1] + h / 2, "bottom": y - marker[1] - h / 2, "middle": y}[vertical]
        return cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2

    def free(b: tuple[float, float, float, float], i: int) -> bool:
        inside = x_range[0] <= b[0] and b[2] <= x_range[1] and y_range[0] <= b[1] and b[3] <= y_range[1]
        others = boxes + [d for j, d in enumerate(dots) if j != i]
        return inside and not any(b[0] < o[2] and o[0] < b[2] and b[1] < o[3] and o[1] < b[3] for o in others)

    chosen = []
    for i in range(len(points)):
        place = next((p for p in LABEL_PLACES if free(box(i, p), i)), LABEL_PLACES[0])
        boxes.append(box(i, place))
        chosen.append(place)
    return chosen


def _apart_label(t: PlottedTrial) -> str:
    if t.state == "PRUNED" and t.pruned_at_step:
        return f"pruned at step {t.pruned_at_step}"
    return "failed" if t.state == "FAIL" else t.state.lower()


APART_STYLE: dict[str | None, tuple[str, dict[str, Any]]] = {  # a trial in the strip, by state -> entry, marker
    "PRUNED": ("pruned (at its pruning step)", dict(size=9, **STATE_STYLE["PRUNED"])),
    "FAIL": ("failed", dict(size=9, **STATE_STYLE["FAIL"])),
    None: ("no perplexity", dict(size=9, color="#808080")),  # any other state: drawn at its own ratio
}


def _apart_strip(
    place: Place, apart: list[PlottedTrial], span: float, x_range: list[float] | None, proxy: Place
) -> None:
    """Pruned and failed trials in a strip under the proxy trials' plot (`proxy`), one line per pruning step (and one
    for failed runs), on the same FLOP-ratio axis; their perplexity where they stopped is in the hover."""
    labels = sorted({_apart_label(t) for t in apart}, key=lambda s: (s == "failed", len(s), s))
    spread = spread_x(
        [(cast(float, t.flops_ratio), labels.index(_apart_label(t)) + (t.plot_ppl or 0) * 1e-9) for t in apart], span
    )
    for state, (name, marker) in APART_STYLE.items():
        members = [i for i, t in enumerate(apart) if (t.state if t.state in APART_STYLE else None) == state]
        if members:
            group = [apart[i] for i in members]
            place.add(
                go.Scatter,
                x=[spread[i] if state else apart[i].flops_ratio for i in members],
                y=[_apart_label(t) for t in group],
                mode="markers",
                name=name,
                marker=marker,
                hovertext=_hover(group),
                hoverinfo="text",
            )
    place.y_axis(categoryorder="array", categoryarray=labels[::-1])
    place.x_axis(range=x_range, matches=proxy.axis_name(), showticklabels=True)


FRONT_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
OTHER_CURVE_COLOUR = "rgba(128,128,128,0.45)"


def _curves_panel(place: Place, trials: list[PlottedTrial], front_trials: set[int]) -> None:
    """Each trained trial's validation curve (loss against step): the decided front's maps in colour, each with its
    legend entry, the others grey under one entry; pruned ones end at their pruning step; hover names the map."""
    on_front = sorted((t for t in trials if t.trial in front_trials), key=lambda t: t.trial)
    others = [t for t in trials if t.trial not in front_trials]
    for t in others + on_front:
        steps, losses = zip(*t.curve, strict=True)
        label = ",".join(map(str, cast(tuple[int, ...], t.reuse_map)))  # a trial with a curve trained its map
        front_map = t in on_front
        colour = FRONT_COLOURS[on_front.index(t) % len(FRONT_COLOURS)] if front_map else OTHER_CURVE_COLOUR
        entry = (
            dict(name=_wrapped(f"trial {t.trial}: map {label}" + (f" {t.knobs}" if t.knobs else "")))
            if front_map
            else dict(name="other trials", legendgroup="other-curves", showlegend=t is others[0])
        )
        place.add(
            go.Scatter,
            x=list(steps),
            y=list(losses),
            mode="lines+markers",
            **entry,
            line=dict(color=colour, width=3 if front_map else 1),
            marker=dict(size=4, color=colour),
            hovertext=[
                f"trial {t.trial}: map {label}<br>step {s}: loss {loss:.4g}"
                for s, loss in zip(steps, losses, strict=True)
            ],
            hoverinfo="text",
        )
    last = [loss for t in trials for _, loss in t.curve[-1:]]
    place.x_axis(title_text="step")
    place.y_axis(
        title_text="validation loss",
        range=fitted_range(last + [loss for t in on_front for _, loss in t.curve], pad=0.1),
    )


AGREES = 0.6  # a rung's Spearman with the final ranking at which it is drawn as agreeing


def _fidelity_panel(place: Place, fidelity: Fidelity, audit: AuditReport | None) -> int:
    """Spearman of each rung with the final ranking; the audit's proxy vs longer-training perplexity; the line of
    agreement under the figure. Returns that line's number of lines."""
    rungs = [r for r in fidelity.rungs if r.spearman is not None]
    for agrees, name, colour in (
        (True, f"rung agrees with the proxy's end (Spearman >= {AGREES})", "#b0b0b0"),
        (False, f"rung disagrees (< {AGREES})", "#6b6b6b"),
    ):
        group = [r for r in rungs if (cast(float, r.spearman) >= AGREES) == agrees]
        if group:
            place.add(
                go.Bar,
                x=[f"step {r.step} ({r.fraction:.3g})" for r in group],
                y=[r.spearman for r in group],
                name=name,
                marker_color=colour,
                hovertext=[f"{r.n_maps} complete maps; Kendall {_num(r.kendall)}" for r in group],
                hoverinfo="text+y",
            )
    if rungs:
        place.x_axis(categoryorder="array", categoryarray=[f"step {r.step} ({r.fraction:.3g})" for r in rungs])
        place.y_axis(range=[-1, 1])
    if audit:
        ranked = [(m, m.proxy_ppl) for m in audit.maps if m.proxy_ppl is not None]
        audited = dataclasses.replace(place, col=2)
        # room inside the axes for the labels (a label's half-width is about 4% of a small panel's width)
        x_range = fitted_range([proxy for _, proxy in ranked], pad=0.18)
        y_range = fitted_range([m.audit_ppl for m, _ in ranked], pad=0.25)
        positions = label_positions(
            [(proxy, m.audit_ppl) for m, proxy in ranked], [str(m.reuse_map) for m, _ in ranked], x_range, y_range
        )
        audited.add(
            go.Scatter,
            x=[proxy for _, proxy in ranked],
            y=[m.audit_ppl for m, _ in ranked],
            mode="markers+text",
            text=[m.reuse_map for m, _ in ranked],
            textposition=positions,
            textfont=dict(size=9),
            cliponaxis=True,
            name=_wrapped(f"audited map at {audit.factor}x steps (labelled with its map)"),
            marker=dict(symbol="diamond", size=9, color=DEEP_COLOUR),
            hovertext=[f"map {m.reuse_map}" for m, _ in ranked],
            hoverinfo="text+x+y",
        )
        audited.x_axis(title_text="proxy ppl", range=x_range)
        audited.y_axis(title_text=f"{audit.factor}x ppl", range=y_range)
    lines = textwrap.wrap(fidelity.verdict, 110)
    place.fig.add_annotation(
        text="<b>fidelity</b>: " + "<br>".join(lines),
        xref="paper",
        yref="paper",
        x=0,
        y=0,
        yshift=-60,
        showarrow=False,
        align="left",
        xanchor="left",
        yanchor="top",
        font=dict(size=11),
    )
    return len(lines)


def plot_ppl(val_ppl: float | None, curve: Mapping[int, float] | None) -> float | None:
    """The perplexity a trial is drawn at: its final one, or for a pruned trial the one where it was pruned."""
    if val_ppl is not None:
        return val_ppl
    if curve:
        loss = curve[max(curve)]
        return math.exp(loss) if loss is not None and math.isfinite(loss) else None
    return None
