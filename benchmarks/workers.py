"""Trials per hour of `run --workers N` for several N, on one study setup, in one process run.

    python benchmarks/workers.py --space default --budget 1.5x --workers 1,2 --n-trials 6 --steps 200
    python benchmarks/workers.py --space paper-small-offline --budget 2x --workers 1,2,4 --n-trials 8,12,16

Each N gets a fresh SQLite study (the default storage kind, shared by the N processes) with pruning off and
no reference runs, so that every trial trains a full proxy. Trials per hour are counted two ways:
  wall    finished trials / wall time of the whole command (start-up, tokenizer cache and compiles included);
  steady  trained trials / (last trial end - first trial start), from the trials' own timestamps.
A warm-up run of one trial fills the token cache and the compile cache first, so N=1 is not charged for them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import optuna

from ilr_search.space import load_space
from ilr_search.search.progress import RunReporter
from ilr_search.commands.workers import run_workers
from ilr_search.search.run import RunRequest


def measure(space, budget: str, workers: int, n_trials: int, folder: Path) -> dict:
    storage = f"sqlite:///{folder / f'workers{workers}.db'}"
    t0 = time.perf_counter()
    summary = run_workers(RunRequest(space, budget, f"w{workers}", storage, n_trials, pruner="none"), workers, RunReporter()).to_json()
    wall = time.perf_counter() - t0
    trials = optuna.load_study(study_name=f"w{workers}", storage=storage).get_trials(deepcopy=False)
    trained = [t for t in trials if t.state.is_finished() and "reused_from" not in t.user_attrs
               and t.datetime_start and t.datetime_complete]
    span = (max(t.datetime_complete for t in trained) - min(t.datetime_start for t in trained)).total_seconds()
    return {"workers": workers, "n_trials": summary["n_trials"], "trained": len(trained), "wall_s": wall,
            "trials_per_hour_wall": 3600 * summary["n_trials"] / wall,
            "trials_per_hour_steady": 3600 * len(trained) / span if span > 0 else None,
            "worker_exit_codes": [w["exit_code"] for w in summary.get("workers", [])]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default="default")
    ap.add_argument("--budget", default="1.5x")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--n-trials", default="6", help="trials per N: one number, or one per N")
    ap.add_argument("--steps", type=int, default=None, help="proxy steps (default: the space's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    space = load_space(args.space, {"train": {"steps": args.steps}})
    space = dataclasses.replace(space, search=dataclasses.replace(space.search, noise_seeds=0, families=("ilr",)))
    counts = [int(w) for w in args.workers.split(",")]
    trials = [int(n) for n in args.n_trials.split(",")]
    trials = trials * len(counts) if len(trials) == 1 else trials
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        run_workers(RunRequest(space, args.budget, "warmup", f"sqlite:///{folder / 'warmup.db'}", 1, pruner="none"),
                    1, RunReporter())
        for workers, n in zip(counts, trials):
            rows.append(measure(space, args.budget, workers, n, folder))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"space": args.space, "budget": args.budget, "steps": space.train.steps, "rows": rows}))
        return
    base = rows[0]["trials_per_hour_steady"] or 0
    print(f"{args.space}, budget {args.budget}, {space.train.steps} steps, device {space.train.device}")
    print("| workers | trials | wall s | trials/h (wall) | trials/h (steady) | vs first row |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        ratio = r["trials_per_hour_steady"] / base if base and r["trials_per_hour_steady"] else float("nan")
        print(f"| {r['workers']} | {r['n_trials']} | {r['wall_s']:.0f} | {r['trials_per_hour_wall']:.0f} | "
              f"{r['trials_per_hour_steady'] or 0:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
