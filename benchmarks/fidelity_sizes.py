"""Which CPU-sized proxy ranks maps as a 4x longer training does? For one proxy size: trains a fixed set of maps
at N steps and at factor*N steps (everything else equal) and prints the rank agreement.

    python benchmarks/fidelity_sizes.py --d-model 64 --steps 400 --batch-size 16 --lr 3e-3 [--factor 4]

Prints one JSON line per map and a summary line (Spearman, Kendall, which map is best at each length, wall s).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from scipy.stats import kendalltau, spearmanr

from ilr_search.data.tokenizers import model_config
from ilr_search.data.tokens import load_space_tokens
from ilr_search.training.flops import flops_ratio
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.space import load_space
from ilr_search.training.train import train_proxy

MAPS_8 = ["1,1,1,1,1,1,1,1", "2,1,1,1,1,1,1,1", "4,2,1,1,1,1,1,1", "3,2,2,1,1,1,1,1", "2,2,2,2,1,1,1,1",
          "1,1,1,1,1,1,1,4", "1,1,1,1,1,1,2,2", "1,1,2,2,2,2,1,1"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default=None)
    ap.add_argument("--d-model", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--maps", default=";".join(MAPS_8))
    ap.add_argument("--dtype", default="fp32")
    args = ap.parse_args()
    space = load_space(args.space, {"model": {"d_model": args.d_model, "heads": args.heads, "seq_len": args.seq_len},
                                    "train": {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                                              "dtype": args.dtype, "checkpoint_every": 0}})
    data = load_space_tokens(space)
    cfg = model_config(space, data.vocab_size)
    maps = [[int(x) for x in m.split(",")] for m in args.maps.split(";")]
    results = {}
    t0 = time.perf_counter()
    for length in (1, args.factor):
        train = dataclasses.replace(space.train, steps=space.train.steps * length)
        for m in maps:
            r = train_proxy(cfg, reuse_map_schedule(m), data, train)
            key = ",".join(map(str, m))
            results.setdefault(key, {})[length] = r.val_ppl
            results[key][f"curve{length}"] = [round(p.val_loss, 4) for p in r.curve]
            print(json.dumps({"map": key, "length": length, "steps": train.steps, "val_ppl": round(r.val_ppl, 4),
                              "ratio": round(flops_ratio(cfg, reuse_map_schedule(m)), 3),
                              "curve": results[key][f"curve{length}"], "s": round(r.train_seconds, 1)}), flush=True)
    keys = list(results)
    short = [results[k][1] for k in keys]
    long = [results[k][args.factor] for k in keys]
    print(json.dumps({"d_model": cfg.d_model, "steps": space.train.steps, "batch": space.train.batch_size,
                      "lr": space.train.lr, "seq": cfg.seq_len, "factor": args.factor,
                      "spearman": round(spearmanr(short, long)[0], 3), "kendall": round(kendalltau(short, long)[0], 3),
                      "best_short": min(keys, key=lambda k: results[k][1]),
                      "best_long": min(keys, key=lambda k: results[k][args.factor]),
                      "wall_s": round(time.perf_counter() - t0)}), flush=True)


if __name__ == "__main__":
    main()
