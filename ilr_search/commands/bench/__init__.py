"""`ilr-search bench`: tabular benchmarks of the search and a pruning rule replayed over them.

- table.py: bench tables (every map of a small space once, with its curve) and `bench build`;
- pruning.py: a pruning rule replayed over a bench table's rows (`bench replay`).

The benchmark scripts' other replays (the search by hypervolume, truth tables, the race and its power) are
benchmarks/replays/.
"""

from ilr_search.commands.bench.pruning import PruningReplay, default_pruner_settings, replay_pruning, replay_table
from ilr_search.commands.bench.table import Table, TableRow, build_table, feasible_maps

__all__ = [
    "PruningReplay",
    "Table",
    "TableRow",
    "build_table",
    "default_pruner_settings",
    "feasible_maps",
    "replay_pruning",
    "replay_table",
]
