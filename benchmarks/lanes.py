"""Lanes against torch threads for the trial phase's training, on this machine: the default space's model and four of
its maps trained as the trial phase trains one fused group (K = 4), three ways, in one process, in turn:

- `lanes`: two Python threads, each training two of the maps fused at one torch thread (training/jobs.py lanes);
- `threads`: the four fused at two torch threads (the trial phase's layout before lanes);
- `one-thread`: the four fused at one torch thread.

    python benchmarks/lanes.py [--steps 150] [--reps 2] [--hogs 0] [--out benchmarks/data/lanes-DATE.json]

--hogs N starts N `python3 -c 'while 1: pass'` beside it (started 10 s before, stopped after). Each way's wall time
(model building and the evaluations included) is kept per repetition with the load average; the ratios compare
ways measured in the same run. It also checks that the lanes' maps end with the numbers of their halves trained
one after another (`same_numbers`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MAPS = [[1] * 8, [2, 1, 1, 1, 1, 1, 1, 1], [2, 2, 2, 1, 1, 1, 1, 2], [1, 2, 2, 2, 2, 1, 1, 1]]
WAYS = (("lanes", 1, 2), ("threads", 2, 1), ("one-thread", 1, 1))  # (name, torch threads, lanes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--hogs", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from ilr_search.data.tokens import load_space_tokens
    from ilr_search.space import load_space
    from ilr_search.training.jobs import Job, train_jobs
    from ilr_search.training.schedule import reuse_map_schedule

    space = load_space()
    data = load_space_tokens(space)
    train = dataclasses.replace(space.train, steps=args.steps, checkpoint_every=0)
    jobs = [Job(space.model, reuse_map_schedule(m), train) for m in MAPS]
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.hogs)]
    try:
        if hogs:
            time.sleep(10)
        rows = []
        for rep in range(args.reps):
            for name, threads, lanes in WAYS:
                torch.set_num_threads(threads)
                start = time.perf_counter()
                results = train_jobs(jobs, data, fuse=4, lanes=lanes)
                seconds = time.perf_counter() - start
                rows.append(
                    {
                        "rep": rep,
                        "way": name,
                        "threads": threads,
                        "lanes": lanes,
                        "seconds": round(seconds, 3),
                        "load_average": os.getloadavg()[0],
                        "val_loss": [r.val_loss for r in results],
                    }
                )
                print(f"{name:10s} rep {rep}: {seconds:6.2f} s (load {os.getloadavg()[0]:.2f})", flush=True)
        torch.set_num_threads(1)
        halves = train_jobs(jobs[:2], data, fuse=2) + train_jobs(jobs[2:], data, fuse=2)
    finally:
        for h in hogs:
            h.kill()
    same = all(r["val_loss"] == [h.val_loss for h in halves] for r in rows if r["way"] == "lanes")

    def best(way: str) -> float:
        return min(r["seconds"] for r in rows if r["way"] == way)

    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {torch.__version__}",
        "command": "python benchmarks/lanes.py " + " ".join(sys.argv[1:]),
        "steps": args.steps,
        "hogs": args.hogs,
        "rows": rows,
        "threads_over_lanes": round(best("threads") / best("lanes"), 3),
        "one_thread_over_lanes": round(best("one-thread") / best("lanes"), 3),
        "same_numbers": same,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
    day = summary["date"][:10]
    out = (
        Path(args.out)
        if args.out
        else ROOT / "benchmarks" / "data" / f"lanes{'-loaded' if args.hogs else ''}-{day}.json"
    )
    out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
