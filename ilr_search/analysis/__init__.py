"""Analysis: pure readings of stored results (no training, no torch), taken as the TrialRecords that
storage/trials.py reads a study's trials into.

- results.py: a study's trials read back (rows, the trial that stands for a map, the front, reference runs);
- pareto.py: Pareto fronts; stats.py: seed intervals, paired tests and rank agreement;
- fidelity.py: how far a study's proxy can be trusted; racing.py: the racing policy over stored evaluations;
- plots.py: the figures; page.py: a figure as one offline HTML page.
"""
