"""Routed maps against fixed maps of the same realised FLOPs, raced (issue 55 item 4, second bullet).

    python benchmarks/routed_vs_fixed.py [--resume] [--extra-seeds] [--quick] [--out FILE] [--work DIR]
                                         [--time-budget 30m] [--routed "MAP|capacity=C ..."] [--study NAME]

On truth-nope (4 layers, NoPE: recurrence is known to win there at its target, 600 steps), for each routed map in
ROUTED (`capacity=0.5`: each pass k >= 1 runs only the tokens its router chooses):

1. pilot: `ilr-search train --space truth-nope --reuse-map MAP --knobs capacity=C --steps S` at the race's length
   (S = 4x the proxy, seed 0: the screen's run of the race study, trained alone), whose `--json` gives the realised
   fraction of each routed pass (`route_fractions`) and `realised_flops_ratio` beside the nominal `flops_ratio`;
2. its fixed map (capacity 1): of the maps that repeat no layer more than the routed map does, the one whose FLOPs
   (`flops --json`) are nearest the routed map's realised FLOPs; ties go to the map whose extra passes are spread
   most evenly (2,2,1,1 before 3,1,1,1 for 3,3,1,1), i.e. the shape nearest the routed map's;
3. one race study trains exactly the plain model, the routed maps and their fixed maps (`run --enqueue`, n_trials =
   race_contenders = their number, no paper maps, no noise seeds, `--pruner none`, `--equal-compute off`) and races
   them at the target on held-out seeds with the project's race (sequential paired tests against the plain model,
   Holm over the contenders, dominance by a contender of no more FLOPs), under `--time-budget` (the same command,
   this script with `--resume`, continues an undecided race);
4. afterwards, descriptive only: the paired loss differences routed - fixed on the seeds both ran (the race tests
   each map against the plain model, not against each other), and each race run's wall seconds from the study's
   table ilr_runs; with --extra-seeds, each routed map is first trained (`train --seed S`, which is the race's run
   at seed S: the pilot at seed 0 equals the race's screen run) at the race's seeds its futility stop left out, so
   that routed and fixed pair on every seed, with the realised FLOPs of each of those runs.

The run's answer, verdict and race are stored as `run --json` prints them; trials --json (route fractions and
realised FLOPs of the routed trials at the proxy's 150 steps) and the race runs beside them. --resume reuses what
the data file already holds (pilots, the chosen fixed maps) and resumes the race study in --work.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from itertools import product
from pathlib import Path

import tomllib
from preset_space import write_space  # benchmarks/: the folder of a script run from it

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "ilr_search" / "search_spaces"
OUT = ROOT / "benchmarks" / "data" / "routed-vs-fixed-2026-12-06.json"
SPACE = "truth-nope"
ROUTED = ["3,3,1,1|capacity=0.5", "3,1,1,1|capacity=0.5"]
BASELINE = "1,1,1,1"
# 2x, not 1.5x: every map here costs at most 1.455x (nominal), but the budget repair of an enqueued map paid each
# routed pass a whole layer's cost, so at 1.5x (6 layer runs) `3,3,1,1|capacity=0.5` (1.41x) was trained as
# `2,2,1,1|capacity=0.5`; at 2x (8 layer runs) no map here is repaired, whatever the repair counts.
BUDGET = "2x"


def cli(args: list[str], log: Path, check: bool = True) -> tuple[dict, float, str]:
    command = [sys.executable, "-m", "ilr_search", *args, "--json"]
    t0 = time.perf_counter()
    with open(log, "a", encoding="utf-8") as err:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 and check:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}); its stderr is in {log}")
    return json.loads(proc.stdout), seconds, "python -m ilr_search " + " ".join(args) + " --json"




def flops_of(space: str, text: str, log: Path) -> dict:
    counts, _, knobs = text.partition("|")
    f, _, _ = cli(["flops", "--space", space, "--reuse-map", counts, *(["--knobs", knobs] if knobs else [])], log)
    return {"flops_ratio": f["flops_ratio"], "flops_per_token": f["flops_per_token"], "params": f["params"]}


def fixed_match(space: str, routed: str, realised: float, log: Path) -> dict:
    """The fixed map nearest `realised` FLOPs among those repeating no layer more than `routed` does."""
    counts = [int(c) for c in routed.split("|")[0].split(",")]
    candidates = []
    for m in product(*(range(1, c + 1) for c in counts)):
        if max(m) == 1:
            continue
        text = ",".join(map(str, m))
        f = flops_of(space, text, log)
        candidates.append((abs(f["flops_ratio"] - realised), max(m), text, f))
    # ties: the most even spread, then the passes on the earliest layers (2,1,1,1 before 1,2,1,1), as routed maps do
    candidates.sort(key=lambda c: (round(c[0], 9), c[1], [-int(x) for x in c[2].split(",")]))
    gap, _, text, f = candidates[0]
    return {"map": text, **f, "gap_to_realised": gap,
            "candidates": {c[2]: c[3]["flops_ratio"] for c in candidates}}


def race_run_table(db: Path) -> list[dict]:
    """Every row of the study's table ilr_runs (seconds, seed, steps, loss, map), as stored."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        tables = [r[0] for r in con.execute("select name from sqlite_master where type = 'table'")]
        table = "ilr_runs" if "ilr_runs" in tables else None
        if table is None:
            return []
        rows = [dict(r) for r in con.execute(f"select * from {table}")]
    finally:
        con.close()
    for r in rows:  # curves and per-window scores are large; the figures here need neither
        for k in list(r):
            if isinstance(r[k], (bytes, str)) and len(r[k]) > 400:
                r[k] = f"<{len(r[k])} chars>"
    return rows


def paired(runs: list[dict], a: str, b: str, factor_steps: int) -> dict | None:
    """Mean paired loss difference a - b (nats) over the seeds where both ran at the target, with a t interval at
    90% (descriptive: the race's tests are against the plain model)."""
    def losses(m: str) -> dict[int, float]:
        out = {}
        for r in runs:
            key = r.get("map_key") or r.get("map") or ""
            if key == m and r.get("steps") == factor_steps and r.get("val_loss") is not None:
                out[int(r["seed"])] = float(r["val_loss"])
        return out
    la, lb = losses(a), losses(b)
    seeds = sorted(set(la) & set(lb))
    d = [la[s] - lb[s] for s in seeds]
    if len(d) < 2:
        return {"seeds": seeds, "differences": d} if d else None
    from scipy import stats  # noqa: PLC0415 (scipy ships with the project's environment)

    mean, sd = statistics.fmean(d), statistics.stdev(d)
    half = stats.t.ppf(0.95, len(d) - 1) * sd / math.sqrt(len(d))
    return {"seeds": seeds, "differences": d, "mean": mean, "sd": sd, "interval90": [mean - half, mean + half]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--work", type=Path, default=Path("/tmp/routed-vs-fixed"))
    ap.add_argument("--resume", action="store_true", help="reuse the data file's pilots and resume the race study")
    ap.add_argument("--quick", action="store_true", help="a check of the script: 40-step pilots, a 3m race")
    ap.add_argument("--time-budget", default="30m", help="the race study's --time-budget")
    ap.add_argument("--extra-seeds", action="store_true",
                    help="after the race, train each routed map at the race's seeds it did not reach (train --seed), "
                         "to pair it with its fixed map on every seed (descriptive)")
    ap.add_argument("--max-seeds", type=int, default=5, help="the race's max_seeds (5: 4 test seeds, looks at 2 and 4)")
    ap.add_argument("--routed", default=" ".join(ROUTED), help="the routed maps, space-separated (default: ROUTED)")
    ap.add_argument("--study", default="routed-vs-fixed", help="the race study's name (in --work/race.db)")
    a = ap.parse_args()
    routed_maps = a.routed.split()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    a.work.mkdir(parents=True, exist_ok=True)
    log = a.work / "stderr.log"
    data: dict = json.loads(a.out.read_text()) if a.resume and a.out.exists() else {}
    preset = tomllib.loads((PRESETS / f"{SPACE}.toml").read_text(encoding="utf-8"))
    target_steps = 4 * preset["train"]["steps"]
    pilot_steps = 40 if a.quick else target_steps

    def save() -> None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")

    data.setdefault("space", SPACE)
    data.setdefault("machine", {"platform": platform.platform(), "python": platform.python_version(),
                                "nproc": os.cpu_count(), "omp_num_threads": os.environ["OMP_NUM_THREADS"]})
    data.setdefault("started", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    data.setdefault("load_at_start", os.getloadavg())
    pilots = data.setdefault("pilots", {})
    for routed in routed_maps:
        if routed in pilots:
            continue
        counts, _, knobs = routed.partition("|")
        report, seconds, command = cli(["train", "--space", SPACE, "--reuse-map", counts, "--knobs", knobs,
                                        "--steps", str(pilot_steps)], log)
        keep = ("flops_ratio", "realised_flops_ratio", "route_fractions", "val_ppl", "val_loss", "train_seconds",
                "eval_seconds", "params", "steps")
        pilots[routed] = {"command": command, "wall_seconds": seconds, "load": os.getloadavg(),
                          **{k: report.get(k) for k in keep}}
        save()
        print(f"pilot {routed}: realised {report.get('realised_flops_ratio')} ({seconds:.0f} s)", file=sys.stderr)
    fixed = data.setdefault("fixed", {})
    for routed in routed_maps:
        if routed not in fixed:
            fixed[routed] = fixed_match(SPACE, routed, pilots[routed]["realised_flops_ratio"], log)
            save()
        print(f"{routed}: realised {pilots[routed]['realised_flops_ratio']:.4f} -> fixed {fixed[routed]['map']} "
              f"({fixed[routed]['flops_ratio']:.4f})", file=sys.stderr)
    maps = [BASELINE]
    for routed in routed_maps:
        maps += [routed, fixed[routed]["map"]]
    maps = list(dict.fromkeys(maps))
    data["flops"] = {m: flops_of(SPACE, m, log) for m in maps}
    save()

    db = a.work / "race.db"
    study = a.study
    space = write_space(
        a.work / "race.toml", SPACE,
        {"search": {"knobs": ["capacity"], "n_trials": len(maps), "enqueue_paper_maps": False, "noise_seeds": 0,
                    "race_contenders": len(maps), "race_screen": 12, "max_seeds": 4 if a.quick else a.max_seeds}},
        {"search": {"target": 2.0}} if a.quick else {})
    args = ["run", "--space", str(space), "--budget", BUDGET, "--pruner", "none", "--equal-compute", "off",
            "--enqueue", " ".join(maps), "--time-budget", "3m" if a.quick else a.time_budget,
            "--storage", f"sqlite:///{db}", "--study", study]
    t0 = datetime.now(timezone.utc).isoformat(timespec="seconds")
    run, seconds, command = cli(args, log)
    sessions = data.setdefault("race_sessions", [])
    sessions.append({"command": command, "started": t0, "seconds": seconds, "load_after": os.getloadavg(),
                     "answer": run.get("answer")})
    trials, _, _ = cli(["trials", "--study", study, "--storage", f"sqlite:///{db}"], log)
    runs = race_run_table(db)
    data["race_study"] = {"answer": run.get("answer"), "verdict": run.get("verdict"),
                          "answer_details": run.get("answer_details"), "race": run.get("race"),
                          "detectable_gap": run.get("detectable_gap"), "trials": trials.get("trials"),
                          "race_runs": runs}
    steps = target_steps // 2 if a.quick else target_steps
    data["routed_minus_fixed_race_seeds"] = {r: paired(runs, r, fixed[r]["map"], steps) for r in routed_maps}
    if a.extra_seeds:
        extra = data.setdefault("extra_runs", {})
        pool = sorted({int(r["seed"]) for r in runs if r.get("steps") == steps and r.get("val_loss") is not None})
        todo = [(m, s) for m in routed_maps for s in pool
                if f"{m}@{s}" not in extra
                and not any(r.get("map_key") == m and int(r["seed"]) == s and r.get("val_loss") is not None
                            and r.get("steps") == steps for r in runs)]

        def train_at(job: tuple[str, int]) -> tuple[str, dict]:
            m, seed = job
            counts, _, knobs = m.partition("|")
            report, seconds, command = cli(["train", "--space", SPACE, "--reuse-map", counts, "--knobs", knobs,
                                            "--steps", str(steps), "--seed", str(seed)], log)
            keep = ("val_loss", "val_ppl", "flops_ratio", "realised_flops_ratio", "route_fractions", "train_seconds",
                    "eval_seconds")
            return f"{m}@{seed}", {"command": command, "wall_seconds": seconds, "map_key": m, "seed": seed,
                                   "steps": steps, **{k: report.get(k) for k in keep}}

        with ThreadPoolExecutor(max_workers=2) as pool_:  # two processes, as the race's two workers
            for key, row in pool_.map(train_at, todo):
                extra[key] = row
                save()
        every = runs + [dict(r) for r in extra.values()]
        data["routed_minus_fixed_all_seeds"] = {r: paired(every, r, fixed[r]["map"], steps) for r in routed_maps}
        data["plain_minus_routed_all_seeds"] = {r: paired(every, BASELINE, r, steps) for r in routed_maps}
    data["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    save()
    print(run.get("answer"), file=sys.stderr)
    print(run.get("verdict"), file=sys.stderr)


if __name__ == "__main__":
    main()
