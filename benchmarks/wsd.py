"""WSD continuation against cosine restarts: train the racing truth table's maps with a
warmup-stable-decay schedule at 1x, 2x and 4x the base length, each longer length continuing the shorter one's
stable-phase checkpoint, and compare cost and results with the table's cosine runs (one cosine run per length).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/wsd.py [--space truth-small] [--seeds 3] [--time-maps 4]
        [--truth benchmarks/data/truth-truth-small.parquet] [--out benchmarks/data/wsd-<date>.json]
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/wsd.py --time-only [--time-maps 4]   # wsd-timing-<date>.json

The chain of one (map, seed), base length B = 200 and cooldown_frac c = 0.2 (train.py lr_at, TrainConfig
cooldown_start): the B run saves its stable checkpoint at B(1-c) = 160 and cools down to 200; the 2B run continues
that checkpoint from step 161, saves its own at 2B(1-c) = 320 and cools down to 400; the 4B run continues from 321
to 800. Steps trained: B + (2B - B(1-c)) + (4B - 2B(1-c)) = 4B(1-c) + c(B + 2B + 4B) = 920, against
B + 2B + 4B = 1400 for cosine restarts. Every run has the same warmup (warmup_frac of the base length, 20 steps;
the cosine runs warm up over 10% of their own length) and sees the same batches at the same step (train_batch is
indexed by seed and step: common random numbers with the cosine runs of the same seed).

Agreement is measured against the truth table (benchmarks/truth.py; not rebuilt here), seed-matched. Cost in
seconds: for the first --time-maps maps at seed 0 the cosine restarts are retrained here, right after the same
map's WSD chain and with the same evaluation (the last step of each length only); at a changing load those wall
seconds hardly compare, so `--time-only` times the same pairs again, in alternating order and in CPU seconds too
(benchmarks/data/wsd-timing-<date>.json).

Finished chains are appended to `<out>.jsonl` (one row per length) and skipped on a rerun, so a killed run
resumes; a chain cut short is retrained whole. Its trunk checkpoints live in `<out>.trunks/` while it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ilr_search.commands.api import schedule_model
from ilr_search.config import SpaceConfig, TrainConfig
from ilr_search.data.tokens import load_space_tokens
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.space import load_space
from ilr_search.analysis.stats import paired_comparison, rank_agreement, seed_interval
from ilr_search.training.train import train_proxy
from jsonl_rows import read_jsonl

FACTORS = (1, 2, 4)
CONFIDENCE = 0.9


def wsd_config(space: SpaceConfig, cooldown_frac: float) -> TrainConfig:
    """The space's training with the wsd schedule, its warmup fixed at the base length's, evaluated at the end."""
    base = space.train
    return dataclasses.replace(base, lr_schedule="wsd", cooldown_frac=cooldown_frac, eval_fractions=(1.0,),
                               warmup_steps=base.warmup_length, checkpoint_every=0)


def train_wsd_chain(space: SpaceConfig, key: str, seed: int, cooldown_frac: float, trunks: Path,
                    data: Any) -> list[dict[str, Any]]:
    """One (map, seed) at every length, each continuing the previous length's stable checkpoint."""
    counts = [int(c) for c in key.split(",")]
    schedule = reuse_map_schedule(counts)
    model = schedule_model(space, schedule, None)
    base = space.train.steps
    rows, previous = [], None
    for factor in FACTORS:
        cfg = dataclasses.replace(wsd_config(space, cooldown_frac), steps=base * factor, seed=seed)
        stable = trunks / f"{key.replace(',', '-')}-seed{seed}-{cfg.steps}.pt"
        result = train_proxy(model, schedule, data, cfg, start_from=previous, stable_checkpoint=stable)
        rows.append(row("wsd", key, seed, factor, base, result))
        if previous is not None:
            previous.unlink()
        previous = stable
    previous.unlink(missing_ok=True)
    return rows


def train_cosine_restarts(space: SpaceConfig, key: str, seed: int, data: Any) -> list[dict[str, Any]]:
    """One (map, seed) at every length, each its own cosine run, evaluated as the wsd chain is (for timing)."""
    schedule = reuse_map_schedule([int(c) for c in key.split(",")])
    model = schedule_model(space, schedule, None)
    base = space.train.steps
    rows = []
    for factor in FACTORS:
        cfg = dataclasses.replace(space.train, steps=base * factor, seed=seed, eval_fractions=(1.0,), checkpoint_every=0)
        rows.append(row("cosine-timing", key, seed, factor, base, train_proxy(model, schedule, data, cfg)))
    return rows


def continued_steps(jobs: Sequence[Sequence[Any]], cooldown_frac: float) -> int:
    """The steps the (map, steps, seed) jobs cost when each (map, seed)'s longer run continues its next shorter
    run's stable checkpoint: the first length in full, each later one less the shorter run's constant phase."""
    lengths: dict[tuple[str, int], list[int]] = {}
    for key, steps, seed in jobs:
        lengths.setdefault((key, seed), []).append(steps)
    total = 0
    for runs in lengths.values():
        runs.sort()
        total += runs[0] + sum(longer - TrainConfig(steps=shorter, cooldown_frac=cooldown_frac).cooldown_start
                               for shorter, longer in zip(runs, runs[1:]))
    return total


def race_savings(truth: Path, cooldown_frac: float, race_seeds: int) -> dict[str, Any]:
    """The race replayed over the cosine truth table (replays.policy.replay_policy, as race_replay.py does):
    its steps as trained (cosine restarts) against the same jobs with WSD continuation. A what-if: with WSD
    results the race's verdicts, and so its jobs, could differ."""
    from replays.policy import replay_policy

    replays = replay_policy(truth, "race", 10, 0, race_seeds, CONFIDENCE).to_json()["replays"]
    cosine = [r["compute_steps"] for r in replays]
    wsd = [continued_steps(r["trained"], cooldown_frac) for r in replays]
    return {"orders": len(replays), "race_seeds": race_seeds, "mean_cosine_steps": mean(cosine),
            "mean_wsd_continued_steps": mean(wsd), "ratio": math.fsum(wsd) / math.fsum(cosine)}


def time_chains(space: SpaceConfig, maps: list[str], cooldown_frac: float, trunks: Path, data: Any) -> dict[str, Any]:
    """Wall and CPU seconds of the WSD chain and of the cosine restarts of each map at seed 0, trained back to back
    in alternating order (WSD first for every other map) so that a drift in the machine's load falls on both.
    CPU seconds (time.process_time, one thread) hardly depend on what else the machine runs; wall seconds do."""
    pairs = []
    for i, key in enumerate(maps):
        methods = {"wsd": lambda: train_wsd_chain(space, key, 0, cooldown_frac, trunks, data),
                   "cosine": lambda: train_cosine_restarts(space, key, 0, data)}
        timed: dict[str, dict[str, float]] = {}
        for method in (("wsd", "cosine") if i % 2 == 0 else ("cosine", "wsd")):
            wall, cpu = time.perf_counter(), time.process_time()
            methods[method]()
            timed[method] = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                             "load": os.getloadavg()[0]}
        pairs.append({"map_key": key, **{f"{m}_{k}": v for m, t in timed.items() for k, v in t.items()}})
        print(f"timed {key}: " + ", ".join(f"{k} {v:.1f}" for k, v in pairs[-1].items() if k != "map_key"), flush=True)
    return {"date": datetime.date.today().isoformat(), "machine": platform.node(), "cpus": os.cpu_count(),
            "pairs": pairs,
            "wsd_over_cosine_wall": math.fsum(p["wsd_wall"] for p in pairs) / math.fsum(p["cosine_wall"] for p in pairs),
            "wsd_over_cosine_cpu": math.fsum(p["wsd_cpu"] for p in pairs) / math.fsum(p["cosine_cpu"] for p in pairs)}


def row(method: str, key: str, seed: int, factor: int, base: int, result: Any) -> dict[str, Any]:
    return {"method": method, "map_key": key, "seed": seed, "steps": base * factor, "factor": factor,
            "steps_trained": result.steps - result.resumed_from_step, "resumed_from_step": result.resumed_from_step,
            "val_loss": result.val_loss if result.status == "ok" else math.nan, "status": result.status,
            "train_seconds": result.train_seconds}


def read_rows(jsonl: Path) -> dict[tuple[str, int, int], list[dict[str, Any]]]:
    """Finished chains by (method, map, seed); a chain missing a length (a killed run) is dropped."""
    chains: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for line_row in read_jsonl(jsonl):
        chains.setdefault((line_row["method"], line_row["map_key"], line_row["seed"]), []).append(line_row)
    return {k: sorted(v, key=lambda r: r["steps"]) for k, v in chains.items() if len({r["steps"] for r in v}) == len(FACTORS)}


def verdict(map_losses: dict[int, float], baseline_losses: dict[int, float]) -> str:
    """The race's paired verdict of a map against the baseline at 90%: better, worse or open."""
    if paired_comparison(map_losses, baseline_losses, CONFIDENCE).a_better:
        return "better"
    if paired_comparison(baseline_losses, map_losses, CONFIDENCE).a_better:
        return "worse"
    return "open"


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def agreement(wsd: dict[tuple[str, int, int], float], cosine: dict[tuple[str, int, int], float], maps: list[str],
              baseline: str, seeds: list[int], all_cosine_seeds: list[int], steps: int) -> dict[str, Any]:
    """Per length: each map's seed-matched |WSD - cosine| against the cosine seed-to-seed sd, the ranking's
    Spearman, and whether the paired verdicts against the baseline agree."""
    per_map = []
    for key in maps:
        w = {s: wsd[(key, steps, s)] for s in seeds}
        c = {s: cosine[(key, steps, s)] for s in seeds}
        sd = seed_interval([cosine[(key, steps, s)] for s in all_cosine_seeds], CONFIDENCE).sd_loss
        entry = {"map_key": key, "wsd_mean": mean(list(w.values())), "cosine_mean": mean(list(c.values())),
                 "mean_signed_diff": mean([w[s] - c[s] for s in seeds]),
                 "mean_abs_diff": mean([abs(w[s] - c[s]) for s in seeds]), "cosine_sd": sd}
        if key != baseline:
            bw = {s: wsd[(baseline, steps, s)] for s in seeds}
            bc = {s: cosine[(baseline, steps, s)] for s in seeds}
            entry |= {"wsd_verdict": verdict(w, bw), "cosine_verdict": verdict(c, bc)}
        per_map.append(entry)
    rho, tau = rank_agreement([m["wsd_mean"] for m in per_map], [m["cosine_mean"] for m in per_map])
    # A shift shared by every map (WSD's schedule is better or worse at this length) moves no ranking and no
    # paired verdict; what is left of the differences once it is taken out is what could.
    offset = mean([wsd[(k, steps, s)] - cosine[(k, steps, s)] for k in maps for s in seeds])
    # The yardstick for the ranking: the cosine seed means against those of the table's other seeds, which no
    # WSD run shares; WSD's seed means against the same other seeds then carry the same seed noise.
    others = [s for s in all_cosine_seeds if s not in seeds]
    other_means = [mean([cosine[(k, steps, s)] for s in others]) for k in maps] if others else None
    split = {"other_cosine_seeds": others,
             "spearman_cosine_vs_other_seeds": rank_agreement([m["cosine_mean"] for m in per_map], other_means)[0]
             if other_means else None,
             "spearman_wsd_vs_other_seeds": rank_agreement([m["wsd_mean"] for m in per_map], other_means)[0]
             if other_means else None}
    judged = [m for m in per_map if m["map_key"] != baseline]
    return {"steps": steps, "spearman": rho, "kendall": tau,
            "mean_abs_diff": mean([m["mean_abs_diff"] for m in per_map]),
            "mean_signed_diff": offset,
            "mean_abs_diff_less_offset": mean([abs(wsd[(k, steps, s)] - cosine[(k, steps, s)] - offset)
                                               for k in maps for s in seeds]),
            "mean_cosine_sd": mean([m["cosine_sd"] for m in per_map]),
            "maps_within_sd": sum(m["mean_abs_diff"] <= m["cosine_sd"] for m in per_map),
            "verdicts_same": sum(m["wsd_verdict"] == m["cosine_verdict"] for m in judged), "verdicts_total": len(judged),
            "verdicts_decided_wsd": sum(m["wsd_verdict"] != "open" for m in judged),
            "verdicts_decided_cosine": sum(m["cosine_verdict"] != "open" for m in judged),
            **split, "maps": per_map}


def report(chains: dict[tuple[str, int, int], list[dict[str, Any]]], truth: Path, maps: list[str], baseline: str,
           seeds: list[int], cooldown_frac: float, space: SpaceConfig) -> dict[str, Any]:
    import pandas as pd

    frame = pd.read_parquet(truth)
    cosine = {(r.map_key, int(r.steps), int(r.seed)): float(r.val_loss) for r in frame.itertuples()}
    all_cosine_seeds = sorted({int(s) for s in frame["seed"]})
    wsd = {(r["map_key"], r["steps"], r["seed"]): r["val_loss"] for (method, _, _), rows in chains.items()
           if method == "wsd" for r in rows}
    base = space.train.steps
    lengths = [base * f for f in FACTORS]
    wsd_chains = [rows for (method, _, _), rows in chains.items() if method == "wsd"]
    timed = [(k, rows) for k, rows in chains.items() if k[0] == "cosine-timing"]
    timing = []
    for (_, key, seed), cos_rows in timed:
        wsd_rows = chains[("wsd", key, seed)]
        timing.append({"map_key": key, "seed": seed, "wsd_seconds": sum(r["train_seconds"] for r in wsd_rows),
                       "cosine_seconds": sum(r["train_seconds"] for r in cos_rows),
                       "wsd_seconds_by_length": [r["train_seconds"] for r in wsd_rows],
                       "cosine_seconds_by_length": [r["train_seconds"] for r in cos_rows]})
    cost = {"wsd_steps_per_chain": sorted({sum(r["steps_trained"] for r in rows) for rows in wsd_chains}),
            "cosine_steps_per_chain": sum(lengths),
            "wsd_promotion_steps": [r["steps_trained"] for r in wsd_chains[0]],
            "timed_chains": timing,
            "wsd_over_cosine_seconds": (math.fsum(t["wsd_seconds"] for t in timing)
                                        / math.fsum(t["cosine_seconds"] for t in timing)) if timing else None}
    return {"date": datetime.date.today().isoformat(), "machine": platform.node(), "cpus": os.cpu_count(),
            "load_at_end": os.getloadavg(), "space": "truth-small", "truth": str(truth), "seeds": seeds,
            "cosine_sd_seeds": all_cosine_seeds, "maps": maps, "baseline": baseline, "confidence": CONFIDENCE,
            "wsd": {"cooldown_frac": cooldown_frac, "cooldown": "1-sqrt", "warmup_steps": space.train.warmup_length,
                    "min_lr_frac": space.train.min_lr_frac},
            "cost": cost, "race_replay_savings": race_savings(truth, cooldown_frac, 3),
            "agreement": [agreement(wsd, cosine, maps, baseline, seeds, all_cosine_seeds, steps) for steps in lengths]}


def figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_table(result: dict[str, Any]) -> None:
    cost = result["cost"]
    print(f"steps per (map, seed): WSD continued {cost['wsd_steps_per_chain']} (promotions "
          f"{cost['wsd_promotion_steps']}), cosine restarts {cost['cosine_steps_per_chain']}; "
          f"measured seconds WSD/cosine {cost['wsd_over_cosine_seconds']}")
    race = result["race_replay_savings"]
    print(f"race replayed ({race['orders']} orders, {race['race_seeds']} seeds): {race['mean_cosine_steps']:.0f} steps "
          f"with cosine restarts, {race['mean_wsd_continued_steps']:.0f} had its promotions continued "
          f"({race['ratio']:.3f}x)")
    print("| steps | mean abs WSD-cosine | mean signed (offset) | abs less offset | cosine seed sd | maps within sd "
          "| Spearman WSD-cosine | vs other cosine seeds: cosine, WSD | verdicts same (decided: WSD, cosine) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for a in result["agreement"]:
        print(f"| {a['steps']} | {a['mean_abs_diff']:.4f} | {a['mean_signed_diff']:+.4f} | "
              f"{a['mean_abs_diff_less_offset']:.4f} | {a['mean_cosine_sd']:.4f} | "
              f"{a['maps_within_sd']}/{len(a['maps'])} | {figure(a['spearman'])} | "
              f"{figure(a['spearman_cosine_vs_other_seeds'])}, {figure(a['spearman_wsd_vs_other_seeds'])} | "
              f"{a['verdicts_same']}/{a['verdicts_total']} ({a['verdicts_decided_wsd']}, {a['verdicts_decided_cosine']}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="truth-small")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--time-maps", type=int, default=4)
    ap.add_argument("--cooldown-frac", type=float, default=0.2)
    ap.add_argument("--truth", default="benchmarks/data/truth-truth-small.parquet")
    ap.add_argument("--out", default=None)
    ap.add_argument("--time-only", action="store_true",
                    help="only time the first --time-maps maps' WSD chains and cosine restarts at seed 0 (wall and "
                         "CPU seconds, alternating order) and write <out> as wsd-timing-<date>.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    space = load_space(args.space)
    out = Path(args.out or f"benchmarks/data/wsd-{datetime.date.today().isoformat()}.json")
    jsonl, trunks = out.with_suffix(".jsonl"), out.with_suffix(".trunks")
    truth = Path(args.truth)
    meta = json.loads(__import__("pandas").read_parquet(truth, columns=["meta"])["meta"][0])
    maps, baseline = meta["maps"], meta["baseline"]
    seeds = list(range(args.seeds))
    data = load_space_tokens(space)
    if args.time_only:
        timing_out = Path(args.out or f"benchmarks/data/wsd-timing-{datetime.date.today().isoformat()}.json")
        result = time_chains(space, maps[:args.time_maps], args.cooldown_frac, timing_out.with_suffix(".trunks"), data)
        timing_out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        shutil.rmtree(timing_out.with_suffix(".trunks"), ignore_errors=True)
        print(f"WSD/cosine seconds: wall {result['wsd_over_cosine_wall']:.3f}, cpu {result['wsd_over_cosine_cpu']:.3f}; "
              f"wrote {timing_out}")
        return
    chains = read_rows(jsonl)
    started = time.perf_counter()
    for seed in seeds:
        for i, key in enumerate(maps):
            jobs = [("wsd", lambda: train_wsd_chain(space, key, seed, args.cooldown_frac, trunks, data))]
            if seed == 0 and i < args.time_maps:
                jobs.append(("cosine-timing", lambda: train_cosine_restarts(space, key, seed, data)))
            for method, train in jobs:
                if (method, key, seed) in chains:
                    continue
                rows = train()
                with jsonl.open("a", encoding="utf-8") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
                chains[(method, key, seed)] = rows
                print(f"[{time.perf_counter() - started:7.1f}s] seed {seed} {method} {key}: "
                      + ", ".join(f"{r['steps']}: {r['val_loss']:.4f} ({r['train_seconds']:.1f}s)" for r in rows),
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    shutil.rmtree(trunks, ignore_errors=True)  # empty: every chain finished deletes its trunks
    result = report(chains, truth, maps, baseline, seeds, args.cooldown_frac, space)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print_table(result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
