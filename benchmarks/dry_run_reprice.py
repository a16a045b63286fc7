"""A stored dry run's probes priced again by the current estimate (commands/dryrun.race_seconds), without probing:
what today's formula says about a plan timed earlier, beside what the run it planned took.

    python benchmarks/dry_run_reprice.py DRY_RUN.json [--run DEFAULT_RUN.json] [--screen N ...]

DRY_RUN.json: `ilr-search run ... --dry-run --json` (its probes, its race, its trials' and references' estimate).
--run: a benchmarks/default_run.py record of the run it planned (its phases' wall seconds, read from the printed
phase table). --screen: price the race as if the screen had N maps (the default plan's 12; a run that screened
fewer). The race's processes and fused group size are the dry run's layout (its `layout` line).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from ilr_search.commands.dryrun import AdaptiveRace, Probe, RacePlan, probed_seconds, race_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dry_run")
    ap.add_argument("--run", default=None)
    ap.add_argument("--screen", type=int, nargs="*", default=None)
    ap.add_argument("--processes", type=int, default=2, help="race worker processes (2 on a 2-core CPU)")
    args = ap.parse_args()
    d = json.loads(Path(args.dry_run).read_text())
    base, costly = (
        Probe(p["label"], p["reuse_map"], p["layer_runs"], p["fuse"], p["threads"], p["seconds_per_step"],
              p["seconds_per_eval"], p["step_seconds"])
        for p in d["probe"]
    )
    steps, evals, race = d["train"]["steps"], len(d["train"]["eval_steps"]), d["race"]
    target = race["target_steps"]
    fuse = int(re.search(r"K = (\d+)", d["layout"]).group(1))  # type: ignore[union-attr]

    def run_seconds(layer_runs: float) -> float:
        return probed_seconds(base, costly, layer_runs, steps, evals) * target / steps

    before_race = d["estimated_seconds"] - d["estimated_race_seconds"][0]
    mid = (base.layer_runs + costly.layer_runs) / 2
    print(f"{args.dry_run}: layout {d['layout']}; stored estimate {d['estimated_seconds'] / 60:.2f} to "
          f"{d['estimated_seconds_max'] / 60:.2f} min (race {d['estimated_race_seconds'][0]:.0f} to "
          f"{d['estimated_race_seconds'][1]:.0f} s); trials and references {before_race:.0f} s")
    for screen in args.screen or [race["screen"]]:
        shape = AdaptiveRace(screen, race["contenders"], race["first_test_seeds"], race["max_seeds"],
                             race["equal_compute"], race.get("look_every", 1))
        deep = 1 if shape.equal_compute == "depth" else 0
        least_runs = screen + shape.contenders * shape.first_test_seeds + deep * (shape.first_test_seeds + 1)
        most_runs = screen + shape.contenders * (shape.max_seeds - 1) + deep * shape.max_seeds
        plan = RacePlan("adaptive", target, least_runs, most_runs, least_runs * target, most_runs * target, shape)
        lo, hi = race_seconds(plan, run_seconds, base.layer_runs, mid, costly.layer_runs, args.processes, fuse)
        print(f"  screen {screen}: race {lo:.0f} to {hi:.0f} s; the study {(before_race + lo) / 60:.2f} to "
              f"{(before_race + hi) / 60:.2f} min")
    if args.run:
        r = json.loads(Path(args.run).read_text())
        rows = [re.findall(r"[\w.]+", line) for line in r["stdout"] if re.match(r"^│\s+[a-z_]+ │\s+[\d.]+ │", line)]
        phases = {row[0]: float(row[1]) for row in rows}
        print(f"{args.run}: {r['wall_seconds'] / 60:.2f} min in all (install included); phases "
              + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items())
              + f"; their sum {sum(phases.values()) / 60:.2f} min")


if __name__ == "__main__":
    main()
