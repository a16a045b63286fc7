"""Trials per hour of the default run with `--fuse 1` (one map at a time, today's path) against `--fuse auto` (K,
and on a CPU workers against threads, from the probe), measured in one command, back to back.

    python benchmarks/trials_per_hour.py                          # the default space, 8 trials, no race
    python benchmarks/trials_per_hour.py --n-trials 8 --rounds 2  # fuse 1, auto, auto, fuse 1

Each run is the real command, `python -m ilr_search run --budget 1.5x --layers 8 --n-trials N --target 1x
--race-seeds 1 --fuse F` (`--target 1x --race-seeds 1`: no race), in a fresh SQLite storage in a temporary
folder, its reference runs (the baseline's extra seeds, the second seed) included. Trials per hour are counted
as finished trials / wall time of the whole command (start-up, the auto probe and the reference runs included).
A first run of one trial fills the token cache, so neither side is charged for it. Rounds after the first
alternate the order, so a load that changes during the benchmark falls on both sides. The machine load
(`os.getloadavg`) before and after each run is recorded next to it; on a shared machine say so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_once(variant: str, n_trials: int, folder: Path, tag: str, extra: list[str]) -> dict:
    """One run; `variant` is a --fuse value, or 1/1thread: --fuse 1 with OMP_NUM_THREADS=1 (one core)."""
    fuse, _, threads = variant.partition("/")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | {"PYTHONPATH": str(ROOT)}
    if threads:
        env["OMP_NUM_THREADS"] = threads.removesuffix("thread")
    storage = f"sqlite:///{folder / f'{tag}.db'}"
    cmd = [sys.executable, "-m", "ilr_search", "run", "--budget", "1.5x", "--layers", "8", "--n-trials", str(n_trials),
           "--target", "1x", "--race-seeds", "1", "--fuse", fuse, "--storage", storage, "--study", tag, "--json",
           *extra]
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout)
    choice = next((line for line in proc.stderr.splitlines() if line.startswith("fuse auto:")), "")
    return {"variant": variant, "fuse": fuse, "n_trials": summary["n_trials"], "wall_s": wall,
            "trials_per_hour": 3600 * summary["n_trials"] / wall, "references": sorted(summary["references"]),
            "choice": choice, "workers": len(summary.get("workers", [])) or 1,
            "load_before": load_before, "load_after": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-trials", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1, help="pairs of runs; later rounds alternate the order")
    ap.add_argument("--variants", default="1,auto",
                    help="comma-separated --fuse values; 1/1thread: --fuse 1 at OMP_NUM_THREADS=1")
    ap.add_argument("--out", default=None)
    ap.add_argument("extra", nargs="*", help="more `run` options, after --")
    args = ap.parse_args()
    now = dt.datetime.now(dt.timezone.utc)
    out = Path(args.out or ROOT / f"benchmarks/data/trials-per-hour-{now.date().isoformat()}.json")
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        run_once("1", 1, folder, "warmup", args.extra + ["--steps", "2"])  # the token cache (steps do not change it)
        for r in range(args.rounds):
            variants = args.variants.split(",")
            for variant in variants if r % 2 == 0 else variants[::-1]:
                tag = f"fuse-{variant.replace('/', '-')}-{r}"
                row = run_once(variant, args.n_trials, folder, tag, args.extra) | {"round": r}
                rows.append(row)
                print(f"round {r}  --fuse {variant:9s}  {row['n_trials']} trials in {row['wall_s']:6.1f} s  "
                      f"{row['trials_per_hour']:6.1f} trials/h  load {row['load_before']:.1f}-{row['load_after']:.1f}"
                      + (f"  [{row['choice']}]" if row["choice"] else ""), flush=True)
    one = sum(r["wall_s"] for r in rows if r["variant"] == "1")
    auto = sum(r["wall_s"] for r in rows if r["variant"] == "auto")
    result = {"date": now.isoformat(timespec="seconds"), "uptime_at_start": uptime,
              "uptime_at_end": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
              "cpu_count": os.cpu_count(), "n_trials": args.n_trials, "rows": rows, "speedup_auto_over_fuse1": one / auto}
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"auto / fuse 1 trials per hour: {one / auto:.2f}x  (wrote {out})")


if __name__ == "__main__":
    main()
