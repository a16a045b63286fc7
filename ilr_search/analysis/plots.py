"""Figures of a study: the Pareto front of perplexity against compute, and the layer view (which layers the
front's maps recur, and how much each layer's reuse count matters for perplexity)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

STATE_STYLE = {
    "COMPLETE": dict(symbol="circle", color="#1f77b4"),
    "PRUNED": dict(symbol="triangle-down-open", color="#ff7f0e"),
    "FAIL": dict(symbol="x", color="#d62728"),
}


LEGEND = {"COMPLETE": "complete"}


def _hover(rows: list[dict[str, Any]]) -> list[str]:
    text = []
    for r in rows:
        extra = f"<br>pruned at step {r['pruned_at_step']} (ppl there)" if r.get("pruned_at_step") else ""
        extra += f"<br>{r['reason']}" if r["state"] == "FAIL" and r.get("reason") else ""
        extra += f"<br>the result of trial {r['reused_from']} (same map)" if r.get("reused_from") is not None else ""
        knobs = f"<br>knobs {r['knobs']}" if r.get("knobs") else ""
        text.append(f"trial {r['trial']} ({r['state'].lower()})<br>map {','.join(map(str, r['reuse_map'] or []))}{knobs}"
                    f"<br>FLOP ratio {r['flops_ratio']:.3f}<br>ppl {_num(r.get('plot_ppl'))}<br>bpb {_num(r.get('val_bpb'))}"
                    + extra)
    return text


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def spread_x(points: list[tuple[float, float]], span: float, step_share: float = 0.012) -> list[float]:
    """x positions that spread points sharing one FLOP ratio side by side (in order of their y), centred on
    the ratio, `step_share` of the axis span apart: eight maps at 1.476x are eight points, not one."""
    groups: dict[float, list[int]] = {}
    for i, (x, _) in enumerate(points):
        groups.setdefault(round(x, 6), []).append(i)
    spread = [x for x, _ in points]
    for members in groups.values():
        members.sort(key=lambda i: points[i][1])
        for k, i in enumerate(members):
            spread[i] = points[i][0] + (k - (len(members) - 1) / 2) * step_share * span
    return spread


def fitted_range(values: list[float], pad: float = 0.08) -> list[float] | None:
    """An axis range around `values` with `pad` of their span (or of their size, for one value) either side."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    lo, hi = min(values), max(values)
    margin = (hi - lo) * pad or abs(hi) * 0.02 or 1.0
    return [lo - margin, hi + margin]


def pareto_figure(study: str, trials: list[dict[str, Any]], front: list[dict[str, Any]], noise: dict[str, Any] | None,
                  layer_view: dict[str, Any] | None = None, fidelity: dict[str, Any] | None = None,
                  race_front: list[dict[str, Any]] | None = None) -> go.Figure:
    """Complete trials by final perplexity against FLOP ratio (points at one ratio spread side by side, hover
    for the map), the front as a step line, the all-ones baseline and its seed-to-seed noise band, audited
    maps at their longer-training perplexity, the race's front (each point at its length: the mean over its
    seeds and its interval, filled where confirmed); pruned and failed trials apart, in a strip below at their
    pruning step (their perplexity there is no final one: it stays off the perplexity axis, which fits the
    complete trials); the layer view, and a fidelity panel (rung agreement, proxy vs audit, the verdict)."""
    audit = (fidelity or {}).get("audits", [None])[-1] if (fidelity or {}).get("audits") else None
    plotted = [t for t in trials if t.get("flops_ratio") is not None]
    complete = [t for t in plotted if t["state"] == "COMPLETE" and t.get("plot_ppl") is not None]
    apart = [t for t in plotted if t not in complete]  # pruned, failed (diverged), or with no perplexity
    known = [p for p in race_front or [] if p["interval"][0] is not None]  # one seed: no interval, no race run
    longer = bool(audit) or bool(known)  # perplexities after longer training: a right axis of their own
    specs: list[list[Any]] = [[{"colspan": 2, "secondary_y": longer}, None]]
    titles = [f"{study}: perplexity vs compute"]
    heights = [0.62]
    if apart:
        specs.append([{"colspan": 2}, None])
        titles.append("pruned and failed trials (at the step they stopped; not a final perplexity)")
        heights.append(0.04 + 0.03 * len({_apart_label(t) for t in apart}))
    if layer_view:
        specs.append([{}, {}])
        titles += ["reuse count per layer on the front", "layer importance for perplexity"]
        heights.append(0.34)
    curved = [t for t in plotted if t.get("curve")]
    if curved:
        specs.append([{"colspan": 2}, None])
        titles.append("validation loss against step (front maps in colour; curves that cross change the ranking)")
        heights.append(0.34)
    if fidelity:
        specs.append([{}, {}])
        titles += ["rung-to-final rank agreement (Spearman)",
                   f"proxy vs {audit['factor']}x training" if audit else "not audited (ilr-search audit)"]
        heights.append(0.3)
    rows = len(specs)
    fig = make_subplots(rows=rows, cols=2, specs=specs, row_heights=[h / sum(heights) for h in heights],
                        vertical_spacing=0.24 / rows, subplot_titles=titles)
    xs = [t["flops_ratio"] for t in plotted] + [m["flops_ratio"] for m in (audit or {}).get("maps", [])]
    x_range = fitted_range(xs, pad=0.05)
    span = (x_range[1] - x_range[0]) if x_range else 1.0
    at_x = dict(zip((t["trial"] for t in complete),
                    spread_x([(t["flops_ratio"], t["plot_ppl"]) for t in complete], span)))
    if complete:
        fig.add_trace(go.Scatter(x=[at_x[t["trial"]] for t in complete], y=[t["plot_ppl"] for t in complete],
                                 mode="markers", name=LEGEND["COMPLETE"], marker=dict(size=9, **STATE_STYLE["COMPLETE"]),
                                 hovertext=_hover(complete), hoverinfo="text"), row=1, col=1)
    if front:
        fig.add_trace(go.Scatter(x=[at_x.get(p["trial"], p["flops_ratio"]) for p in front], y=[p["val_ppl"] for p in front],
                                 mode="lines+markers", line_shape="hv", name="Pareto front",
                                 marker=dict(size=12, color="rgba(0,0,0,0)", line=dict(width=2, color="black")),
                                 hovertext=_hover([dict(p, state="COMPLETE", plot_ppl=p["val_ppl"]) for p in front]),
                                 hoverinfo="text"), row=1, col=1)
    baseline = next((t for t in complete if t["reuse_map"] and all(r == 1 for r in t["reuse_map"])), None)
    if baseline:
        fig.add_trace(go.Scatter(x=[at_x[baseline["trial"]]], y=[baseline["plot_ppl"]], mode="markers",
                                 name="all-ones baseline",
                                 marker=dict(symbol="star", size=16, color="gold", line=dict(width=1, color="black")),
                                 hoverinfo="skip"), row=1, col=1)
    y_values = [t["plot_ppl"] for t in complete]
    if noise and noise.get("spread"):
        lo, hi = noise["min_ppl"], noise["max_ppl"]
        y_values += [lo, hi]
        fig.add_hrect(y0=lo, y1=hi, fillcolor="gray", opacity=0.15, line_width=0, row=1, col=1)
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", hoverinfo="skip",  # the band's legend entry
                                 name=f"baseline seed-to-seed spread ({noise['n_seeds']} seeds)",
                                 marker=dict(symbol="square", size=14, color="rgba(128,128,128,0.3)")), row=1, col=1)
    if audit:  # on an axis of their own (right): a longer training's perplexity is on another scale
        maps = audit["maps"]
        fig.add_trace(go.Scatter(x=[m["flops_ratio"] for m in maps], y=[m["audit_ppl"] for m in maps], mode="markers",
                                 name=f"audited at {audit['factor']}x steps (right axis)",
                                 marker=dict(symbol="diamond", size=11, color="#9467bd", line=dict(width=1, color="black")),
                                 hovertext=[f"map {m['reuse_map']}<br>{audit['factor']}x ppl {m['audit_ppl']:.4g}<br>proxy "
                                            f"{m['proxy_state'].lower()} ppl {_num(m['proxy_ppl'])}" for m in maps],
                                 hoverinfo="text"), row=1, col=1, secondary_y=True)
    if known:  # a race was run (a study without one has its proxy front here, drawn above)
        fig.add_trace(go.Scatter(
            x=[p["flops_ratio"] for p in race_front], y=[p["val_ppl"] for p in race_front], mode="markers",
            name="race front, mean and interval (right axis)",
            error_y=dict(type="data", symmetric=False,
                         array=[p["interval"][1] - p["val_ppl"] if p in known else 0 for p in race_front],
                         arrayminus=[p["val_ppl"] - p["interval"][0] if p in known else 0 for p in race_front]),
            marker=dict(symbol="square", size=11, line=dict(width=2, color="#d62728"),
                        color=["#d62728" if p["confirmed"] else "rgba(0,0,0,0)" for p in race_front]),
            hovertext=[f"map {','.join(map(str, p['reuse_map']))}<br>{p['steps']} steps, seeds "
                       f"{','.join(map(str, p['seeds']))}<br>ppl {p['val_ppl']:.4g} [{_num(p['interval'][0])}, "
                       f"{_num(p['interval'][1])}]<br>{'confirmed' if p['confirmed'] else 'not confirmed'}"
                       for p in race_front], hoverinfo="text"), row=1, col=1, secondary_y=True)
    if longer:
        right = [m["audit_ppl"] for m in audit["maps"]] if audit else []
        right += [v for p in known for v in (p["interval"][0], p["interval"][1], p["val_ppl"])]
        fig.update_yaxes(title_text="perplexity after longer training" if known else f"{audit['factor']}x-training perplexity",
                         showgrid=False, color="#9467bd", tickformat=".4g", range=fitted_range(right), row=1, col=1,
                         secondary_y=True)
    fig.update_xaxes(title_text="FLOP ratio (forward compute / all-ones map)", range=x_range, row=1, col=1)
    fig.update_yaxes(title_text="validation perplexity", range=fitted_range(y_values), row=1, col=1,
                     **({"secondary_y": False} if longer else {}))
    if apart:
        _apart_strip(fig, apart, span, x_range)
    row = 2 + bool(apart)
    if layer_view:
        maps = layer_view["front_maps"]
        fig.add_trace(go.Heatmap(z=[m["reuse_map"] for m in maps],
                                 x=[f"layer {i}" for i in range(len(maps[0]["reuse_map"]))] if maps else [],
                                 y=[f"trial {m['trial']} ({m['flops_ratio']:.2f}x)" + (f" {m['knobs']}" if m.get("knobs") else "")
                                    for m in maps],
                                 colorscale="Blues", zmin=1, zmax=max([2] + [max(m["reuse_map"]) for m in maps]),
                                 showscale=False, texttemplate="%{z}",
                                 hovertemplate="%{y}<br>%{x}: %{z} runs<extra></extra>"), row=row, col=1)
        importance = layer_view["importance"]
        if importance:
            fig.add_trace(go.Bar(x=list(importance), y=list(importance.values()), name="importance",
                                 marker_color="#2ca02c", showlegend=False), row=row, col=2)
        row += 1
    if curved:
        _curves_panel(fig, curved, {p["trial"] for p in front} | {p["trial"] for p in race_front or []}, row=row)
        row += 1
    if fidelity:
        _fidelity_panel(fig, fidelity, audit, row=row)
    fig.update_layout(template="plotly_white", autosize=True, height=int(900 * sum(heights)) + 160,
                      margin=dict(l=60, r=60, t=120, b=150 if fidelity else 60),
                      legend=dict(orientation="h", y=1.0, yanchor="top", x=0, xanchor="left", yref="container",
                                  entrywidthmode="pixels", entrywidth=230))
    return fig


# A label's size as a share of a small panel's axis spans (9 px text in a panel about 300 x 200 px: the
# figure at about 760 px wide; wider figures leave more room).
LABEL_CHAR_SHARE = 0.018
LABEL_HEIGHT_SHARE = 0.09
LABEL_PLACES = ("top center", "bottom center", "middle right", "middle left", "top right", "bottom left",
                "top left", "bottom right")


def label_positions(points: list[tuple[float, float]], labels: list[str], x_range: list[float] | None,
                    y_range: list[float] | None) -> list[str]:
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


def _apart_label(t: dict[str, Any]) -> str:
    if t["state"] == "PRUNED" and t.get("pruned_at_step"):
        return f"pruned at step {t['pruned_at_step']}"
    return "failed" if t["state"] == "FAIL" else t["state"].lower()


def _apart_strip(fig: go.Figure, apart: list[dict[str, Any]], span: float, x_range: list[float] | None) -> None:
    """Pruned and failed trials in a strip under the perplexity plot, one line per pruning step (and one for
    failed runs), on the same FLOP-ratio axis; their perplexity where they stopped is in the hover."""
    labels = sorted({_apart_label(t) for t in apart}, key=lambda s: (s == "failed", len(s), s))
    spread = spread_x([(t["flops_ratio"], labels.index(_apart_label(t)) + (t.get("plot_ppl") or 0) * 1e-9)
                       for t in apart], span)
    for state, style in STATE_STYLE.items():
        members = [i for i, t in enumerate(apart) if t["state"] == state]
        if not members or state == "COMPLETE":
            continue
        group = [apart[i] for i in members]
        fig.add_trace(go.Scatter(x=[spread[i] for i in members], y=[_apart_label(t) for t in group], mode="markers",
                                 name={"PRUNED": "pruned (at its pruning step)", "FAIL": "failed"}[state],
                                 marker=dict(size=9, **style), hovertext=_hover(group), hoverinfo="text"), row=2, col=1)
    others = [apart[i] for i, t in enumerate(apart) if t["state"] not in STATE_STYLE or t["state"] == "COMPLETE"]
    if others:
        fig.add_trace(go.Scatter(x=[t["flops_ratio"] for t in others], y=[_apart_label(t) for t in others],
                                 mode="markers", name="no perplexity", marker=dict(size=9, color="gray"),
                                 hovertext=_hover(others), hoverinfo="text"), row=2, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1], row=2, col=1)
    fig.update_xaxes(range=x_range, matches="x", showticklabels=True, row=2, col=1)


FRONT_COLOURS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _curves_panel(fig: go.Figure, trials: list[dict[str, Any]], front_trials: set[int], row: int) -> None:
    """Each trained trial's validation curve (loss against step): the front's maps in colour, the others grey,
    pruned ones ending at their pruning step; hover names the map."""
    on_front = sorted((t for t in trials if t["trial"] in front_trials), key=lambda t: t["trial"])
    others = [t for t in trials if t["trial"] not in front_trials]
    for t in others + on_front:
        steps, losses = zip(*t["curve"])
        colour = FRONT_COLOURS[on_front.index(t) % len(FRONT_COLOURS)] if t in on_front else "rgba(128,128,128,0.45)"
        label = ",".join(map(str, t["reuse_map"]))
        fig.add_trace(go.Scatter(x=list(steps), y=list(losses), mode="lines+markers", showlegend=False,
                                 line=dict(color=colour, width=3 if t in on_front else 1), marker=dict(size=4),
                                 hovertext=[f"trial {t['trial']}: map {label}<br>step {s}: loss {l:.4g}"
                                            for s, l in zip(steps, losses)], hoverinfo="text"), row=row, col=1)
    last = [l for t in trials for _, l in t["curve"][-1:]]
    fig.update_xaxes(title_text="step", row=row, col=1)
    fig.update_yaxes(title_text="validation loss", row=row, col=1,
                     range=fitted_range(last + [l for t in on_front for _, l in t["curve"]], pad=0.1))


def _fidelity_panel(fig: go.Figure, fidelity: dict[str, Any], audit: dict[str, Any] | None, row: int) -> None:
    """Spearman of each rung with the final ranking; the audit's proxy vs longer-training perplexity; the verdict."""
    rungs = [r for r in fidelity.get("rungs", []) if r.get("spearman") is not None]
    if rungs:
        fig.add_trace(go.Bar(x=[f"step {r['step']} ({r['fraction']:.3g})" for r in rungs],
                             y=[r["spearman"] for r in rungs], showlegend=False,
                             marker_color=["#2ca02c" if r["spearman"] >= 0.6 else "#d62728" for r in rungs],
                             hovertext=[f"{r['n_maps']} complete maps; Kendall {_num(r['kendall'])}" for r in rungs],
                             hoverinfo="text+y"), row=row, col=1)
        fig.update_yaxes(range=[-1, 1], row=row, col=1)
    if audit:
        ranked = [m for m in audit["maps"] if m["proxy_ppl"] is not None]
        x_range = fitted_range([m["proxy_ppl"] for m in ranked], pad=0.18)
        y_range = fitted_range([m["audit_ppl"] for m in ranked], pad=0.25)
        positions = label_positions([(m["proxy_ppl"], m["audit_ppl"]) for m in ranked],
                                    [str(m["reuse_map"]) for m in ranked], x_range, y_range)
        fig.add_trace(go.Scatter(x=[m["proxy_ppl"] for m in ranked], y=[m["audit_ppl"] for m in ranked],
                                 mode="markers+text", text=[m["reuse_map"] for m in ranked], textposition=positions,
                                 textfont=dict(size=9), cliponaxis=True, showlegend=False,
                                 marker=dict(symbol="diamond", size=9, color="#9467bd"),
                                 hovertext=[f"map {m['reuse_map']}" for m in ranked], hoverinfo="text+x+y"),
                      row=row, col=2)
        # room inside the axes for the labels (a label's half-width is about 4% of a small panel's width)
        fig.update_xaxes(title_text="proxy ppl", range=x_range, row=row, col=2)
        fig.update_yaxes(title_text=f"{audit['factor']}x ppl", range=y_range, row=row, col=2)
    fig.add_annotation(text="<b>fidelity</b>: " + "<br>".join(textwrap.wrap(fidelity["verdict"], 110)),
                       xref="paper", yref="paper", x=0, y=0, yshift=-60, showarrow=False, align="left",
                       xanchor="left", yanchor="top", font=dict(size=11))


def plot_ppl(row: dict[str, Any], curve: Mapping[int, float] | None) -> float | None:
    """The perplexity a trial is drawn at: its final one, or for a pruned trial the one where it was pruned."""
    if row.get("val_ppl") is not None:
        return row["val_ppl"]
    if curve:
        loss = curve[max(curve)]
        return math.exp(loss) if loss is not None and math.isfinite(loss) else None
    return None
