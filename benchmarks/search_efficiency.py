"""Search efficiency on the tabular benchmark: samplers replayed over a table of every feasible map.

    ilr-search bench build --space search_spaces/bench-small.toml --out benchmarks/out/bench-small.parquet
    python benchmarks/search_efficiency.py --table benchmarks/out/bench-small.parquet [--seeds 5] [--trials 30]

For each sampler (random, tpe, nsga2, gp, and what `auto` is now), with pruning on and off, over several
seeds: (pruning = the default calibrated rule, or --rule pareto-eager) the hypervolume of the found front as a fraction of the exhaustive front's, against training steps
spent (a fraction of the exhaustive compute: every feasible map trained fully); the compute needed to reach
90% and 95%; the share of steps pruning saved and the exhaustive front's maps it pruned. Writes a plotly
figure (HTML, and PNG where kaleido finds a browser) and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import plotly.graph_objects as go
from replays.hypervolume import exhaustive_steps, replay, summarize_replays, table_entries, table_front

from ilr_search.commands.bench import Table
from ilr_search.config import PrunerSettings
from ilr_search.search.samplers import sampler_settings

SAMPLERS = ["random", "tpe", "nsga2", "gp", "auto"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", default="benchmarks/out/bench-small.parquet")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--samplers", default=",".join(SAMPLERS))
    ap.add_argument("--out", default="docs/search-efficiency")
    ap.add_argument("--rule", default="pareto", choices=["pareto", "pareto-eager"])
    args = ap.parse_args()
    table = Table.read(args.table)
    auto = sampler_settings("auto", 0, table.max_reuse).name
    samplers = args.samplers.split(",")
    if "auto" in samplers and auto in samplers:  # auto is one of the others: replay it once
        samplers.remove("auto")
    started = time.perf_counter()
    settings = PrunerSettings(name=args.rule)
    results = [replay(table, sampler, seed, args.trials, pruning, settings)
               for sampler in samplers for pruning in (False, True) for seed in range(args.seeds)]
    seconds = time.perf_counter() - started
    rows = summarize_replays(table, results)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = go.Figure()
    for (sampler, pruning) in sorted({(r.sampler, r.pruning) for r in results}):
        group = [r for r in results if r.sampler == sampler and r.pruning == pruning]
        grid = sorted({s for r in group for s in r.steps})
        median = [sorted(r.hv_at(s) for r in group)[len(group) // 2] for s in grid]
        fig.add_trace(go.Scatter(x=[s / exhaustive_steps(table) for s in grid], y=median, mode="lines",
                                 line_shape="hv", line_dash="dot" if not pruning else "solid",
                                 name=f"{sampler}{' (auto)' if sampler == auto else ''}"
                                      f"{' + pruning' if pruning else ''}"))
    fig.add_hline(y=0.95, line_dash="dash", line_color="gray", annotation_text="95%")
    fig.add_vline(x=0.25, line_dash="dash", line_color="gray", annotation_text="25% of exhaustive compute")
    fig.update_layout(template="plotly_white", width=900, height=520,
                      title=f"Hypervolume vs compute: {len(table_entries(table))} maps, median of {args.seeds} seeds, "
                            f"pruning rule {args.rule}",
                      xaxis_title="training steps / exhaustive steps", yaxis_title="hypervolume / exhaustive",
                      yaxis_range=[0, 1.02], xaxis_range=[0, 1.0])
    fig.write_html(out.with_suffix(".html"), include_plotlyjs=True)
    try:
        fig.write_image(out.with_suffix(".png"), scale=2)
    except Exception as e:  # no browser for kaleido: the HTML is still there
        print(f"(no PNG: {type(e).__name__})")

    def pct(x):
        return "not reached" if x is None else f"{x:.0%}"

    lines = [f"{len(table_entries(table))} maps in the table, exhaustive front of {len(table_front(table))} maps, "
             f"{args.trials} trials per replay, {args.seeds} seeds, pruning rule {args.rule}, replayed in {seconds:.1f} s; "
             f"auto = {auto}",
             "", "| sampler | pruning | compute to 90% HV | compute to 95% HV | HV at 25% compute | final HV | steps saved | front maps pruned |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['sampler']}{' (auto)' if r['sampler'] == auto else ''} | {'on' if r['pruning'] else 'off'} | {pct(r['compute_to_90pct'])} | "
                     f"{pct(r['compute_to_95pct'])} | {r['hv_at_25pct_compute']:.1%} | {r['final_hv']:.1%} | "
                     f"{r['steps_saved_share']:.0%} | {r['front_maps_pruned']} |")
    text = "\n".join(lines)
    out.with_suffix(".md").write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    print(text)


if __name__ == "__main__":
    main()
