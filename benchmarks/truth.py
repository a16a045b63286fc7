"""Build a racing truth table: a sample of maps of a small space, each trained at 1x, 2x and 4x its base length at
several seeds, so that a race replayed over it (replays/policy.py) can answer any (map, steps, seed) job a race asks
for and score its verdicts against the table's seed means.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/truth.py [--space truth-small] [--maps 12] [--seeds 3]
        [--factors 1,2,4] [--sample-seed 0] [--map-list "1,1,1,1 2,1,1,1 ..."] [--shard K/N]
        [--out benchmarks/data/truth-truth-small.parquet]

The committed tables:
- benchmarks/data/truth-truth-small.parquet: the defaults, resumed with `--seeds 5` (seeds 3 and 4: 180 rows,
  43 + 18 minutes on one thread of this 2-core machine at load 4-11), then with `--seeds 12 --shard 0/1`
  (seeds 5-11; 432 rows);
- benchmarks/data/truth-truth-nope.parquet: `--space truth-nope --seeds 12 --map-list "1,1,1,1 2,1,1,1
  1,2,1,1 1,1,2,1 1,1,1,2 2,2,1,1 3,2,2,1 2,2,2,2 1,2,2,3 1,3,2,2"` (360 rows), a space where recurrence wins.

`--shard K/N` trains only the seeds s with s % N == K and appends to its own `<out>.shardK.jsonl`, so that N
one-thread processes build one table together (two on this 2-core machine); every process reads every shard's
rows, and the parquet is rewritten from all of them.

Seed s changes both the initial weights and the order of training batches (common random numbers: two maps at
the same seed share both). Each length is its own run with its own warmup and cosine decay (no continuation).
The maps are the all-ones baseline plus a seeded sample of the space's feasible maps (reuse counts up to
max_reuse, within the budget). Jobs run seed-major (every map at seed 0 and every length, then seed 1, ...) so
that a partial table holds whole seeds. Every finished job is appended to a JSON-lines file beside the output
(`<out>.jsonl`) and skipped on a rerun, so a killed build resumes where it stopped; the parquet is rewritten
from the JSON lines after each seed and at the end.

Schema (one row per trained (map, steps, seed)):
    map_key      str    the reuse map, "2,1,1,1"
    flops_ratio  float  forward FLOPs per token over the all-ones map's
    steps        int    the run's length (base_steps * factor)
    factor       int    steps / base_steps (1, 2, 4)
    seed         int    init and batch-order seed
    val_loss     float  final validation loss (nats per token); NaN when the run diverged
    val_ppl      float  exp(val_loss)
    curve        str    JSON [[step, val_loss], ...] at the space's eval_fractions of the run (dense: 16 points)
    train_seconds float the run's training time on this machine (one thread)
    status       str    ok | diverged
    meta         str    JSON, the same on every row: space, base_steps, factors, seeds, maps, baseline, lr,
                        batch_size, seq_len, eval_windows, sample_seed
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from ilr_search.commands.api import train_report
from ilr_search.commands.bench import feasible_maps
from ilr_search.data.tokenizers import model_config
from ilr_search.training.flops import parse_budget
from jsonl_rows import read_jsonl
from ilr_search.space import load_space


def truth_maps(space_name: str, n_maps: int, sample_seed: int, budget: str) -> list[str]:
    """The baseline plus a seeded sample of the space's feasible maps, as map keys."""
    space = load_space(space_name)
    cfg = model_config(space)
    maps = feasible_maps(cfg.n_layers, space.search.max_reuse, parse_budget(budget, cfg).max_layer_runs(cfg))
    baseline = [1] * cfg.n_layers
    others = [m for m in maps if m != baseline]
    chosen = [baseline] + sorted(random.Random(sample_seed).sample(others, n_maps - 1))
    return [",".join(map(str, m)) for m in chosen]


def row_files(out: Path) -> list[Path]:
    """The JSON-lines files of a table's build: `<out>.jsonl` and every shard's `<out>.shardK.jsonl`."""
    return [out.with_suffix(".jsonl"), *sorted(out.parent.glob(f"{out.stem}.shard*.jsonl"))]


def read_done(out: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The finished jobs of every earlier (possibly killed) build of the table, by (map, steps, seed)."""
    return {(row["map_key"], row["steps"], row["seed"]): row for path in row_files(out) for row in read_jsonl(path)}


def parse_shard(text: str) -> tuple[int, int]:
    """`K/N`: shard K of N (0 <= K < N)."""
    k, _, n = text.partition("/")
    shard = (int(k), int(n))
    if not 0 <= shard[0] < shard[1]:
        raise SystemExit(f"--shard {text!r}: give K/N with 0 <= K < N")
    return shard


def write_table(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows).sort_values(["map_key", "steps", "seed"]).reset_index(drop=True)
    frame["meta"] = json.dumps(meta | {"seeds": sorted({int(s) for s in frame["seed"]})})  # the seeds it holds
    tmp = out.with_suffix(f".tmp{os.getpid()}.parquet")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="truth-small")
    ap.add_argument("--maps", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--factors", default="1,2,4")
    ap.add_argument("--budget", default="2x")
    ap.add_argument("--sample-seed", type=int, default=0)
    ap.add_argument("--map-list", default=None, help="the maps, space-separated, the baseline first (instead of a sample)")
    ap.add_argument("--shard", default="0/1", help="K/N: train the seeds s with s %% N == K")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shard, shards = parse_shard(args.shard)
    torch.set_num_threads(1)
    space = load_space(args.space)
    out = Path(args.out or f"benchmarks/data/truth-{Path(args.space).stem}.parquet")
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_suffix(".jsonl") if shards == 1 else out.with_suffix(f".shard{shard}.jsonl")
    maps = args.map_list.split() if args.map_list else truth_maps(args.space, args.maps, args.sample_seed, args.budget)
    factors = [int(f) for f in args.factors.split(",")]
    base = space.train.steps
    meta = {"space": args.space, "base_steps": base, "factors": factors, "seeds": list(range(args.seeds)),
            "maps": maps, "baseline": maps[0], "lr": space.train.lr, "batch_size": space.train.batch_size,
            "seq_len": space.model.seq_len, "eval_windows": space.train.eval_windows,
            "sample_seed": None if args.map_list else args.sample_seed, "budget": args.budget}
    done = read_done(out)
    started = time.perf_counter()
    for seed in (s for s in range(args.seeds) if s % shards == shard):
        for factor in factors:
            for key in maps:
                if (key, base * factor, seed) in done:
                    continue
                report = train_report(args.space, {"train": {"steps": base * factor, "seed": seed}},
                                      reuse_map=key).to_json()
                loss = report["val_loss"]
                row = {"map_key": key, "flops_ratio": report["flops_ratio"], "steps": base * factor,
                       "factor": factor, "seed": seed, "val_loss": loss if loss is not None else math.nan,
                       "val_ppl": report["val_ppl"] if report["val_ppl"] is not None else math.nan,
                       "curve": json.dumps([[p["step"], p["val_loss"]] for p in report["curve"]]),
                       "train_seconds": report["train_seconds"], "status": report["status"]}
                with jsonl.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
                done[(key, base * factor, seed)] = row
                print(f"[{time.perf_counter() - started:7.1f}s] seed {seed} {base * factor:5d} steps {key}: "
                      f"ppl {row['val_ppl']:.4f} ({row['train_seconds']:.1f}s)", flush=True)
        write_table(list(read_done(out).values()), meta, out)
    rows = read_done(out)
    write_table(list(rows.values()), meta, out)
    print(f"wrote {out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
