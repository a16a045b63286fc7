import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest_plugins = ["pg"]

ROOT = Path(__file__).resolve().parent.parent

# Tests never reach a hub: the embedded corpus and byte/BPE tokenizers serve them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# One intra-op thread per process, set before torch is imported here or in any subprocess: the proxies are tiny,
# and several workers each spinning two OpenMP threads on a loaded 2-core machine run several times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

TINY_SPACE = ROOT / "tests" / "spaces" / "tiny.toml"


def frozen_run_args(space: str | Path, init: str | Path, budget: str, storage: str) -> list[str]:
    """A frozen study's command line up to its own flags: `run --space S --init MODEL --train-steps 0 --budget B
    --storage URL`."""
    return [
        "run",
        "--space",
        str(space),
        "--init",
        str(init),
        "--train-steps",
        "0",
        "--budget",
        budget,
        "--storage",
        storage,
    ]


@contextlib.contextmanager
def one_core() -> Iterator[None]:
    """Runs inside it see one usable core (os.sched_getaffinity, what commands/layout.py reads), as on a one-core
    machine: a run races in its own process and starts no race worker processes, each of which imports torch and
    loads the study again (about 10 CPU-seconds a raced study here). For studies that a test reads for something
    else than how a run uses the machine (test_layout.py, test_workers.py and the kill and Ctrl-C tests keep the
    machine's cores)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "sched_getaffinity", lambda pid: {0})
        yield


@pytest.fixture
def one_usable_core():
    """one_core for the whole test."""
    with one_core():
        yield


def write_space(path: Path, base: Path = TINY_SPACE, **sections: dict) -> Path:
    """A copy of a test space with keys replaced, e.g. write_space(p, search={"noise_seeds": 0}); returns path."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    raw = tomllib.loads(base.read_text(encoding="utf-8"))
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path.write_text(
        "".join(
            f"[{section}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()) + "\n"
            for section, values in raw.items()
        ),
        encoding="utf-8",
    )
    return path


# The tiny space without reference runs (extra baseline seeds, second seed, block K): for tests that never
# read them, so that each run that reaches its target does not train three more proxies.
NO_REFERENCES = {"noise_seeds": 0, "families": ["ilr"]}

# The raced study's search: 3 trials, the maps screened at the target at seed 0, the contenders tested on seeds
# 1 and 2 and then, while open, seed 3.
RACE = {**NO_REFERENCES, "race_seeds": 3, "max_seeds": 4, "n_trials": 3}
RACE_STEPS = 24  # the tiny space's proxy length; the race trains at twice that (--target 2x)


@dataclass(frozen=True)
class RacedStudy:
    """A finished raced study: its space file, its SQLite file (alone in its folder), study name and `run --json`
    summary. Tests only read it; one that writes (resumes, kills, makes read-only) works on `copy_to`."""

    root: Path
    space: Path
    db: Path
    study: str
    summary: dict

    @property
    def url(self) -> str:
        return f"sqlite:///{self.db}"

    def copy_to(self, folder: Path) -> Path:
        """A copy of the database in `folder` (made if missing), under the same file name."""
        folder.mkdir(parents=True, exist_ok=True)
        copy = folder / self.db.name
        shutil.copyfile(self.db, copy)
        return copy


def _build_raced_study(root: Path, token_cache: Path) -> None:
    from helpers import run_args

    # every trial complete; a narrow model: what the tests read of it (the race's runs, seeds, lengths, verdict and
    # front) needs no size
    space = write_space(root / "race.toml", search={**RACE, "pruner": "none"}, model={"d_model": 16, "seq_len": 32})
    (root / "db").mkdir()
    args = run_args(space, root / "db" / "raced.db", "raced", "--target", "2x")
    with one_core():
        proc = run_cli(args, root, {"ILR_SEARCH_CACHE": str(token_cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (root / "summary.json").write_text(proc.stdout, encoding="utf-8")


def built_once(tmp_path_factory, worker_id: str, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by build(folder) once for the whole test run: under xdist once for all workers
    (the first to come builds it, under a file lock; the others wait for it and read it), as a session fixture
    alone would build it once on every worker. Tests only read what it holds; one that writes works on a copy."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # the folder all xdist workers share
    root = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (root / ".built").exists():
            shutil.rmtree(root, ignore_errors=True)  # a build that failed part way
            root.mkdir()
            build(root)
            (root / ".built").touch()
    return root


@pytest.fixture(scope="session")
def raced_study(tmp_path_factory, token_cache, worker_id) -> RacedStudy:
    """One real study of the tiny space (of a narrow model), 3 trials of 24 steps (no pruning), raced at --target 2x
    (48 steps) on 3 seeds and up to 4: built once for the whole test run (built_once)."""
    root = built_once(tmp_path_factory, worker_id, "raced-study", lambda r: _build_raced_study(r, token_cache))
    summary = json.loads((root / "summary.json").read_text(encoding="utf-8"))
    return RacedStudy(root, root / "race.toml", root / "db" / "raced.db", "raced", summary)


# The fused raced study's space: a narrow model, 12-step proxies and two validation windows (the numbers its tests
# compare need no size); 4 trials fused two at a time (K = 2: on several cores they train in lanes), one baseline
# seed of reference runs, raced at the target (2x) on 2 seeds and up to 3.
FUSED_RACE = {
    "search": {"fuse": 2, "n_trials": 4, "noise_seeds": 1, "target": 2.0, "race_seeds": 2, "max_seeds": 3},
    "model": {"d_model": 16, "seq_len": 32},
    "train": {"steps": 12, "eval_windows": 2},
}
FUSED_RACE_BUDGET = "2x"
QUIET_LOAD = (0.0, 0.0, 0.0)  # the load average the CLI's fused raced study was run at
BUSY_LOAD = (6.0, 6.0, 6.0)  # the API's: well above any core count here


@dataclass(frozen=True)
class FusedRacedStudy:
    """A finished study "fused" of the FUSED_RACE space at budget 2x, on the machine's cores, under os.getloadavg
    patched to `load`, in its own folder: its space file, SQLite file, the `run --json` summary (or the API
    report's to_json(), as `run --json` prints it) and the answer line. Tests only read it."""

    space: Path
    db: Path
    study: str
    summary: dict
    answer: str
    load: tuple[float, float, float]


def _fused_raced_study(root: Path, load: tuple[float, float, float]) -> FusedRacedStudy:
    summary = json.loads((root / "summary.json").read_text(encoding="utf-8"))
    answer = (root / "answer.txt").read_text(encoding="utf-8")
    return FusedRacedStudy(root / "space.toml", root / "run" / "study.db", "fused", summary, answer, load)


def _build_fused_raced_study_by_cli(root: Path, token_cache: Path) -> None:
    from helpers import run_args

    space = write_space(root / "space.toml", **FUSED_RACE)
    (root / "run").mkdir()
    args = run_args(space, root / "run" / "study.db", "fused", budget=FUSED_RACE_BUDGET)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "getloadavg", lambda: QUIET_LOAD)
        proc = run_cli(args, root / "run", {"ILR_SEARCH_CACHE": str(token_cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (root / "summary.json").write_text(proc.stdout, encoding="utf-8")
    (root / "answer.txt").write_text(json.loads(proc.stdout)["answer"], encoding="utf-8")


def _build_fused_raced_study_by_api(root: Path, space: Path) -> None:
    from ilr_search.commands.run import RunRequest, run_study
    from ilr_search.space import load_space

    shutil.copyfile(space, root / "space.toml")
    (root / "run").mkdir()
    request = RunRequest(
        load_space(str(root / "space.toml")),
        FUSED_RACE_BUDGET,
        study_name="fused",
        storage=f"sqlite:///{root / 'run' / 'study.db'}",
    )
    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "getloadavg", lambda: BUSY_LOAD)
        m.chdir(root / "run")  # its checkpoints under its own folder, as the CLI's under its own
        report = run_study(request)
    (root / "summary.json").write_text(json.dumps(report.to_json(), default=float), encoding="utf-8")
    (root / "answer.txt").write_text(report.answer.line, encoding="utf-8")


@pytest.fixture(scope="session")
def fused_raced_study(tmp_path_factory, token_cache, worker_id) -> FusedRacedStudy:
    """The fused raced study as `ilr-search run --space S --budget 2x --study fused --storage URL --json` makes
    it, at a quiet load average (QUIET_LOAD); built once for the whole test run (built_once)."""
    root = built_once(
        tmp_path_factory, worker_id, "fused-raced-cli", lambda r: _build_fused_raced_study_by_cli(r, token_cache)
    )
    return _fused_raced_study(root, QUIET_LOAD)


@pytest.fixture(scope="session")
def fused_raced_study_by_api(tmp_path_factory, token_cache, worker_id, fused_raced_study) -> FusedRacedStudy:
    """The same study as the Python API makes it (commands/run.run_study, as README shows it), from the same space
    file and budget, at a busy load average (BUSY_LOAD); built once for the whole test run (built_once).
    test_api_equals_cli.py compares it with the CLI's, test_layout.py's busy spell its numbers with the quiet run's."""
    root = built_once(
        tmp_path_factory,
        worker_id,
        "fused-raced-api",
        lambda r: _build_fused_raced_study_by_api(r, fused_raced_study.space),
    )
    return _fused_raced_study(root, BUSY_LOAD)


# The data section of a frozen study whose checkpoint brings its own tokenizer.json (a test's own file): its first
# ~500 KB of the embedded corpus (data/corpora.split_documents stops reading there), since such a study tokenizes
# the corpus anew (about 10 CPU-seconds whole), for tests that read no number that depends on the text.
SHORT_CORPUS = {"max_train_tokens": 25_000}

TRAINED_MAP = [2, 2, 1, 1]  # the map recurrent_checkpoint was trained with
PRETRAIN_STEPS = 300


@pytest.fixture(scope="session")
def recurrent_checkpoint(tmp_path_factory, token_cache, worker_id) -> Path:
    """A tiny pretrained checkpoint with a known answer: the in-package model (4 layers, d_model 32, byte tokens)
    trained with map 2,2,1,1 on the embedded corpus (seed 0), its four distinct layers exported as a plain 4-layer
    Llama (schedule 0,1,2,3) with the byte tokenizer. Run as it is (1,1,1,1) it skips the second passes it learned
    with, so a frozen search of it has 2,2,1,1 (or a map as good) to find. Trained once for the whole test run
    (built_once): nine modules read it."""
    return built_once(tmp_path_factory, worker_id, "recurrent-checkpoint", _train_recurrent_checkpoint) / "tiny-llama"


def _train_recurrent_checkpoint(root: Path) -> None:
    from ilr_search.config import DataConfig, ModelConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.pretrained import export_checkpoint
    from ilr_search.training.schedule import reuse_map_schedule
    from ilr_search.training.train import train_proxy

    data = load_tokens(DataConfig(), seq_len=64)
    model_cfg = ModelConfig(vocab_size=256, n_layers=4, d_model=32, n_heads=2, seq_len=64)
    trained = []
    result = train_proxy(
        model_cfg,
        reuse_map_schedule(TRAINED_MAP),
        data,
        TrainConfig(
            steps=PRETRAIN_STEPS,
            batch_size=8,
            lr=1e-2,
            eval_fractions=(1.0,),
            eval_windows=16,
            seed=0,
            device="cpu",
            dtype="fp32",
            checkpoint_every=0,
        ),
        on_trained=trained.append,
    )
    assert result.status == "ok", result.reason
    export_checkpoint(trained[0], [0, 1, 2, 3], root / "tiny-llama")
    # A frozen run of it reads the corpus through its tokenizer.json (a token cache entry of its own, about 10
    # CPU-seconds to make): made here, once for the whole test run under built_once's lock, rather than by the
    # first such test on each xdist worker at the same time.
    load_tokens(DataConfig(tokenizer=f"file:{(root / 'tiny-llama' / 'tokenizer.json').resolve()}"), seq_len=64)


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory, worker_id) -> Path:
    """One token cache for the whole test run, under xdist shared by all workers (each corpus and tokenizer is
    tokenized once, not once on every worker; data/tokens.py writes an entry atomically, so two workers that
    tokenize the same one at once leave one whole entry)."""
    base = tmp_path_factory.getbasetemp()
    path = (base if worker_id == "master" else base.parent) / "token-cache"
    path.mkdir(exist_ok=True)
    os.environ["ILR_SEARCH_CACHE"] = str(path)
    return path


@dataclass
class Finished:
    """What a command left: its arguments, exit code and captured output (as subprocess.CompletedProcess has)."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> Finished:
    """Run the `ilr-search` entry point (ilr_search.cli.main:main, what the console script calls) in this process,
    as the console would: its argv, working folder and environment set (and restored after), stdout and stderr
    captured, the exit code taken from its SystemExit. An exception that escapes main() (a traceback in a
    console) fails the caller. For a fixture of any scope; a test takes the `cli` fixture."""
    from ilr_search.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as m, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        m.setattr(sys, "argv", ["ilr-search", *args])
        m.chdir(cwd)
        for key, value in (env or {}).items():
            m.setenv(key, value)
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return Finished(list(args), code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(token_cache, tmp_path):
    """Run a command through `run_cli` (in this process, in `cwd` or the test's tmp_path, with the session's token
    cache); `check`: fail unless it exits 0. Tests that need a separate process (signals, kills, concurrency, the
    console script itself) use `console`."""

    def run(
        *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float | None = None, check: bool = False
    ) -> Finished:
        proc = run_cli(list(args), cwd or tmp_path, {"ILR_SEARCH_CACHE": str(token_cache), **(env or {})})
        if check and proc.returncode != 0:
            raise AssertionError(f"ilr-search {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    return run


@pytest.fixture
def console(token_cache, tmp_path):
    """Run the real `ilr-search` console entry point in a subprocess; returns CompletedProcess."""

    def run(
        *args: str, cwd: Path | None = None, env: dict | None = None, timeout: float | None = None, check: bool = False
    ):
        from helpers import HANG_SECONDS

        full_env = {**os.environ, "ILR_SEARCH_CACHE": str(token_cache), **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", "ilr_search", *args],
            cwd=cwd or tmp_path,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout or HANG_SECONDS,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"ilr-search {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    return run


def assert_one_line_error(proc) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr


def write_truth(
    path,
    gaps: dict[str, tuple[float, float]],
    seeds: int = 4,
    drop: tuple = (),
    lengths: tuple[int, ...] = (100, 200, 400),
    base_gaps: dict[str, float] | None = None,
) -> None:
    """A truth table (benchmarks/truth.py's schema): map -> (gap to the baseline at the target, seed sd); the gap
    grows in proportion to the steps (or is base_gaps[map] at the base length where given); `drop`: (map, steps,
    seed) left out."""
    import math
    import random

    import pandas as pd

    rng = random.Random(0)
    rows = []
    for key, (gap, sd) in gaps.items():
        for steps in lengths:
            for seed in range(seeds):
                if (key, steps, seed) in drop:
                    continue
                offset = (
                    base_gaps[key]
                    if base_gaps and key in base_gaps and steps == lengths[0]
                    else gap * steps / lengths[-1]
                )
                loss = 2.0 - 0.1 * math.log2(steps / lengths[0]) + offset + rng.gauss(0, sd)
                rows.append(
                    {
                        "map_key": key,
                        "flops_ratio": 1.0 + (sum(map(int, key.split(","))) - 4) / 4,
                        "steps": steps,
                        "factor": steps // lengths[0],
                        "seed": seed,
                        "val_loss": loss,
                        "val_ppl": math.exp(loss),
                        "status": "ok",
                        "curve": json.dumps(
                            [
                                [steps // 8, loss + 0.6],
                                [steps // 4, loss + 0.4],
                                [steps // 2, loss + 0.2],
                                [steps, loss],
                            ]
                        ),
                    }
                )
    frame = pd.DataFrame(rows)
    frame["meta"] = json.dumps({"baseline": "1,1,1,1"})
    frame.to_parquet(path, index=False)
