"""The chaos scenario: workers on one study, both cores kept busy by a CPU hog, and one worker SIGKILLed
before, during and after a claim wait. Used by tests/reliability/test_chaos.py (once per storage) and by
benchmarks/soak.py (many times per storage).

Claim waits are made certain, not left to chance: the study's queue starts with one map three times (A), and
the workers' trainer is gated (a wrapper that holds at the start of training while a `hold` file exists), so
the worker that claims A first holds it while the two others wait for its result. Then:
  during  a waiting worker is killed in its wait;
  before  the holder is killed before the wait it caused has ended (the other waiter must take the map over
          once the holder's heartbeat is stale, and train it);
  after   the first worker that reports a reused result (its wait is over) is killed at once.
Replacement workers keep the study going. At the end: the survivors' exit codes, the finished trials seen
before each kill against the end, maps trained twice to completion, trials left RUNNING, and the stored
front against the front recomputed from the trials.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from helpers import HANG_SECONDS
from optuna.trial import TrialState

from ilr_search.analysis.results import study_front
from ilr_search.search.run import RunRequest, prepare_study
from ilr_search.space import load_space
from ilr_search.storage import open_storage, open_store, parse_storage
from ilr_search.storage.trials import study_trials, told_trials

HEARTBEAT_SECONDS = 1
BUDGET = "2x"
MAP_A = {"r0": 2, "r1": 2}
MAP_B = {"r0": 3, "r1": 1}

# The workers run the real CLI; only the trainer is wrapped, to hold before training while `hold` exists.
GATED_WORKER = """
import os, sys, time
from pathlib import Path
import ilr_search.training.train as training
gate = Path(os.environ["ILR_CHAOS_GATE"])
train = training.train_proxy
def gated(*args, **kwargs):
    (gate / f"training-{os.getpid()}").touch()
    while (gate / "hold").exists():
        time.sleep(0.05)
    return train(*args, **kwargs)
training.train_proxy = gated
sys.argv = ["ilr-search", *sys.argv[1:]]
from ilr_search.cli.main import main
main()
"""


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    killed: str = ""  # the moment it was killed at: before | during | after


@dataclass
class ChaosResult:
    crashed_survivors: list[str]  # name: exit code and the end of stderr
    lost_trials: list[int]  # finished before a kill, not finished the same way at the end
    trained_twice: dict[str, int]
    left_running: list[int]
    front_mismatch: bool
    kills: list[str]
    n_finished: int
    seconds: float
    marks: list[tuple[str, float]]  # (phase, seconds since the start)


class Chaos:
    def __init__(
        self, storage: str, workdir: Path, space_path: Path, token_cache: Path, n_trials: int = 8, steps: int = 40
    ) -> None:
        self.storage, self.workdir, self.n_trials = storage, workdir, n_trials
        self.gate = workdir / "gate"
        self.gate.mkdir(parents=True, exist_ok=True)
        self.args = [
            "run",
            "--space",
            str(space_path),
            "--budget",
            BUDGET,
            "--study",
            "chaos",
            "--storage",
            storage,
            "--n-trials",
            str(n_trials),
            "--steps",
            str(steps),
            "--sampler",
            "random",
            "--pruner",
            "none",
        ]
        self.env = {
            **os.environ,
            "ILR_SEARCH_CACHE": str(token_cache),
            "ILR_CHAOS_GATE": str(self.gate),
            "ILR_SEARCH_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
            "OMP_NUM_THREADS": "1",
        }
        self.space = load_space(space_path, {"train": {"steps": steps}})
        self.events: queue.Queue[tuple[str, str]] = queue.Queue()
        self.workers: list[Worker] = []
        self.snapshots: dict[int, tuple[str, tuple[float, ...] | None]] = {}
        self.marks: list[tuple[str, float]] = []
        self.t0 = time.time()

    def mark(self, phase: str) -> None:
        self.marks.append((phase, round(time.time() - self.t0, 1)))

    # --- the pieces
    def prepare(self) -> None:
        """The study, made here, with A three times then B twice at the head of its queue."""
        prepared = prepare_study(
            RunRequest(self.space, BUDGET, "chaos", self.storage, self.n_trials, sampler="random", pruner="none")
        )
        for params in (MAP_A, MAP_A, MAP_A, MAP_B, MAP_B):
            prepared.study.enqueue_trial(params, skip_if_exists=False)

    def start(self) -> Worker:
        proc = subprocess.Popen(
            [sys.executable, "-c", GATED_WORKER, *self.args],
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        worker = Worker(f"w{len(self.workers)}", proc)
        self.workers.append(worker)

        def read() -> None:
            for line in proc.stderr:
                worker.lines.append(line)
                self.events.put((worker.name, line))

        threading.Thread(target=read, daemon=True).start()
        return worker

    def wait_line(self, pattern: str, among: set[str] | None = None, timeout: float = HANG_SECONDS) -> str:
        """The name of the first worker (of `among`) whose stderr matches `pattern` from now on; `timeout` only
        turns a hang into a failure."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                name, line = self.events.get(timeout=0.5)
            except queue.Empty:
                continue
            if (among is None or name in among) and re.search(pattern, line):
                return name
        raise TimeoutError(f"no worker printed {pattern!r} within {timeout:.0f} s:\n{self.tails()}")

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}:\n{self.tails()}")
            time.sleep(0.1)

    def kill(self, name: str, moment: str) -> None:
        worker = next(w for w in self.workers if w.name == name)
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait()
        worker.killed = moment
        for t in self.load().get_trials(deepcopy=False):  # what was finished at this moment must stay so
            if t.state.is_finished() and t.number not in self.snapshots:
                self.snapshots[t.number] = (t.state.name, tuple(t.values) if t.values else None)

    def load(self) -> optuna.Study:
        return optuna.load_study(study_name="chaos", storage=open_storage(parse_storage(self.storage)))

    def tails(self) -> str:
        return "\n".join(
            f"--- {w.name} (killed {w.killed or '-'}, rc {w.proc.poll()})\n" + "".join(w.lines[-15:])
            for w in self.workers
        )

    # --- the scenario
    def run(self, timeout: float = HANG_SECONDS) -> ChaosResult:
        """The scenario, each of its waits on an event (a line a worker prints, a file its trainer makes, its
        exit); `timeout` only turns a hang into a failure (benchmarks/soak.py counts one as a fault)."""
        t0 = self.t0 = time.time()
        self.prepare()
        (self.gate / "hold").touch()
        started = {self.start().name for _ in range(3)}  # each pops one A: one trains (held), two wait
        self.mark("prepared")
        during = self.wait_line(r"waiting for its result", started, timeout)
        other = self.wait_line(r"waiting for its result", started - {during}, timeout)
        (holder,) = started - {during, other}
        self.wait_for(lambda: any(self.gate.glob("training-*")), timeout, "the holder of map A to train")
        self.mark("two waiting")
        self.kill(during, "during")  # killed in its claim wait
        self.kill(holder, "before")  # the holder, before the wait it caused has ended
        (self.gate / "hold").unlink()
        self.start()
        live = {w.name for w in self.workers if not w.killed}
        after = self.wait_line(r"\(reused trial \d+\)", live, timeout)
        self.mark("reused")
        self.kill(after, "after")  # right after its wait ended in a reused result
        self.start()
        for w in self.workers:
            if not w.killed:
                try:
                    w.proc.wait(timeout=max(1.0, timeout - (time.time() - t0)))
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
        self.mark("all exited")
        return self.result(time.time() - t0)

    def result(self, seconds: float) -> ChaosResult:
        study = self.load()
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        records = told_trials(study)
        lost = [
            n
            for n, (state, values) in self.snapshots.items()
            if trials[n].state.name != state or (tuple(trials[n].values) if trials[n].values else None) != values
        ]
        trained = Counter(
            t.user_attrs["map_key"]
            for t in trials.values()  # trained to the end, not reused
            if t.state == TrialState.COMPLETE and t.user_attrs.get("steps", 0) > 0 and "reused_from" not in t.user_attrs
        )
        store = open_store(parse_storage(self.storage), "chaos", read_only=True)
        history = store.front_history()
        stored = [p.trial for p in history[max(history)]] if history else []
        shown = study_trials(study, store.runs())  # as the study shows them: results on their maps' runs
        return ChaosResult(
            crashed_survivors=[
                f"{w.name}: rc {w.proc.returncode}\n{''.join(w.lines[-20:])}"
                for w in self.workers
                if not w.killed and w.proc.returncode != 0
            ],
            lost_trials=lost,
            trained_twice={k: v for k, v in trained.items() if v > 1},
            left_running=[t.number for t in trials.values() if t.state == TrialState.RUNNING],
            front_mismatch=stored != [p.trial for p in study_front(shown)],
            kills=[f"{w.name}:{w.killed}" for w in self.workers if w.killed],
            n_finished=sum(r.has_result for r in records),
            seconds=seconds,
            marks=self.marks,
        )


class CpuHog:
    """Keeps `processes` cores busy while the scenario runs (a loaded machine delays heartbeats and start-ups):
    benchmarks/soak.py's load. The test suite loads the machine with its own tests alone."""

    def __init__(self, processes: int) -> None:
        self.n = processes
        self.procs: list[subprocess.Popen] = []

    # Each hog spins until its parent is gone: a test process killed mid-scenario (a timeout, Ctrl-C twice)
    # leaves no busy orphans behind to slow down whatever runs next.
    SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"

    def __enter__(self) -> CpuHog:
        self.procs = [subprocess.Popen([sys.executable, "-c", self.SPIN]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
