"""How long Ctrl-C takes to end a run: SIGINT sent while a trial trains, to the process's exit.

Each repetition runs the tiny test space (3 trials of 400 steps, no pruning) in a subprocess, waits until one trial
is complete and the next has a curve point (it is training), sends SIGINT and times the exit. Two entry points are
compared in one run: the console script's (`python -m ilr_search`: `cli.console_main`, which skips the
interpreter's teardown after the work is committed) and plain `cli.main` followed by the normal interpreter exit.

    python benchmarks/ctrl_c.py [--repeat 3] [--out benchmarks/data/ctrl-c-DATE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ilr_search.storage import open_storage, open_store, parse_storage  # noqa: E402

ENTRY_POINTS = {
    "console_main (python -m ilr_search)": ["-m", "ilr_search"],
    "main, then the interpreter's teardown": ["-c", "import sys; from ilr_search.cli.main import main; "
                                                    "sys.argv[0] = 'ilr-search'; main()"],
}


def training_second_trial(storage: str) -> bool:
    try:
        trials = optuna.load_study(study_name="int", storage=open_storage(parse_storage(storage), heartbeat=False)).trials
        evaluated = {p.trial_number for p in open_store(parse_storage(storage), "int").curve_points()}
    except Exception:  # not created yet
        return False
    running = {t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING}
    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) >= 1 and bool(running & evaluated)


def one_stop(entry: list[str], folder: Path) -> float:
    storage = f"sqlite:///{folder / 'int.db'}"
    cmd = [sys.executable, *entry, "run", "--space", str(ROOT / "tests" / "spaces" / "tiny.toml"), "--budget", "1.5x",
           "--study", "int", "--storage", storage, "--n-trials", "3", "--steps", "400", "--pruner", "none", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not training_second_trial(storage):
            if proc.poll() is not None:
                raise RuntimeError(f"the run ended before it could be interrupted (exit {proc.returncode})")
            time.sleep(0.2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        return time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "data" / f"ctrl-c-{date.today()}.json")
    args = parser.parse_args()
    results: dict[str, list[float]] = {name: [] for name in ENTRY_POINTS}
    for _ in range(args.repeat):
        for name, entry in ENTRY_POINTS.items():  # alternated, so a change in load meets both alike
            with tempfile.TemporaryDirectory() as folder:
                results[name].append(round(one_stop(entry, Path(folder)), 3))
    report = {"date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "load_average": os.getloadavg(), "seconds_from_sigint_to_exit": results,
              "median": {name: statistics.median(v) for name, v in results.items()}}
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
