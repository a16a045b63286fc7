"""Pruning rules replayed over bench tables: which maps each rule prunes, the steps it saves, and the table's
own front maps it loses, over several seeds of row order.

    python benchmarks/fidelity_replay.py [--tables benchmarks/data/bench-small.parquet,benchmarks/data/bench-crossing.parquet] [--seeds 5]

Also prints each table's rung-to-final rank agreement over all its rows (what the study would measure with
every map trained), so the rules can be read against how far each rung predicts the end.
"""

from __future__ import annotations

import argparse
import statistics
from datetime import date
from platform import node

from ilr_search.commands.bench import Table, replay_pruning
from ilr_search.analysis.fidelity import rung_agreements
from ilr_search.config import PrunerSettings
from ilr_search.space import load_space

DEFAULT_TABLES = "benchmarks/data/bench-small.parquet,benchmarks/data/bench-crossing.parquet"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", default=DEFAULT_TABLES)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    search = load_space().search
    rules = {name: PrunerSettings(name=name, eta=search.prune_eta, epsilon=search.prune_epsilon,
                                  warmup=search.prune_warmup, calibration_maps=search.prune_calibration_maps,
                                  min_spearman=search.prune_min_spearman) for name in ("pareto", "pareto-eager")}
    print(f"{date.today()} on {node()}; default-space pruning settings: eta {search.prune_eta}, epsilon "
          f"{search.prune_epsilon}, eager warm-up {search.prune_warmup}, calibration {search.prune_calibration_maps} "
          f"maps, Spearman >= {search.prune_min_spearman}; {args.seeds} seeds of row order\n")
    for path in args.tables.split(","):
        table = Table.read(path)
        agreement = rung_agreements({r.map_key: r.curve for r in table.rows}, table.steps)
        baseline = next(r for r in table.rows if r.reuse_map and all(x == 1 for x in r.reuse_map))
        better = [r for r in table.rows if r.val_ppl < baseline.val_ppl and r is not baseline]
        print(f"## {path}: {len(table.rows)} rows, {table.steps} steps, front {', '.join(table.front_keys())}")
        print("rung-to-final Spearman over all rows: " + ", ".join(
            f"step {a.step} ({a.fraction:.3g}) {a.spearman:+.2f}" for a in agreement))
        print(f"maps beating the baseline ({baseline.val_ppl:.3f}) at the end: {len(better)}"
              + (f", best {min(better, key=lambda r: r.val_ppl).map_key} "
                 f"({min(r.val_ppl for r in better):.3f})" if better else ""))
        print("\n| rule | order seed | pruned maps | steps saved | front maps lost |")
        print("| --- | ---: | ---: | ---: | --- |")
        for name, settings in rules.items():
            results = [replay_pruning(table, settings, seed) for seed in range(args.seeds)]
            for seed, r in enumerate(results):
                print(f"| {name} | {seed} | {len(r.pruned)} | {r.steps_saved_share:.1%} | "
                      f"{', '.join(r.front_maps_lost) or '0'} |")
            print(f"| **{name}** | median / total | {statistics.median(len(r.pruned) for r in results)} | "
                  f"{statistics.median(r.steps_saved_share for r in results):.1%} | "
                  f"{sum(len(r.front_maps_lost) for r in results)} in {args.seeds} |")
        print()


if __name__ == "__main__":
    main()
