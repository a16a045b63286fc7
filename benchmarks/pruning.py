"""How much does Pareto pruning save, and what does it lose? The same study with and without pruning.

    python benchmarks/pruning.py [--space search_spaces/default.toml] [--layers 4] [--budget 2x] [--n-trials 16]
        [--pruner pareto|pareto-eager] [--d-model N --steps N --batch-size N --lr X]

First a study without pruning (random sampler, fixed seed); then a study with `--pruner` (default: the
calibrated `pareto`) that is fed
the very same proposals, in the same order, through enqueue. Reports the share of training steps saved
(goal >= 50%) and how many maps of the unpruned study's final front the pruned study pruned (goal 0).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from ilr_search.space import load_space
from ilr_search.search.studies import list_trials
from ilr_search.search.run import RunRequest, run_in_process


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default=None)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--budget", default="2x")
    ap.add_argument("--n-trials", type=int, default=16)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--d-model", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--pruner", default="pareto", choices=["pareto", "pareto-eager"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    space = load_space(args.space, {"model": {"layers": args.layers, "d_model": args.d_model},
                                    "train": {"steps": args.steps, "seed": args.seed, "checkpoint_every": 0,
                                              "batch_size": args.batch_size, "lr": args.lr},
                                    "search": {"noise_seeds": 0, "families": ["ilr"]}})
    with tempfile.TemporaryDirectory() as tmp:
        storage = f"sqlite:///{Path(tmp) / 'bench.db'}"
        t0 = time.perf_counter()
        plain = run_in_process(RunRequest(space, args.budget, "unpruned", storage, args.n_trials, sampler="random",
                                     pruner="none", race=False)).to_json()  # the pruning's cost and losses only, not the race after it
        t1 = time.perf_counter()
        maps = [t["proposed_map"] or t["reuse_map"] for t in list_trials("unpruned", storage) if t["reuse_map"]]
        pruned = run_in_process(RunRequest(space, args.budget, "pruned", storage, args.n_trials, sampler="random",
                                      pruner=args.pruner, enqueue_maps=tuple(map(tuple, maps)), race=False)).to_json()
        t2 = time.perf_counter()
        pruned_trials = list_trials("pruned", storage)
    front_maps = [p["reuse_map"] for p in plain["pareto"]]
    pruned_maps = [t["reuse_map"] for t in pruned_trials if t["state"] == "PRUNED"]
    lost = [m for m in front_maps if m in pruned_maps]
    saved = 1 - pruned["steps_trained"] / plain["steps_trained"]
    result = {
        "config": {"layers": args.layers, "budget": args.budget, "n_trials": args.n_trials,
                   "steps": space.train.steps, "d_model": space.model.d_model, "seed": args.seed,
                   "pruner": args.pruner},
        "steps_unpruned": plain["steps_trained"], "steps_pruned": pruned["steps_trained"],
        "share_saved": saved, "steps_saved_by_pruning": pruned["steps_saved_by_pruning"],
        "n_pruned": pruned["n_pruned"], "front_maps": front_maps, "front_maps_pruned": lost,
        "seconds_unpruned": t1 - t0, "seconds_pruned": t2 - t1,
        "same_proposals": maps == [t["proposed_map"] or t["reuse_map"] for t in pruned_trials if t["reuse_map"]][:len(maps)],
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.n_trials} trials, {args.layers} layers, d_model {space.model.d_model}, {space.train.steps} steps, "
          f"budget {args.budget}, seed {args.seed}; same proposals: {result['same_proposals']}")
    print("| study | steps trained | wall s | pruned trials |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| no pruning | {plain['steps_trained']} | {t1 - t0:.0f} | 0 |")
    print(f"| {args.pruner} pruning | {pruned['steps_trained']} | {t2 - t1:.0f} | {pruned['n_pruned']} |")
    print(f"steps saved: {saved:.1%}; maps of the unpruned front ({len(front_maps)}) pruned: {len(lost)} {lost}")


if __name__ == "__main__":
    main()
