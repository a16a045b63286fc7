"""`ilr-search bench`: tabular benchmarks of the search and replays over them.

- table.py: bench tables (every map of a small space once, with its curve) and `bench build`;
- hypervolume.py: the search (sampler, pruning) replayed over a bench table, scored by hypervolume;
- pruning.py: a pruning rule replayed over a bench table's rows;
- truth.py: truth tables (maps at several lengths and seeds), and planted gaps in them;
- policy.py: the race and the one-seed rules replayed over a truth table;
- power.py: the race's power, measured with planted gaps (`bench power`).
"""

from ilr_search.commands.bench.hypervolume import ReplayResult, hypervolume_2d, replay, summarize_replays
from ilr_search.commands.bench.policy import (
    POLICIES,
    PolicyReplay,
    replay_policy,
    replay_race,
    replay_single_seed,
    table_decided_better,
)
from ilr_search.commands.bench.pruning import PruningReplay, default_pruner_settings, replay_pruning, replay_table
from ilr_search.commands.bench.table import Table, TableRow, build_table, feasible_maps
from ilr_search.commands.bench.truth import TruthTable

__all__ = [
    "POLICIES",
    "PolicyReplay",
    "PruningReplay",
    "ReplayResult",
    "Table",
    "TableRow",
    "TruthTable",
    "build_table",
    "default_pruner_settings",
    "feasible_maps",
    "hypervolume_2d",
    "replay",
    "replay_policy",
    "replay_pruning",
    "replay_race",
    "replay_single_seed",
    "replay_table",
    "summarize_replays",
    "table_decided_better",
]
