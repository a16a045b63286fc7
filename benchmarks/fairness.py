"""The fairness knob, measured: does scaling a repeated layer by its repeat count
(repeat_scale, model.py) shrink the recurrent maps' seed spread, and does it change their verdicts against the
all-ones baseline?

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/fairness.py [--steps 500] [--seeds 3]
        [--settings off,residual,lr] [--maps 0,1,2,3,4,5,6] [--out benchmarks/data/fairness-<date>.json]

The default space (search_spaces/default.toml: 8 layers, d_model 32, 500-step proxies), the baseline and six
recurrent maps, each trained at every repeat_scale setting and seeds 0..seeds-1, one at a time with
`ilr_search.api.train_report` (the single-map trainer for every setting: the fused one does not train "lr").
The baseline runs every layer once, so no setting touches it (tests/test_knobs.py proves it bit for bit): it is
trained once per seed, with the knob off, and is every setting's reference. Seed s fixes the initial weights and
the batch order, so a map and the baseline at the same seed are paired (stats.paired_comparison).

Every finished run is appended to `<out>.jsonl` (one JSON object a line) and skipped on a rerun, so a killed
run resumes; the table is rewritten to `<out>` after each seed and printed at the end (`--table-only` prints it
from the JSON lines without training; the table holds seeds 0..seeds-1, so `--table-only --seeds 3` gives the
three-seed table of a file that holds five).

Per map and setting: ppl at the mean validation loss over the seeds, the seed sd of the ppl, its spread (max -
min), and the paired difference of validation loss to the baseline (mean, two-sided 90% t interval) with its
verdict: "beats" (interval wholly below 0), "loses to" (wholly above 0), "not distinguishable". Per setting: the
mean over the recurrent maps of the seed sd of the ppl, and that mean relative to the setting "off".
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ilr_search.commands.api import train_report
from ilr_search.analysis.stats import paired_comparison
from jsonl_rows import read_jsonl

BASELINE = "1,1,1,1,1,1,1,1"
MAPS = (BASELINE, "2,1,1,1,1,1,1,1", "2,2,1,1,1,1,1,1", "3,2,2,1,1,1,1,1", "1,1,2,3,1,1,2,1",
        "1,1,1,1,1,2,3,1", "2,1,2,2,2,1,1,1")
SETTINGS = ("off", "residual", "lr")
CONFIDENCE = 0.9


@dataclass(frozen=True)
class MapRow:
    """One map under one setting, over its seeds."""
    map_key: str
    setting: str
    seeds: list[int]
    val_ppls: list[float]
    mean_ppl: float  # exp(mean validation loss)
    sd_ppl: float | None
    spread_ppl: float
    diff_loss: float | None  # mean over common seeds of loss(map) - loss(baseline); None for the baseline
    diff_interval: list[float] | None
    verdict: str  # beats / loses to / not distinguishable from the baseline; "" for the baseline


@dataclass(frozen=True)
class SettingRow:
    setting: str
    mean_sd_ppl: float  # over the recurrent maps
    sd_relative_to_off: float | None


def read_done(jsonl: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Finished runs by (map, setting, seed)."""
    return {(row["map_key"], row["setting"], row["seed"]): row for row in read_jsonl(jsonl)}


def losses_by_seed(done: dict[tuple[str, str, int], dict[str, Any]], map_key: str, setting: str) -> dict[int, float]:
    """{seed: val_loss} of a map under a setting (the baseline's come from "off", see the module docstring)."""
    setting = "off" if map_key == BASELINE else setting
    return {seed: row["val_loss"] for (key, s, seed), row in sorted(done.items())
            if key == map_key and s == setting and row["val_loss"] is not None}


def verdict(map_losses: dict[int, float], baseline_losses: dict[int, float]) -> str:
    if paired_comparison(map_losses, baseline_losses, CONFIDENCE).a_better:
        return "beats"
    if paired_comparison(baseline_losses, map_losses, CONFIDENCE).a_better:
        return "loses to"
    return "not distinguishable"


def table(done: dict[tuple[str, str, int], dict[str, Any]], settings: list[str]) -> tuple[list[MapRow], list[SettingRow]]:
    baseline = losses_by_seed(done, BASELINE, "off")
    rows: list[MapRow] = []
    for setting in settings:
        for key in MAPS:
            losses = losses_by_seed(done, key, setting)
            if not losses:
                continue
            ppls = [math.exp(v) for v in losses.values()]
            comparison = paired_comparison(losses, baseline, CONFIDENCE) if key != BASELINE else None
            rows.append(MapRow(
                key, setting, list(losses), ppls, math.exp(statistics.fmean(losses.values())),
                statistics.stdev(ppls) if len(ppls) > 1 else None, max(ppls) - min(ppls),
                comparison.mean_diff if comparison else None,
                list(comparison.interval) if comparison and comparison.interval else None,
                verdict(losses, baseline) if key != BASELINE else ""))
    mean_sd: dict[str, float] = {}
    for setting in settings:
        sds = [r.sd_ppl for r in rows if r.setting == setting and r.map_key != BASELINE and r.sd_ppl is not None]
        if sds:
            mean_sd[setting] = statistics.fmean(sds)
    off = mean_sd.get("off")
    return rows, [SettingRow(s, v, v / off if off else None) for s, v in mean_sd.items()]


def markdown(rows: list[MapRow], setting_rows: list[SettingRow], settings: list[str]) -> str:
    """The report's tables (benchmarks/reports/fairness_cpu-2core_2026-12-01.md): one line per (map, setting); each
    map's verdicts side by side; one line per setting."""
    lines = ["| map | setting | ppl (mean over seeds) | seed sd | spread (max - min) | loss - baseline's, mean "
             "[90% CI] | verdict |", "|---|---|---:|---:|---:|---|---|"]
    by = {(r.map_key, r.setting): r for r in rows}
    for key in MAPS:
        for s in (["off"] if key == BASELINE else settings):
            r = by.get((key, s))
            if r is None:
                continue
            sd = f"{r.sd_ppl:.3f}" if r.sd_ppl is not None else "-"
            if r.diff_loss is None:
                diff, verdict_text = "", "(the reference: every setting)"
            else:
                ci = f" [{r.diff_interval[0]:+.3f}, {r.diff_interval[1]:+.3f}]" if r.diff_interval else ""
                diff, verdict_text = f"{r.diff_loss:+.4f}{ci}", r.verdict
            lines.append(f"| {key} | {s} | {r.mean_ppl:.3f} | {sd} | {r.spread_ppl:.3f} | {diff} | {verdict_text} |")
    lines += ["", "| map | " + " | ".join(f"verdict, {s}" for s in settings) + " | changes |",
              "|---|" + "---|" * (len(settings) + 1)]
    for key in MAPS[1:]:
        verdicts = [by[(key, s)].verdict if (key, s) in by else "" for s in settings]
        present = [v for v in verdicts if v]
        if not present:  # a map left out (--maps)
            continue
        lines.append(f"| {key} | " + " | ".join(verdicts) + f" | {'yes' if len(set(present)) > 1 else 'no'} |")
    lines += ["", "| setting | mean seed sd of ppl over the recurrent maps | relative to off |", "|---|---:|---:|"]
    for sr in setting_rows:
        rel = f"{sr.sd_relative_to_off:.2f}" if sr.sd_relative_to_off is not None else "-"
        lines.append(f"| {sr.setting} | {sr.mean_sd_ppl:.4f} | {rel} |")
    return "\n".join(lines)


def write_table(done: dict[tuple[str, str, int], dict[str, Any]], settings: list[str], meta: dict[str, Any],
                out: Path) -> str:
    rows, setting_rows = table(done, settings)
    text = markdown(rows, setting_rows, settings)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "maps": [asdict(r) for r in rows],
                               "settings": [asdict(r) for r in setting_rows], "markdown": text}, indent=1) + "\n",
                   encoding="utf-8")
    os.replace(tmp, out)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--maps", default=",".join(str(i) for i in range(len(MAPS))),
                    help="which of MAPS to train, by index (0: the baseline, always trained)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--table-only", action="store_true", help="print the table from the JSON lines; train nothing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    chosen = [BASELINE] + [MAPS[int(i)] for i in args.maps.split(",") if int(i) != 0]
    out = Path(args.out or f"benchmarks/data/fairness-{datetime.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl")
    meta = {"space": "default", "steps": args.steps, "seeds": list(range(args.seeds)), "settings": settings,
            "maps": chosen, "baseline": BASELINE, "confidence": CONFIDENCE,
            "trainer": "ilr_search.api.train_report (single map), one thread"}
    done = read_done(jsonl)
    tabled = {k: v for k, v in done.items() if k[2] < args.seeds}  # the table holds seeds 0..seeds-1 only
    started = time.perf_counter()
    for seed in ([] if args.table_only else range(args.seeds)):
        for setting in settings:
            for key in chosen:
                if (key == BASELINE and setting != "off") or (key, setting, seed) in done:
                    continue
                report = train_report(None, {"train": {"steps": args.steps, "seed": seed}}, reuse_map=key,
                                      knobs=None if setting == "off" else f"repeat_scale={setting}").to_json()
                row = {"map_key": key, "setting": setting, "seed": seed, "steps": args.steps,
                       "val_loss": report["val_loss"], "val_ppl": report["val_ppl"], "status": report["status"],
                       "flops_ratio": report["flops_ratio"], "train_seconds": report["train_seconds"],
                       "knobs": report["knobs"]}
                with jsonl.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                done[(key, setting, seed)] = tabled[(key, setting, seed)] = row
                ppl = f"{row['val_ppl']:.4f}" if row["val_ppl"] is not None else "diverged"
                print(f"[{time.perf_counter() - started:7.1f}s] seed {seed} {setting:8s} {key}: ppl {ppl} "
                      f"({row['train_seconds']:.1f}s)", flush=True)
        write_table(tabled, settings, meta, out)
    print(write_table(tabled, settings, meta, out))
    print(f"wrote {out} ({len(tabled)} runs)")


if __name__ == "__main__":
    main()
