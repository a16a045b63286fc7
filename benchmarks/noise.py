"""Is the default proxy long enough to rank maps? Seed-to-seed spread of the baseline vs gaps between maps.

    python benchmarks/noise.py [--space search_spaces/default.toml] [--seeds 3] [--budget 1.5x]

Trains the all-ones baseline at several seeds (each seed changes the initialisation and the data order), and a
set of maps within the budget at seed 0 (the common random numbers a study uses). The proxy ranks maps
meaningfully when the baseline's seed-to-seed spread is smaller than the typical gap between maps.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time

from ilr_search.data.tokenizers import model_config
from ilr_search.data.tokens import load_space_tokens
from ilr_search.training.flops import flops_ratio, parse_budget
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.space import load_space
from ilr_search.search.maps import repair_to_budget
from ilr_search.training.train import resolve_device, resolve_dtype, train_proxy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default=None)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", default="1.5x")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--eval-windows", type=int, default=None)
    args = ap.parse_args()
    space = load_space(args.space, {"train": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                                              "eval_windows": args.eval_windows},
                                    "model": {"seq_len": args.seq_len}})
    data = load_space_tokens(space)
    cfg = model_config(space, data.vocab_size)
    budget = parse_budget(args.budget, cfg)
    dtype = resolve_dtype(space.train.dtype, resolve_device(space.train.device))
    train = dataclasses.replace(space.train, dtype=dtype)
    L, runs = cfg.n_layers, budget.max_layer_runs(cfg)
    shapes = [[4, 2] + [1] * (L - 2), [2] + [1] * (L - 1), [1] * (L - 1) + [2], [1] * (L - 4) + [2, 2, 2, 2],
              [2, 2, 2, 2] + [1] * (L - 4), [1, 1, 2, 2] + [1] * (L - 4)]
    maps = []
    for m in shapes:
        m = repair_to_budget(m, runs)
        if m not in maps:
            maps.append(m)
    t0 = time.perf_counter()
    baseline = [1] * L
    seed_ppl = [train_proxy(cfg, reuse_map_schedule(baseline), data, dataclasses.replace(train, seed=s)).val_ppl
                for s in range(args.seeds)]
    map_ppl = {tuple(m): train_proxy(cfg, reuse_map_schedule(m), data, train).val_ppl for m in maps}
    map_ppl[tuple(baseline)] = seed_ppl[0]
    gaps = [abs(a - b) for a, b in itertools.combinations(map_ppl.values(), 2)]
    spread = max(seed_ppl) - min(seed_ppl)
    print(f"space {space.source}: {L} layers, d_model {cfg.d_model}, seq {cfg.seq_len}, {train.steps} steps x "
          f"{train.batch_size} sequences, dtype {dtype}; {time.perf_counter() - t0:.0f} s")
    print(f"baseline val_ppl by seed: {', '.join(f'{p:.3f}' for p in seed_ppl)}; spread (max - min) {spread:.3f}, "
          f"std {statistics.stdev(seed_ppl):.3f}")
    print("| reuse map | flops ratio | val_ppl (seed 0) |")
    print("| --- | ---: | ---: |")
    for m, p in sorted(map_ppl.items(), key=lambda kv: kv[1]):
        print(f"| {','.join(map(str, m))} | {flops_ratio(cfg, reuse_map_schedule(list(m))):.3f} | {p:.3f} |")
    print(f"gaps between maps: median {statistics.median(gaps):.3f}, max {max(gaps):.3f}; "
          f"median gap / seed spread = {statistics.median(gaps) / spread:.2f}")


if __name__ == "__main__":
    main()
