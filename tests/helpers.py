"""What several test modules share: the `run` command line, the environment of a subprocess, the stored race runs,
the modules a command imports, and waiting on an event (a stored row, a printed line) instead of a clock.
Test modules import from here or from conftest, never from one another."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

# A safety net for a hang, never what decides a test: every wait below ends on its event long before.
HANG_SECONDS = 900.0


def storage_url(storage: Path | str) -> str:
    """A database path as its sqlite:/// URL; a URL (sqlite:, journal:, postgresql:) as it is."""
    return f"sqlite:///{storage}" if isinstance(storage, Path) else storage


def run_args(
    space: Path | str | None,
    storage: Path | str,
    study: str,
    *extra: str,
    budget: str | None = "1.5x",
    n_trials: int | None = None,
    steps: int | None = None,
    json_out: bool = True,
) -> list[str]:
    """`ilr-search run` arguments: the space file (None: none given), the storage (a path is a SQLite file), the
    study's name, the budget (None: none given), --n-trials and --steps where given, --json, then `extra`."""
    args = ["run"]
    if space is not None:
        args += ["--space", str(space)]
    if budget is not None:
        args += ["--budget", budget]
    if steps is not None:
        args += ["--steps", str(steps)]
    if n_trials is not None:
        args += ["--n-trials", str(n_trials)]
    args += ["--study", study, "--storage", storage_url(storage)]
    return [*args, *(["--json"] if json_out else []), *extra]


# Enqueued maps `run` refuses (test_enqueue.py), and its dry run alike (test_cli_small.py).
BAD_ENQUEUES = {
    "wrong length": "2,1,1",
    "count below one": "2,0,1,1",
    "above max_reuse": "4,1,1,1",
    "not integers": "two,1,1,1",
    "knob not searched": "2,1,1,1|injection=add",
    "unknown knob": "2,1,1,1|wings",
    "block over budget": "block3",
    "block one": "block1",
}


def env_for(token_cache: Path, **extra: str) -> dict[str, str]:
    """The environment of a subprocess `ilr-search`: this one's, with the session's token cache."""
    return {**os.environ, "ILR_SEARCH_CACHE": str(token_cache), **extra}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


def race_rows(db: Path, timeout: float = 30) -> list[dict]:
    """The race runs stored in a SQLite file (table ilr_runs, kind race), read with plain sqlite3; none before the
    table is made."""
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=timeout) as conn:
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute("SELECT * FROM ilr_runs WHERE kind = 'race'")]
        except sqlite3.OperationalError:  # not created yet, or locked past the timeout
            return []


def stored_reference_dicts(storage: str, study: str) -> dict[str, dict]:
    """The reference runs of a stored study by name, each in the form of the `references` of the JSON reports."""
    from ilr_search.search.studies import open_study
    from ilr_search.storage import parse_storage, study_references

    spec = parse_storage(storage, read_only=True)
    return {name: run.to_dict() for name, run in study_references(spec, open_study(spec, study)).items()}


def wait_until(
    happened: Callable[[], bool], what: str, proc: subprocess.Popen | None = None, interval: float = 0.05
) -> None:
    """Return once `happened()` is true (an exception in it counts as not yet). Fail at once if `proc` ends first;
    fail after HANG_SECONDS only to turn a hang into a failure. `interval` only paces the polling."""
    deadline = time.monotonic() + HANG_SECONDS
    while True:
        try:
            if happened():
                return
        except Exception:  # noqa: BLE001, S110 - not readable yet (the study or its table being made): not yet
            pass
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended (exit code {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"hung: no {what} after {HANG_SECONDS:.0f} s")
        time.sleep(interval)


def signal_if_still(proc: subprocess.Popen, event: Callable[[], bool], sig: int) -> bool:
    """Send `sig` once `event` holds, seen again with `proc` stopped (SIGSTOP) so that nothing in it changes between
    seeing the event and the signal; `proc` then goes on (unless killed). Whether the signal was sent."""
    if not event():
        return False
    proc.send_signal(signal.SIGSTOP)
    try:
        still = event()
    except Exception:  # noqa: BLE001 - stopped holding the database's lock: let it go on, look again
        still = False
    if still:
        proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    return still


def hold_the_first_until_the_other_works(
    procs: Sequence[subprocess.Popen], worked: Callable[[int], bool], storage_free: Callable[[], bool]
) -> None:
    """Make two workers of one study both work, whatever their speeds: once one of `procs` has worked
    (`worked(i)`) and the other not yet, stop the first (SIGSTOP) at a moment it holds no lock of the storage
    (`storage_free()`, seen with it stopped) until the other works or ends, then let it go on (SIGCONT).
    Without this a worker that starts late may find every trial taken: a test of sharing would share nothing."""
    deadline = time.monotonic() + HANG_SECONDS
    while time.monotonic() < deadline:
        done = [worked(i) for i in range(len(procs))]
        if all(done) or any(p.poll() is not None for p in procs):
            return
        if any(done):
            first, other = (0, 1) if done[0] else (1, 0)
            procs[first].send_signal(signal.SIGSTOP)
            try:
                if storage_free():
                    wait_until(lambda: worked(other), "work from the second worker", procs[other])  # noqa: B023 - called here, at once
                    return
            finally:
                procs[first].send_signal(signal.SIGCONT)
        time.sleep(0.05)
    pytest.fail(f"hung: the workers did not both work in {HANG_SECONDS:.0f} s")


def spawned_children(pid: int) -> list[int]:
    """The processes `pid` started with multiprocessing's spawn (its workers; not its resource tracker), read
    from /proc: each runs `python -c 'from multiprocessing.spawn import spawn_main...' --multiprocessing-fork`."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"--multiprocessing-fork" in cmdline:
            children.append(int(entry.name))
    return children


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting for its reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def sigint_as_in_a_terminal() -> None:
    """A Popen preexec_fn: SIGINT's default action in the child, as a terminal's foreground job has it (Ctrl-C
    interrupts). A shell starts a background job (pytest run with `&`, say) with SIGINT ignored, and a child
    would inherit that: Python then installs no KeyboardInterrupt handler and a run ignores Ctrl-C, its
    spawned workers too."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# Runs `ilr-search ARGS` as the console does, then reports on stderr's last line which of optuna and torch the
# command imported, and Optuna's verbosity as the command left it.
_MAIN_THEN_IMPORTED = """
import json, sys
from ilr_search.cli.main import main
sys.argv = ["ilr-search", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    assert e.code in (0, None), e.code
loaded = [name for name in ("optuna", "torch") if name in sys.modules]
import optuna
print(json.dumps({"loaded": loaded, "optuna_verbosity": optuna.logging.get_verbosity()}), file=sys.stderr)
"""


@dataclass(frozen=True)
class Imported:
    """What a command imported (of optuna and torch), and Optuna's verbosity once it returned."""

    loaded: tuple[str, ...]
    optuna_verbosity: int


def imported_by(args: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> Imported:
    """Run `ilr-search ARGS` in a fresh interpreter (exit code 0 required) and say what it imported."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", _MAIN_THEN_IMPORTED, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**(env or os.environ), "PYTHONPATH": str(root)},
        check=False,
        timeout=HANG_SECONDS,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    return Imported(tuple(report["loaded"]), report["optuna_verbosity"])
