"""Where the race's noise comes from, and which training settings keep runs of one seed paired.

    OMP_NUM_THREADS=1 python benchmarks/pairing.py [--space truth-small] [--steps 800] [--seeds 6]
        [--maps "1,1,1,1 2,2,1,1"] [--settings default,lr3e-3,warmup0.3,batch16,clip0.25] [--shard K/N]
        [--out benchmarks/data/pairing-truth-small-2026-12-01.jsonl]
    python benchmarks/pairing.py --summary benchmarks/data/pairing-truth-small-2026-12-01.jsonl

For each training setting and map, seeds 0..S-1 are trained at the truth table's target length (800 steps of the
truth-small space), and seeds 0 and 1 a second time from initial weights perturbed by 1e-7 (Gaussian, every
weight). Each run is evaluated at 16 points of its curve on the study's 128 validation windows (set A), and at its
end also on 128 windows halfway between them (set B, disjoint) and on 1024 windows (set C). From those:

- drift: how far a perturbed run lands from its twin, |loss difference|, at each evaluated step: where training is
  chaotic, "the same seed" pairs runs only through their batch order;
- the paired difference of the two maps at the target, split into its evaluation-sampling part and its
  training-seed part: var_eval = var over seeds of (diff on A - diff on B) / 4 estimates the sampling variance
  of a difference measured on 128 windows (half of the variance of the difference of two disjoint 128-window
  estimates), and var_train = var(diff on A) - var_eval;
- the seed sd of each map, the correlation of the two maps' seed deviations (the pairing), and the mean loss
  (what a setting costs);
- the seeds a paired t test needs for the observed gap (the race's 90% two-sided, 5% one-sided), with the loss
  read as the last evaluation or as the mean of the last three (the "mean of the last evaluations" lever).

Every finished run is one JSON line of the --out file (a rerun skips it); `--summary` prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jsonl_rows import read_jsonl
from ilr_search.analysis.stats import paired_comparison
from ilr_search.data.tokenizers import model_config
from ilr_search.data.tokens import load_space_tokens
from ilr_search.space import load_space
from ilr_search.training.checkpoint import save_checkpoint
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.training.train import build_model, build_optimizer, train_proxy

SETTINGS = {"default": {}, "lr3e-3": {"lr": 3e-3}, "warmup0.3": {"warmup_frac": 0.3}, "batch16": {"batch_size": 16},
            "clip0.25": {"grad_clip": 0.25}}
PERTURBATION = 1e-7
PERTURBED_SEEDS = (0, 1)


def window_losses(model: torch.nn.Module, schedule: list[int], data: Any, starts: np.ndarray, seq_len: int) -> list[float]:
    """Mean loss (nats per token) of each validation window starting at `starts`."""
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(starts), 16):
            x, y = data._windows(data.val.tokens, starts[i:i + 16], seq_len)
            x, y = torch.from_numpy(x), torch.from_numpy(y)
            for row in range(x.shape[0]):
                out.append(float(model.loss(x[row:row + 1], y[row:row + 1], schedule)))
    model.train()
    return out


def perturbed_start(model_cfg: Any, train_cfg: Any, schedule: list[int], folder: Path) -> Path:
    """A step-0 checkpoint of the seed's initial weights plus N(0, 1e-7) noise, for train_proxy to start from."""
    model = build_model(model_cfg, train_cfg.seed)
    generator = torch.Generator().manual_seed(12345)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * PERTURBATION)
    optimizer = build_optimizer(model, train_cfg, torch.device("cpu"), schedule)
    path = folder / f"perturbed-{train_cfg.seed}.pt"
    save_checkpoint(path, model, optimizer, 0, [])
    return path


def run_one(space_name: str, setting: str, key: str, seed: int, perturbed: bool, steps: int) -> dict[str, Any]:
    changes = {"steps": steps, "seed": seed, "checkpoint_every": 0, "device": "cpu", "dtype": "fp32",
               "eval_fractions": tuple((i + 1) / 16 for i in range(16))} | SETTINGS[setting]
    space = load_space(space_name)
    space = dataclasses.replace(space, train=dataclasses.replace(space.train, **changes))
    data = load_space_tokens(space)
    model_cfg = model_config(space)
    reuse = [int(x) for x in key.split(",")]
    schedule = reuse_map_schedule(reuse)
    seq = model_cfg.seq_len
    kept: dict[str, Any] = {}

    def keep(model: torch.nn.Module) -> None:
        a = data.val_starts(128, seq)
        stride = int(np.median(np.diff(a)))
        b = np.clip(a + stride // 2, 0, len(data.val) - seq - 1)
        c = data.val_starts(1024, seq)
        kept["A"], kept["B"], kept["C"] = (window_losses(model, schedule, data, s, seq) for s in (a, b, c))

    with tempfile.TemporaryDirectory() as folder:
        start = perturbed_start(model_cfg, space.train, schedule, Path(folder)) if perturbed else None
        result = train_proxy(model_cfg, schedule, data, space.train, checkpoint_path=start, on_trained=keep)
    return {"setting": setting, "map_key": key, "seed": seed, "perturbed": perturbed, "steps": steps,
            "status": result.status, "val_loss": result.val_loss,
            "curve": [[p.step, p.val_loss] for p in result.curve], "train_seconds": result.train_seconds,
            "loss_A": statistics.fmean(kept["A"]), "loss_B": statistics.fmean(kept["B"]),
            "loss_C": statistics.fmean(kept["C"])}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per setting: drift, the split of the paired variance, pairing, cost, seeds needed."""
    out = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == setting and r["status"] == "ok"]
        maps = sorted({r["map_key"] for r in mine})
        plain = {(r["map_key"], r["seed"]): r for r in mine if not r["perturbed"]}
        twins = [(plain[(r["map_key"], r["seed"])], r) for r in mine if r["perturbed"] and (r["map_key"], r["seed"]) in plain]
        drift: dict[int, list[float]] = {}
        for a, b in twins:
            for (step, la), (_, lb) in zip(a["curve"], b["curve"]):
                drift.setdefault(step, []).append(abs(la - lb))
        row: dict[str, Any] = {"setting": setting, "runs": len(mine),
                               "drift": {str(s): statistics.fmean(v) for s, v in sorted(drift.items())}}
        seeds = sorted({s for (_, s) in plain})
        by_map = {k: {s: plain[(k, s)] for s in seeds if (k, s) in plain} for k in maps}
        row["mean_loss"] = {k: statistics.fmean(r["val_loss"] for r in v.values()) for k, v in by_map.items()}
        row["seed_sd"] = {k: statistics.stdev([r["val_loss"] for r in v.values()]) if len(v) > 1 else None
                          for k, v in by_map.items()}
        if len(maps) == 2:
            a, b = (by_map[k] for k in maps[::-1])  # the recurrent map minus the baseline (maps sorted: baseline first)
            common = sorted(set(a) & set(b))
            diff_a = [a[s]["loss_A"] - b[s]["loss_A"] for s in common]
            diff_b = [a[s]["loss_B"] - b[s]["loss_B"] for s in common]
            if len(common) >= 3:
                total = statistics.variance(diff_a)
                var_eval = statistics.variance([x - y for x, y in zip(diff_a, diff_b)]) / 4
                dev_a = [a[s]["val_loss"] - row["mean_loss"][maps[1]] for s in common]
                dev_b = [b[s]["val_loss"] - row["mean_loss"][maps[0]] for s in common]
                row |= {"pair": f"{maps[1]} - {maps[0]}", "seeds": len(common), "paired_sd": math.sqrt(total),
                        "eval_share": var_eval / total if total > 0 else None,
                        "train_sd": math.sqrt(max(0.0, total - var_eval)), "eval_sd": math.sqrt(var_eval),
                        "pairing": float(np.corrcoef(dev_a, dev_b)[0, 1]),
                        "mean_diff": statistics.fmean(diff_a)}
                for name, pick in (("last", lambda r: r["val_loss"]),
                                   ("mean_last3", lambda r: statistics.fmean(v for _, v in r["curve"][-3:])),
                                   ("windows1024", lambda r: r["loss_C"])):
                    c = paired_comparison({s: pick(a[s]) for s in common}, {s: pick(b[s]) for s in common}, 0.9)
                    row[f"seeds_needed_{name}"] = c.seeds_needed()
                    row[f"paired_sd_{name}"] = c.sd_diff
                    row[f"mean_diff_{name}"] = c.mean_diff
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="truth-small")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--maps", default="1,1,1,1 2,2,1,1")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--shard", default="0/1")
    ap.add_argument("--out", default="benchmarks/data/pairing-truth-small-2026-12-01.jsonl")
    ap.add_argument("--summary", default=None, help="print the summary of this JSON-lines file and stop")
    args = ap.parse_args()
    if args.summary:
        print(json.dumps(summarize(read_jsonl(Path(args.summary))), indent=1))
        return
    torch.set_num_threads(1)
    shard, shards = (int(x) for x in args.shard.split("/"))
    out = Path(args.out)
    done = {(r["setting"], r["map_key"], r["seed"], r["perturbed"]) for r in read_jsonl(out)}
    jobs = [(setting, key, seed, perturbed) for setting in args.settings.split(",") for seed in range(args.seeds)
            for key in args.maps.split() for perturbed in ((False, True) if seed in PERTURBED_SEEDS else (False,))]
    started = time.perf_counter()
    for i, job in enumerate(jobs):
        if i % shards != shard or job in done:
            continue
        row = run_one(args.space, *job, steps=args.steps)
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{time.perf_counter() - started:7.1f}s] {job}: loss {row['val_loss']:.4f} ({row['train_seconds']:.1f}s)",
              flush=True)


if __name__ == "__main__":
    main()
