"""Commands: the use cases under the CLI, each a function that returns what its command prints with --json.

- api.py: the public Python API (flops, train, run); recipe.py: a study's winner to full scale;
- export.py: `export-model`, standard transformers checkpoints; standard_checkpoint.py writes them;
- audit.py: chosen maps retrained longer; report.py: fronts, figures, exports; bench/: the tabular benchmarks;
- dryrun.py: a study's plan without training; tracking.py: trials sent to TensorBoard or MLflow;
- run.py: `run`, a study's trials, references and race; workers.py: N worker processes on one study;
- layout.py: how a run uses the cores; autofuse.py: `--fuse auto`, the fused group size chosen by a probe;
- studies.py: stored studies listed and read back; events.py: a run's events, as the CLI renders them;
- logs.py: the CLI process's logging (Optuna's), set when a command starts, not on import.
"""
