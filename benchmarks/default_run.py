"""The default run, timed: README's Quickstart command in a fresh folder with a fresh token cache, on a quiet machine
or with both cores kept busy, and what it concluded.

    python benchmarks/default_run.py [--hogs 0] [--out benchmarks/data/default-run-quiet-2026-12-01.json]
        [--keep FOLDER] [-- extra run flags]

--hogs N starts N `python3 -c 'while 1: pass'` processes beside the run (2 on this 2-core machine: both cores busy)
and stops them after it; the run starts after the hogs have run --settle seconds (60), untimed. --keep copies the run's study database (studies/ilr-search.db) into FOLDER. The JSON keeps the wall time, the verdict, the detectable gap, the equal-compute
reference, the race's compute, every race run, the machine and the load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = ["ilr-search", "run", "--budget", "1.5x", "--layers", "8", "--json"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hogs", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--settle", type=float, default=60.0,
                    help="seconds the hogs run before the run starts (not timed), so the machine is busy when it starts")
    ap.add_argument("--keep", default=None, help="copy the run's study database into this folder")
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    out = Path(args.out or f"benchmarks/data/default-run-{'quiet' if not args.hogs else 'loaded'}-{time.strftime('%Y-%m-%d')}.json")
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "ILR_SEARCH_CACHE": str(Path(folder) / "cache")}
        hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.hogs)]
        if hogs:
            time.sleep(args.settle)  # a busy machine has been busy for a while: its load average says so
        load_before = os.getloadavg()
        started = time.perf_counter()
        try:
            proc = subprocess.run([*COMMAND, *args.extra], cwd=folder, env=env, capture_output=True, text=True)
        finally:
            seconds = time.perf_counter() - started
            for hog in hogs:
                hog.kill()
        load_after = os.getloadavg()
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for db in Path(folder).glob("studies/*.db"):
                shutil.copy2(db, Path(args.keep) / db.name)
    if proc.returncode != 0:
        raise SystemExit(f"the run failed ({proc.returncode}): {proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout)
    race = summary["race"] or {}
    record = {"command": " ".join(COMMAND + args.extra), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores", "hogs": args.hogs, "settle_seconds": args.settle if args.hogs else 0,
              "load_before": load_before, "load_after": load_after, "wall_seconds": seconds,
              "verdict": summary["verdict"], "detectable_gap": summary["detectable_gap"],
              "equal_compute": summary["equal_compute"], "pareto": summary["pareto"],
              "trial_steps": summary["steps_trained"], "race_compute_steps": race.get("compute_steps"),
              "race_stopped": race.get("stopped"), "comparisons": race.get("comparisons"),
              "race_runs": [r for r in race.get("results", []) if r["source"].startswith("run ")],
              "n_complete": summary["n_complete"], "n_pruned": summary["n_pruned"], "study": summary["study"]}
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{seconds:.0f} s; {summary['verdict']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
