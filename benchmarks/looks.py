"""Looks after every test seed against looks every second seed (`look_every`), replayed over the truth tables as
they are (no planted gap): does the race claim a real winner, and how far is its reported best from the table's
best (regret, in the table's seed sd at the target)? 10 seed orders each, with 5 of the table's seeds drawn per
order and with all 12. Power under planted gaps: benchmarks/power.py --settings adaptive,adaptive-every-seed.

    python benchmarks/looks.py [--out benchmarks/data/looks-<date>.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from replays.policy import race_template, replay_race
from replays.truth import TruthTable

TABLES = ("benchmarks/data/truth-truth-nope.parquet", "benchmarks/data/truth-truth-small.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--out", default=f"benchmarks/data/looks-{time.strftime('%Y-%m-%d')}.json")
    args = ap.parse_args()
    rows = []
    for path in TABLES:
        table = TruthTable.read(path)
        for seeds in (5, None):
            for every in (1, 2):
                replays = [replay_race(table, o, seeds, race_template("race", look_every=every))
                           for o in range(args.orders)]
                regrets = [r.regret_sd for r in replays if r.regret_sd is not None]
                row = {
                    "table": path, "seeds": seeds or len(table.seeds_at(table.lengths[-1])), "look_every": every,
                    "orders": args.orders,
                    "orders_claiming": sum(bool(r.claimed) for r in replays),
                    "false_claims": sum(bool(r.false_claims) for r in replays),
                    "regret_within_1sd": sum(x <= 1 for x in regrets),
                    "mean_regret_sd": statistics.fmean(regrets) if regrets else None,
                    "max_regret_sd": max(regrets) if regrets else None,
                    "mean_compute_steps": statistics.fmean(r.compute_steps for r in replays),
                }
                rows.append(row)
                print(f"{Path(path).stem:22} {row['seeds']:2} seeds, look_every {every}: a claim in "
                      f"{row['orders_claiming']}/{args.orders} orders ({row['false_claims']} false), regret <= 1 sd in "
                      f"{row['regret_within_1sd']}/{len(regrets)} (mean {row['mean_regret_sd']:.2f}, max "
                      f"{row['max_regret_sd']:.2f}), compute {row['mean_compute_steps']:,.0f} steps", flush=True)
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{platform.node()} {platform.machine()}", "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
