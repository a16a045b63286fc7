"""An independent check of a study's verdict: its race front maps trained again at the target length on seeds the
race never used, everything else as stored in the study.

The race's intervals are t intervals over its seeds (3 by default). This trains each front map at `--seeds`
fresh seeds (after the race's) and reports, per map, whether the fresh seeds' mean falls inside the race's
interval, and, paired by seed, the difference of each front map to the baseline over all seeds (the race's and
the fresh ones), with the same paired t test the race uses: does the verdict still hold?

    python benchmarks/verdict_check.py --storage sqlite:///studies/ilr-search.db [--study NAME] [--seeds 2]
        [--out benchmarks/data/verdict-check-DATE.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ilr_search.commands.audit import stored_space  # noqa: E402
from ilr_search.data.tokens import load_space_tokens
from ilr_search.data.tokenizers import model_config  # noqa: E402
from ilr_search.training.fused import train_fused  # noqa: E402
from ilr_search.commands.report import pareto_report  # noqa: E402
from ilr_search.training.schedule import reuse_map_schedule  # noqa: E402
from ilr_search.search.studies import default_study, open_study  # noqa: E402
from ilr_search.analysis.stats import paired_comparison  # noqa: E402
from ilr_search.storage import parse_storage  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", default=None)
    parser.add_argument("--seeds", type=int, default=2, help="fresh seeds per front map")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / f"verdict-check-{date.today()}.json")
    args = parser.parse_args()
    name = args.study or default_study(args.storage)[0]
    report = pareto_report(name, args.storage).to_json()
    race = report["race"]
    front = [p for p in report["pareto"] if p["interval"][0] is not None]
    if not front or race is None:
        raise SystemExit("error: the study has no raced front to check (run it with the race on)")
    study = open_study(parse_storage(args.storage), name)
    steps = report["target_steps"]
    space = stored_space(study, steps)
    data = load_space_tokens(space)
    model = model_config(space)
    raced = max(max(p["seeds"]) for p in front)
    fresh = [raced + 1 + i for i in range(args.seeds)]
    cfg = replace(space.train, steps=steps, checkpoint_every=0, device="cpu", dtype="fp32")
    members = [(p, seed) for p in front for seed in fresh]
    t0 = time.perf_counter()
    results = train_fused(model, [reuse_map_schedule(p["reuse_map"]) for p, _ in members], data, cfg,
                          seeds=[seed for _, seed in members])
    seconds = time.perf_counter() - t0
    stored = {(r["map_key"], r["steps"], r["seed"]): r["val_loss"] for r in race["results"]}
    losses: dict[str, dict[int, float]] = {}
    for p in front:
        key = ",".join(map(str, p["reuse_map"]))
        losses[key] = {s: stored[(key, steps, s)] for s in p["seeds"] if stored.get((key, steps, s)) is not None}
    for (p, seed), result in zip(members, results):
        losses[",".join(map(str, p["reuse_map"]))][seed] = result.val_loss
    baseline = next(",".join(map(str, p["reuse_map"])) for p in front if set(p["reuse_map"]) == {1})
    rows = []
    for p in front:
        key = ",".join(map(str, p["reuse_map"]))
        fresh_ppl = math.exp(sum(losses[key][s] for s in fresh) / len(fresh))
        row = {"map": key, "race_seeds": p["seeds"], "race_ppl": p["val_ppl"], "race_interval": p["interval"],
               "fresh_seeds": fresh, "fresh_ppl": fresh_ppl,
               "fresh_mean_in_interval": p["interval"][0] <= fresh_ppl <= p["interval"][1],
               "all_seeds_ppl": math.exp(sum(losses[key].values()) / len(losses[key]))}
        if key != baseline:
            c = paired_comparison(losses[key], losses[baseline], 0.9)
            row |= {"vs_baseline_seeds": list(c.seeds), "vs_baseline_mean_loss_diff": c.mean_diff,
                    "vs_baseline_interval": c.interval, "beats_baseline_all_seeds": c.a_better,
                    "baseline_beats_it_all_seeds": paired_comparison(losses[baseline], losses[key], 0.9).a_better}
        rows.append(row)
    out = {"date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "load_average": os.getloadavg(), "study": name, "target_steps": steps, "verdict": report["verdict"],
           "train_seconds": seconds, "maps": rows}
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
