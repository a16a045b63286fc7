"""How long the adaptive race policy takes to decide, replayed over the committed truth tables, and what it decided
(a digest of every replay's result), so that two checkouts can be compared on one machine: the same digest, and
the ratio of their times.

    python benchmarks/policy_speed.py --label HEAD --out benchmarks/data/policy-speed-HEAD-DATE.json
    PYTHONPATH=/path/to/other/checkout python benchmarks/policy_speed.py --label OLD --out ...
    python benchmarks/policy_speed.py --compare A.json B.json

Each table is replayed `--orders` times (replays.policy.replay_policy with policy race, in this process);
the time is the best of `--rounds` rounds (the policy is pure: every round decides the same).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import time
from datetime import date
from pathlib import Path

from replays.policy import replay_policy

import ilr_search

TABLES = ("benchmarks/data/truth-truth-small.parquet", "benchmarks/data/truth-truth-nope.parquet")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--label", default="HEAD")
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        for table in TABLES:
            x, y = a["tables"][table], b["tables"][table]
            same = "the same decisions" if x["digest"] == y["digest"] else "DIFFERENT decisions"
            print(f"{table}: {same}; {x['seconds']:.2f} s ({a['label']}) against {y['seconds']:.2f} s "
                  f"({b['label']}): {x['seconds'] / y['seconds']:.2f}x")
        return
    record: dict = {"label": args.label, "package": str(Path(ilr_search.__file__).parent), "date": str(date.today()),
                    "machine": platform.processor() or platform.machine(), "orders": args.orders, "tables": {}}
    for table in TABLES:
        times, digests = [], set()
        for _ in range(args.rounds):
            start = time.perf_counter()
            result = replay_policy(table, "race", orders=args.orders)
            times.append(time.perf_counter() - start)
            text = json.dumps(result.to_json(), sort_keys=True, default=str)
            digests.add(hashlib.sha256(text.encode()).hexdigest())
        assert len(digests) == 1, "a pure policy decided differently in two rounds"
        record["tables"][table] = {"seconds": min(times), "rounds": times, "digest": digests.pop()}
        print(f"{table}: best {min(times):.2f} s of {args.rounds} rounds; digest {record['tables'][table]['digest'][:12]}")
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
