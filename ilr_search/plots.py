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


LEGEND = {"COMPLETE": "complete", "PRUNED": "pruned (ppl where pruned)", "FAIL": "failed (drawn on top)"}


def _hover(rows: list[dict[str, Any]]) -> list[str]:
    text = []
    for r in rows:
        extra = f"<br>pruned at step {r['pruned_at_step']} (ppl there)" if r.get("pruned_at_step") else ""
        extra += f"<br>{r['reason']}" if r["state"] == "FAIL" and r.get("reason") else ""
        knobs = f"<br>knobs {r['knobs']}" if r.get("knobs") else ""
        text.append(f"trial {r['trial']} ({r['state'].lower()})<br>map {','.join(map(str, r['reuse_map'] or []))}{knobs}"
                    f"<br>FLOP ratio {r['flops_ratio']:.3f}<br>ppl {_num(r.get('plot_ppl'))}<br>bpb {_num(r.get('val_bpb'))}"
                    + extra)
    return text


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def pareto_figure(study: str, trials: list[dict[str, Any]], front: list[dict[str, Any]], noise: dict[str, Any] | None,
                  layer_view: dict[str, Any] | None = None, fidelity: dict[str, Any] | None = None,
                  race_front: list[dict[str, Any]] | None = None) -> go.Figure:
    """Every trial (complete, pruned at its pruning rung, failed on top), the front as a step line, the
    all-ones baseline marked and its seed-to-seed noise band shaded, audited maps at their longer-training
    perplexity, the race's front (each point at its length: the mean over its seeds and its interval, filled
    where confirmed); the layer view, and a fidelity panel (rung agreement, proxy vs audit, the verdict) below."""
    audit = (fidelity or {}).get("audits", [None])[-1] if (fidelity or {}).get("audits") else None
    rows = 1 + bool(layer_view) + bool(fidelity)
    specs: list[list[Any]] = [[{"colspan": 2}, None]]
    titles = [f"{study}: perplexity vs compute"]
    if layer_view:
        specs.append([{}, {}])
        titles += ["reuse count per layer on the front", "layer importance for perplexity"]
    if fidelity:
        specs.append([{}, {}])
        titles += ["rung-to-final rank agreement (Spearman)",
                   f"proxy vs {audit['factor']}x training" if audit else "not audited (ilr-search audit)"]
    heights = {1: None, 2: [0.62, 0.38], 3: [0.5, 0.25, 0.25]}[rows]
    fig = make_subplots(rows=rows, cols=2, specs=specs, row_heights=heights, vertical_spacing=0.1,
                        subplot_titles=titles)
    finite = [t["plot_ppl"] for t in trials if t.get("plot_ppl") is not None]
    top = max(finite) * 1.05 if finite else 1.0
    for state, style in STATE_STYLE.items():
        group = [dict(t, plot_ppl=t.get("plot_ppl") if t.get("plot_ppl") is not None else top)
                 for t in trials if t["state"] == state and t.get("flops_ratio") is not None]
        if group:
            pruned = state == "PRUNED"  # drawn hollow and labelled with their rung: not a final perplexity
            fig.add_trace(go.Scatter(x=[t["flops_ratio"] for t in group], y=[t["plot_ppl"] for t in group],
                                     mode="markers+text" if pruned else "markers", name=LEGEND[state],
                                     text=[f"step {t['pruned_at_step']}" if t.get("pruned_at_step") else ""
                                           for t in group] if pruned else None,
                                     textposition="middle right", textfont=dict(size=10, color=style["color"]),
                                     marker=dict(size=9, **style), hovertext=_hover(group), hoverinfo="text"),
                          row=1, col=1)
    if front:
        fig.add_trace(go.Scatter(x=[p["flops_ratio"] for p in front], y=[p["val_ppl"] for p in front],
                                 mode="lines+markers", line_shape="hv", name="Pareto front",
                                 marker=dict(size=12, color="rgba(0,0,0,0)", line=dict(width=2, color="black")),
                                 hovertext=_hover([dict(p, state="COMPLETE", plot_ppl=p["val_ppl"]) for p in front]),
                                 hoverinfo="text"), row=1, col=1)
    baseline = next((t for t in trials if t["state"] == "COMPLETE" and t["reuse_map"]
                     and all(r == 1 for r in t["reuse_map"])), None)
    if baseline:
        fig.add_trace(go.Scatter(x=[baseline["flops_ratio"]], y=[baseline["plot_ppl"]], mode="markers+text",
                                 name="all-ones baseline", text=["baseline"], textposition="top right",
                                 marker=dict(symbol="star", size=16, color="gold", line=dict(width=1, color="black")),
                                 hoverinfo="skip"), row=1, col=1)
    if noise and noise.get("spread"):
        lo, hi = noise["min_ppl"], noise["max_ppl"]
        fig.add_hrect(y0=lo, y1=hi, fillcolor="gray", opacity=0.15, line_width=0, row=1, col=1,
                      annotation_text=f"baseline seed-to-seed spread ({noise['n_seeds']} seeds)",
                      annotation_position="bottom right")
    fig.update_xaxes(title_text="FLOP ratio (forward compute / all-ones map)", row=1, col=1)
    fig.update_yaxes(title_text="validation perplexity", row=1, col=1)
    if layer_view:
        maps = layer_view["front_maps"]
        fig.add_trace(go.Heatmap(z=[m["reuse_map"] for m in maps],
                                 x=[f"layer {i}" for i in range(len(maps[0]["reuse_map"]))] if maps else [],
                                 y=[f"trial {m['trial']} ({m['flops_ratio']:.2f}x)" + (f" {m['knobs']}" if m.get("knobs") else "")
                                    for m in maps],
                                 colorscale="Blues", zmin=1, zmax=max([2] + [max(m["reuse_map"]) for m in maps]),
                                 showscale=False, texttemplate="%{z}",
                                 hovertemplate="%{y}<br>%{x}: %{z} runs<extra></extra>"), row=2, col=1)
        importance = layer_view["importance"]
        if importance:
            fig.add_trace(go.Bar(x=list(importance), y=list(importance.values()), name="importance",
                                 marker_color="#2ca02c", showlegend=False), row=2, col=2)
    if audit:
        maps = audit["maps"]
        fig.add_trace(go.Scatter(x=[m["flops_ratio"] for m in maps], y=[m["audit_ppl"] for m in maps], mode="markers",
                                 name=f"audited at {audit['factor']}x steps",
                                 marker=dict(symbol="diamond", size=11, color="#9467bd", line=dict(width=1, color="black")),
                                 hovertext=[f"map {m['reuse_map']}<br>{audit['factor']}x ppl {m['audit_ppl']:.4g}<br>proxy "
                                            f"{m['proxy_state'].lower()} ppl {_num(m['proxy_ppl'])}" for m in maps],
                                 hoverinfo="text"), row=1, col=1)
    known = [p for p in race_front or [] if p["interval"][0] is not None]  # one seed: no interval
    if known:  # a race was run (a study without one has its proxy front here, drawn above)
        fig.add_trace(go.Scatter(
            x=[p["flops_ratio"] for p in race_front], y=[p["val_ppl"] for p in race_front], mode="markers",
            name="race front (mean over seeds, interval)",
            error_y=dict(type="data", symmetric=False,
                         array=[p["interval"][1] - p["val_ppl"] if p in known else 0 for p in race_front],
                         arrayminus=[p["val_ppl"] - p["interval"][0] if p in known else 0 for p in race_front]),
            marker=dict(symbol="square", size=11, line=dict(width=2, color="#d62728"),
                        color=["#d62728" if p["confirmed"] else "rgba(0,0,0,0)" for p in race_front]),
            hovertext=[f"map {','.join(map(str, p['reuse_map']))}<br>{p['steps']} steps, seeds "
                       f"{','.join(map(str, p['seeds']))}<br>ppl {p['val_ppl']:.4g} [{_num(p['interval'][0])}, "
                       f"{_num(p['interval'][1])}]<br>{'confirmed' if p['confirmed'] else 'not confirmed'}"
                       for p in race_front], hoverinfo="text"), row=1, col=1)
    if fidelity:
        _fidelity_panel(fig, fidelity, audit, row=rows)
    fig.update_layout(template="plotly_white", height={1: 560, 2: 900, 3: 1150}[rows], width=1000,
                      legend=dict(orientation="h", y=-0.06 if rows > 1 else -0.15))
    return fig


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
        fig.add_trace(go.Scatter(x=[m["proxy_ppl"] for m in ranked], y=[m["audit_ppl"] for m in ranked],
                                 mode="markers+text", text=[m["reuse_map"] for m in ranked], textposition="top center",
                                 showlegend=False, marker=dict(symbol="diamond", size=9, color="#9467bd")),
                      row=row, col=2)
        fig.update_xaxes(title_text="proxy ppl", row=row, col=2)
        fig.update_yaxes(title_text=f"{audit['factor']}x ppl", row=row, col=2)
    fig.add_annotation(text="<b>fidelity</b>: " + "<br>".join(textwrap.wrap(fidelity["verdict"], 150)),
                       xref="paper", yref="paper", x=0, y=-0.02, showarrow=False, align="left",
                       xanchor="left", yanchor="top", font=dict(size=11))


def plot_ppl(row: dict[str, Any], curve: Mapping[int, float] | None) -> float | None:
    """The perplexity a trial is drawn at: its final one, or for a pruned trial the one where it was pruned."""
    if row.get("val_ppl") is not None:
        return row["val_ppl"]
    if curve:
        loss = curve[max(curve)]
        return math.exp(loss) if loss is not None and math.isfinite(loss) else None
    return None
