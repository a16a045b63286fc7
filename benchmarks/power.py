"""The race's power on the committed truth tables: the adaptive race against the fixed 3-seed race, constant and
crossing planted gaps, the A/A rate, compute; JSON per table and one figure.

    python benchmarks/power.py [--tables benchmarks/data/truth-truth-small.parquet,benchmarks/data/truth-truth-nope.parquet]
        [--orders 10] [--deltas 0,0.5,1,1.5,2,3,4] [--crossing 1,2] [--date 2026-12-01]
        [--settings adaptive,fixed-3-seeds] [--name-suffix ""] [--table-seeds N] [--figure docs/power.png]
    python benchmarks/power.py --markdown benchmarks/data/power-*.json   # the reports' tables

Each table is replayed by replays.power.power_report (benchmarks/replays/power.py) over
every recurrent map planted in turn and --orders seed orders each; the figure plots power against the planted gap
(in the table's seed sd at the target), one panel a table, and is rendered by headless Chromium
(benchmarks/screenshot.py). Writes benchmarks/data/power-<table>-<date>.json, and for a table whose best map is
not the baseline also power-<table>-against-best-<date>.json (the gap planted to the table's best map).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from replays.policy import race_template
from replays.power import parse_deltas, power_report
from replays.truth import TruthTable

SETTINGS = {"adaptive": race_template("race"), "fixed-3-seeds": race_template("race-fixed"),
            "adaptive-evalue": race_template("race", test="evalue"),
            "adaptive-screen-6": race_template("race", race_screen=6),
            "adaptive-screen-4": race_template("race", race_screen=4),
            "adaptive-every-seed": race_template("race", look_every=1),
            "adaptive-every-second-seed": race_template("race", look_every=2),
            "adaptive-2-contenders": race_template("race", race_contenders=2)}
SEEDS = {"fixed-3-seeds": 3}
COLORS = {"adaptive": "#1f77b4", "fixed-3-seeds": "#d62728", "adaptive-evalue": "#2ca02c",
          "adaptive-screen-6": "#9467bd", "adaptive-screen-4": "#8c564b", "adaptive-every-seed": "#ff7f0e",
          "adaptive-every-second-seed": "#17becf", "adaptive-2-contenders": "#e377c2"}


def figure(reports: dict[str, dict], out: Path) -> None:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    from screenshot import screenshot

    names = list(reports)
    fig = make_subplots(rows=1, cols=len(names), shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=[f"{n}: {len(r['table_seeds'])} seeds, sd {r['seed_sd_at_target']:.3f} nats, "
                                        f"gap to the {r['against']}" for n, r in reports.items()])
    for col, name in enumerate(names, start=1):
        rows = reports[name]["rows"]
        for setting in dict.fromkeys(r["setting"] for r in rows):
            for crossing, dash in ((False, "solid"), (True, "dash")):
                points = sorted((r["delta_sd"], r["power"] if r["delta_sd"] else r["any_claim"]) for r in rows
                                if r["setting"] == setting and r["crossing"] == crossing)
                if crossing:
                    points = [(0.0, next(r["any_claim"] for r in rows if r["setting"] == setting and r["delta_sd"] == 0))] + points
                fig.add_trace(go.Scatter(x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers",
                                         line={"color": COLORS[setting], "dash": dash},
                                         name=f"{setting}, {'crossing' if crossing else 'constant'} gap",
                                         legendgroup=f"{setting}{crossing}", showlegend=col == 1), row=1, col=col)
        fig.add_hline(y=0.8, line={"color": "grey", "dash": "dot", "width": 1}, row=1, col=col)
        fig.update_xaxes(title_text="planted gap (seed sd at the target)", row=1, col=col)
    fig.update_yaxes(title_text="share of replays claiming the planted map (at 0: any claim, A/A)", range=[0, 1.02],
                     row=1, col=1)
    width = 480 * len(names) + 120
    fig.update_layout(title="The race's power: planted gaps, every recurrent map in turn, 10 seed orders each",
                      width=width, height=560, legend={"orientation": "h", "y": -0.2}, template="plotly_white")
    html = out.with_suffix(".html")
    fig.write_html(html, include_plotlyjs=True)
    screenshot(html, out, width, 560)


def markdown(report: dict) -> str:
    """The report's rows as a markdown table: one row a gap, a column pair (power, compute) a setting; the A/A row
    gives the share of replays claiming anything."""
    settings = list(dict.fromkeys(r["setting"] for r in report["rows"]))
    keys = sorted({(r["crossing"], r["delta_sd"]) for r in report["rows"]})
    by = {(r["setting"], r["crossing"], r["delta_sd"]): r for r in report["rows"]}
    head = "| planted gap | nats | " + " | ".join(f"{s}: power | {s}: false | {s}: compute" for s in settings) + " |"
    lines = [head, "| --- | ---: | " + " | ".join("---: | ---: | ---:" for _ in settings) + " |"]
    for crossing, delta in keys:
        label = "A/A (0)" if delta == 0 else f"{delta:g} sd" + (", crossing" if crossing else "")
        cells = []
        for s in settings:
            r = by.get((s, crossing, delta))
            if r is None:
                cells.append("- | - | -")
                continue
            power = r["any_claim"] if delta == 0 else r["power"]
            cells.append(f"{'**' if delta == 0 else ''}{100 * power:.0f}%{'**' if delta == 0 else ''} | "
                         f"{100 * r['false_claims']:.0f}% | {r['mean_compute_steps']:,.0f}")
        nats = next(r["delta_nats"] for r in report["rows"] if r["crossing"] == crossing and r["delta_sd"] == delta)
        lines.append(f"| {label} | {nats:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", default="benchmarks/data/truth-truth-small.parquet,benchmarks/data/truth-truth-nope.parquet")
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--deltas", default="0,0.5,1,1.5,2,3,4")
    ap.add_argument("--crossing", default="1,2")
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"))
    ap.add_argument("--figure", default="docs/power.png")
    ap.add_argument("--settings", default="adaptive,fixed-3-seeds", help=f"of {', '.join(SETTINGS)}")
    ap.add_argument("--name-suffix", default="", help="added to the JSON files' names (e.g. -evalue)")
    ap.add_argument("--table-seeds", type=int, default=None, help="use only each table's first N seeds (e.g. 5)")
    ap.add_argument("--markdown", nargs="*", default=None, help="print the markdown tables of these JSON files and stop")
    args = ap.parse_args()
    if args.markdown is not None:
        for path in args.markdown:
            report = json.loads(Path(path).read_text())
            print(f"{path} ({len(report['table_seeds'])} seeds, seed sd {report['seed_sd_at_target']:.4f} nats at "
                  f"{report['target_steps']} steps, gap to the {report['against']}, {report['orders']} orders a map)\n")
            print(markdown(report) + "\n")
        return
    chosen = {name: SETTINGS[name] for name in args.settings.split(",")}
    reports = {}
    for table in args.tables.split(","):
        truth = TruthTable.read(table)
        if args.table_seeds:
            truth = truth.first_seeds(args.table_seeds)
        target = truth.lengths[-1]
        best = min(truth.flops, key=lambda k: (truth.seed_mean(k, target), k))
        for against in ("baseline", "best"):
            if against == "best" and best == truth.baseline:
                continue  # the baseline is the table's best: the same plants
            started = time.perf_counter()
            report = power_report(table, chosen, parse_deltas(args.deltas), parse_deltas(args.crossing), args.orders,
                                  n_seeds=SEEDS, table=truth, against=against).to_json()
            report |= {"date": args.date, "machine": f"{platform.node()} {platform.machine()} {platform.processor()}",
                       "seconds": time.perf_counter() - started, "table_best": best}
            name = Path(table).stem.removeprefix("truth-") + ("" if against == "baseline" else "-against-best") + \
                (f"-{args.table_seeds}seeds" if args.table_seeds else "") + args.name_suffix
            out = Path(f"benchmarks/data/power-{name}-{args.date}.json")
            out.write_text(json.dumps(report, indent=1) + "\n")
            reports[name] = report
            for r in report["rows"]:
                print(f"{name} {r['setting']:14} gap {r['delta_sd']:4g} sd {'crossing' if r['crossing'] else '        '}"
                      f" power {'-' if r['power'] is None else format(r['power'], '.2f')} any {r['any_claim']:.2f} "
                      f"false {r['false_claims']:.2f} raced {r.get('raced')} regret<=1sd {r['regret_within_1sd']} "
                      f"compute {r['mean_compute_steps']:.0f}", flush=True)
            print(f"wrote {out}")
    if args.figure:
        figure(reports, Path(args.figure))
        print(f"wrote {args.figure}")


if __name__ == "__main__":
    main()
