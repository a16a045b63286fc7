"""Figures of a study: the Pareto front of perplexity against compute, and the layer view (which layers the
front's maps recur, and how much each layer's reuse count matters for perplexity)."""

from __future__ import annotations

import math
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
        text.append(f"trial {r['trial']} ({r['state'].lower()})<br>map {','.join(map(str, r['reuse_map'] or []))}"
                    f"<br>FLOP ratio {r['flops_ratio']:.3f}<br>ppl {_num(r.get('plot_ppl'))}<br>bpb {_num(r.get('val_bpb'))}"
                    + extra)
    return text


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"


def pareto_figure(study: str, trials: list[dict[str, Any]], front: list[dict[str, Any]], noise: dict[str, Any] | None,
                  layer_view: dict[str, Any] | None = None) -> go.Figure:
    """Every trial (complete, pruned at its pruning rung, failed on top), the front as a step line, the
    all-ones baseline marked and its seed-to-seed noise band shaded; the layer view below when given."""
    rows = 2 if layer_view else 1
    fig = make_subplots(rows=rows, cols=2 if layer_view else 1,
                        specs=[[{"colspan": 2}, None], [{}, {}]] if layer_view else [[{}]],
                        row_heights=[0.62, 0.38] if layer_view else None, vertical_spacing=0.14,
                        subplot_titles=(f"{study}: perplexity vs compute",
                                        *(("reuse count per layer on the front", "layer importance for perplexity")
                                          if layer_view else ())))
    finite = [t["plot_ppl"] for t in trials if t.get("plot_ppl") is not None]
    top = max(finite) * 1.05 if finite else 1.0
    for state, style in STATE_STYLE.items():
        group = [dict(t, plot_ppl=t.get("plot_ppl") if t.get("plot_ppl") is not None else top)
                 for t in trials if t["state"] == state and t.get("flops_ratio") is not None]
        if group:
            fig.add_trace(go.Scatter(x=[t["flops_ratio"] for t in group], y=[t["plot_ppl"] for t in group],
                                     mode="markers", name=LEGEND[state], marker=dict(size=9, **style),
                                     hovertext=_hover(group), hoverinfo="text"), row=1, col=1)
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
                                 y=[f"trial {m['trial']} ({m['flops_ratio']:.2f}x)" for m in maps],
                                 colorscale="Blues", zmin=1, zmax=max([2] + [max(m["reuse_map"]) for m in maps]),
                                 showscale=False, texttemplate="%{z}",
                                 hovertemplate="%{y}<br>%{x}: %{z} runs<extra></extra>"), row=2, col=1)
        importance = layer_view["importance"]
        if importance:
            fig.add_trace(go.Bar(x=list(importance), y=list(importance.values()), name="importance",
                                 marker_color="#2ca02c", showlegend=False), row=2, col=2)
    fig.update_layout(template="plotly_white", height=900 if layer_view else 560, width=1000,
                      legend=dict(orientation="h", y=-0.08 if layer_view else -0.15))
    return fig


def plot_ppl(row: dict[str, Any], curve: list[list[float]] | None) -> float | None:
    """The perplexity a trial is drawn at: its final one, or for a pruned trial the one where it was pruned."""
    if row.get("val_ppl") is not None:
        return row["val_ppl"]
    if curve:
        loss = curve[-1][1]
        return math.exp(loss) if loss is not None and math.isfinite(loss) else None
    return None
