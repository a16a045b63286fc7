"""Score the racing policies (the adaptive race, the fixed 3-seed race) against the one-seed rule and no pruning
over a truth table (benchmarks/truth.py), each replayed in 10 orders, and write the figures as JSON.

    python benchmarks/race_replay.py [--table benchmarks/data/truth-truth-small.parquet] [--orders 10]
        [--race-seeds N] [--confidence 0.9] [--out benchmarks/data/race-replay-truth-small.json]

The adaptive race draws its seeds from all the table's (or --race-seeds of them); the fixed race from 3 of them
(or --race-seeds), as a default study did before the adaptive race.

Per policy (replays.policy.replay_policy): mean compute in training steps, maps claimed to beat the baseline at
the target and how many of them do not in the table's seed mean (the goal: at most 10%), the regret of the
reported best in the table's pooled seed sd at the target (the goal: within one sd), and for the race the share
of its front intervals (nominal `confidence`) that hold the table's seed mean (the goal: at least 80%). With
`--race-seeds` below the table's seed count the race sees only some of the seeds the truth is averaged over,
which is what makes the coverage figure informative.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from replays.policy import POLICIES, replay_policy

SUMMARY_KEYS = ("mean_compute_steps", "exhaustive_steps", "maps_claimed", "false_claims", "false_claim_share",
                "decided_claimed_share",
                "mean_regret_sd", "max_regret_sd", "regret_within_1sd_share", "intervals", "interval_coverage")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", default="benchmarks/data/truth-truth-small.parquet")
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--race-seeds", type=int, default=None)
    ap.add_argument("--confidence", type=float, default=0.9)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    seeds = {"race": args.race_seeds, "race-fixed": args.race_seeds or 3}
    reports = {p: replay_policy(args.table, p, args.orders, 0, seeds.get(p), args.confidence).to_json()
               for p in POLICIES}
    first = reports["race"]
    summary = {p: {k: r[k] for k in SUMMARY_KEYS} for p, r in reports.items()}
    out = Path(args.out or f"benchmarks/data/race-replay-{Path(args.table).stem.removeprefix('truth-')}"
                           f"{'-' + str(args.race_seeds) + 'seeds' if args.race_seeds else ''}.json")
    out.write_text(json.dumps({"table": args.table, "orders": args.orders, "race_seeds": args.race_seeds,
                               "confidence": args.confidence, "base_steps": first["base_steps"],
                               "target_steps": first["target_steps"], "table_seeds": first["table_seeds"],
                               "seed_sd_at_target": first["seed_sd_at_target"],
                               "table_better_than_baseline": first["table_better_than_baseline"],
                               "table_decided_better": first["table_decided_better"],
                               "summary": summary, "reports": reports}, indent=1, default=float) + "\n")
    for policy, row in summary.items():
        print(policy, json.dumps(row, default=float))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
