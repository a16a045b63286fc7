"""The benchmark scripts' replays over bench and truth tables (the package's `ilr-search bench` builds bench tables
and replays a pruning rule over one; these replay the rest, for the reports):

- hypervolume.py: the search (sampler, pruning) replayed over a bench table, scored by hypervolume;
- truth.py: truth tables (maps at several lengths and seeds), and planted gaps in them;
- policy.py: the race and the one-seed rules replayed over a truth table;
- power.py: the race's power, measured with planted gaps (benchmarks/power.py).

A script run as `python benchmarks/X.py` imports them as `replays.X`.
"""
