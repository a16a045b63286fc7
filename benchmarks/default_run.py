"""The default run, timed: README's Quickstart command in a fresh folder with a fresh token cache, on a quiet machine
or with both cores kept busy, and what it concluded.

    python benchmarks/default_run.py [--hogs 0] [--out benchmarks/data/default-run-quiet-2026-12-01.json]
        [--keep FOLDER] [-- extra run flags]
    python benchmarks/default_run.py --fresh-venv [--hogs 0] [--keep FOLDER] [--dry-run] [--worst-case] [--out ...]
    python benchmarks/default_run.py --compare A.json B.json

--hogs N starts N `python3 -c 'while 1: pass'` processes beside the run (2 on this 2-core machine: both cores busy)
and stops them after it; --compare says whether two records hold the same study (every field but the date, machine,
load and wall time), field by field. The run starts after the hogs have run --settle seconds (60), untimed.
--keep copies the run's study database (studies/ilr-search.db) into FOLDER. The JSON keeps the wall time, the
verdict, the detectable gap, the equal-compute reference, the race's compute, every race run, the machine and the
load before and after.

--fresh-venv times what a newcomer does: it clones this repository's HEAD (git clone) into a temporary folder, makes
a fresh virtual environment there, and runs README's Quickstart command exactly as written (the code block after
`<!-- run-command -->`: the pip installs included) in the clone, with the venv first on PATH, an empty token cache,
and none of this shell's OMP_NUM_THREADS, PYTHONPATH or VIRTUAL_ENV. It records the wall time, the CPU time and CPU%
(user + system of the command and everything it started, from /usr/bin/time -v where there is one, else
getrusage of the children) and the peak memory (the largest resident set of one process), and the output
(stdout whole: the per-phase table is in it; stderr's last lines), in
benchmarks/data/default-run-fresh-venv-DATE.json (default-run-fresh-venv-loaded-DATE.json with --hogs). --hogs and --keep work as above: the hogs
start --settle seconds before the clock, so the install meets a busy machine too. --dry-run prints what it would run
and writes nothing.

--worst-case (with --fresh-venv) forces the default study's most expensive outcome: README's command with
`--space worst-case.toml`, the default space (written into the clone) with two changes: [model] damping = 1e-6
(every repeated pass adds its branches times 1e-6, so each recurrent map is the plain model up to a perturbation
that training's chaos grows to seed size: its race against the plain model is an A/A test, undecided to the pool's
last seed but where its futility rule stops it) and [search] pruner = "none" (every trial completes, so the screen
has its 12 maps). Record: default-run-worst-case-DATE.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parent.parent
RUN_MARK = "<!-- run-command -->"
TIME = "/usr/bin/time"

COMMAND = ["ilr-search", "run", "--budget", "1.5x", "--layers", "8", "--json"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hogs", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--settle", type=float, default=60.0,
                    help="seconds the hogs run before the run starts (not timed), so the machine is busy when it starts")
    ap.add_argument("--keep", default=None, help="copy the run's study database into this folder")
    ap.add_argument("--fresh-venv", action="store_true",
                    help="clone HEAD, make a fresh venv, and time README's Quickstart command as written, install included")
    ap.add_argument("--dry-run", action="store_true", help="with --fresh-venv: print the plan, run and write nothing")
    ap.add_argument("--worst-case", action="store_true", help="with --fresh-venv: the default space's worst case forced")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two records: the same study, field by field?")
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    if args.compare:
        raise SystemExit(compare_records(*(Path(p) for p in args.compare)))
    if args.fresh_venv:
        fresh_venv_run(Path(args.out) if args.out else None, args.dry_run, args.hogs, args.settle,
                       Path(args.keep) if args.keep else None, args.worst_case)
        return
    out = Path(args.out or f"benchmarks/data/default-run-{'quiet' if not args.hogs else 'loaded'}-{time.strftime('%Y-%m-%d')}.json")
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "ILR_SEARCH_CACHE": str(Path(folder) / "cache")}
        hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.hogs)]
        if hogs:
            time.sleep(args.settle)  # a busy machine has been busy for a while: its load average says so
        load_before = os.getloadavg()
        started = time.perf_counter()
        try:
            proc = subprocess.run([*COMMAND, *args.extra], cwd=folder, env=env, capture_output=True, text=True)
        finally:
            seconds = time.perf_counter() - started
            for hog in hogs:
                hog.kill()
        load_after = os.getloadavg()
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            for db in Path(folder).glob("studies/*.db"):
                shutil.copy2(db, Path(args.keep) / db.name)
    if proc.returncode != 0:
        raise SystemExit(f"the run failed ({proc.returncode}): {proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout)
    race = summary["race"] or {}
    record = {"command": " ".join(COMMAND + args.extra), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores", "hogs": args.hogs, "settle_seconds": args.settle if args.hogs else 0,
              "load_before": load_before, "load_after": load_after, "wall_seconds": seconds,
              "verdict": summary["verdict"], "detectable_gap": summary["detectable_gap"],
              "equal_compute": summary["equal_compute"], "pareto": summary["pareto"],
              "trial_steps": summary["steps_trained"], "race_compute_steps": race.get("compute_steps"),
              "race_stopped": race.get("stopped"), "comparisons": race.get("comparisons"),
              "race_runs": [r for r in race.get("results", []) if r["source"].startswith("run ")],
              "n_complete": summary["n_complete"], "n_pruned": summary["n_pruned"], "study": summary["study"]}
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{seconds:.0f} s; {summary['verdict']}")
    print(f"wrote {out}")


# What a record says of the run rather than of the study it made
RUN_FIELDS = {"command", "date", "machine", "hogs", "settle_seconds", "load_before", "load_after", "wall_seconds"}


def compare_records(a: Path, b: Path) -> int:
    """Print each study field of two records as equal or not (a race run by its map, steps and seed); 1 if any
    differ."""
    first, second = (json.loads(p.read_text()) for p in (a, b))
    differ = 0
    for key in sorted((set(first) | set(second)) - RUN_FIELDS):
        x, y = first.get(key), second.get(key)
        if key == "race_runs":
            runs = [{(r["map_key"], r["steps"], r["seed"]): r for r in rs or []} for rs in (x, y)]
            same = [k for k in runs[0] if runs[1].get(k) == runs[0][k]]
            print(f"race_runs: {len(same)} of {len(runs[0])} (and {len(runs[1])}) equal to the last bit")
            differ += len(same) != len(runs[0]) or len(runs[0]) != len(runs[1])
        else:
            print(f"{key}: {'equal' if x == y else f'DIFFERS: {x!r} against {y!r}'}")
            differ += x != y
    return int(differ > 0)


def readme_run_command(readme: Path = ROOT / "README.md") -> str:
    """The Quickstart's run command: the first line of the code block after RUN_MARK in README.md."""
    text = readme.read_text(encoding="utf-8")
    if RUN_MARK not in text:
        raise SystemExit(f"{readme} has no {RUN_MARK} line")
    block = re.search(r"```[a-z]*\n(.*?)```", text[text.index(RUN_MARK):], re.S)
    lines = [line for line in (block.group(1) if block else "").splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"no code block after {RUN_MARK} in {readme}")
    return lines[0].strip()


class FreshVenvPlan(TypedDict):
    """What --fresh-venv runs (fresh_venv_plan): the clone, the venv and the timed command, as argument lists."""

    commit: str
    clone: list[str]
    venv: list[str]
    command: str
    argv: list[str]
    cwd: str


WORST_CASE_SPACE = "worst-case.toml"  # --worst-case: written into the clone by write_worst_case_space


def write_worst_case_space(repo: Path) -> Path:
    """The default space with every recurrent map the plain model up to 1e-6 and no pruning (--worst-case)."""
    text = (repo / "ilr_search" / "search_spaces" / "default.toml").read_text()
    for old, new in (('pe = "rope"\n', 'pe = "rope"\ndamping = 1e-6\n'), ('pruner = "pareto"', 'pruner = "none"')):
        if old not in text:
            raise SystemExit(f"--worst-case: the default space has no {old.strip()!r} to change")
        text = text.replace(old, new, 1)
    path = repo / WORST_CASE_SPACE
    path.write_text("# benchmarks/default_run.py --worst-case: the default space, its worst case forced\n" + text)
    return path


def fresh_venv_plan(folder: Path, worst_case: bool = False) -> FreshVenvPlan:
    """What --fresh-venv runs, in `folder`: the clone, the venv and the command (as a list for subprocess)."""
    command = readme_run_command() + (f" --space {WORST_CASE_SPACE}" if worst_case else "")
    shell = ["bash", "-c", command]
    timed = [TIME, "-v", *shell] if Path(TIME).exists() else shell
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"commit": head, "clone": ["git", "clone", "--quiet", str(ROOT), str(folder / "repo")],
            "venv": [sys.executable, "-m", "venv", str(folder / "venv")], "command": command, "argv": timed,
            "cwd": str(folder / "repo")}


def newcomer_env(folder: Path) -> dict[str, str]:
    """This shell's environment as a newcomer's: the fresh venv first on PATH, an empty token cache, and no thread,
    path or venv settings of ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{folder / 'venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(folder / "venv")
    env["ILR_SEARCH_CACHE"] = str(folder / "cache")
    return env


def time_v_fields(stderr: str) -> dict[str, float]:
    """User and system seconds and the peak resident set (KiB) from /usr/bin/time -v's last lines."""
    fields = {"User time (seconds)": "user", "System time (seconds)": "system",
              "Maximum resident set size (kbytes)": "max_rss_kib"}
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key in fields:
            found[fields[key]] = float(value)
    return found


def fresh_venv_run(out: Path | None, dry_run: bool, hogs: int = 0, settle: float = 60.0, keep: Path | None = None,
                   worst_case: bool = False) -> None:
    """--fresh-venv: clone, venv, README's run command timed as a newcomer would run it; one JSON record."""
    kind = ("fresh-venv" if not hogs else "fresh-venv-loaded") if not worst_case else "worst-case"
    out = out or ROOT / "benchmarks" / "data" / f"default-run-{kind}-{time.strftime('%Y-%m-%d')}.json"
    with tempfile.TemporaryDirectory(prefix="ilr-fresh-") as name:
        folder = Path(name)
        plan = fresh_venv_plan(folder, worst_case)
        if dry_run:
            print(json.dumps({**plan, "out": str(out)}, indent=1))
            return
        subprocess.run(plan["clone"], check=True)
        if worst_case:
            write_worst_case_space(folder / "repo")
        subprocess.run(plan["venv"], check=True)
        hog_procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
        try:
            if hog_procs:
                time.sleep(settle)  # a busy machine has been busy for a while: its load average says so
            load_before = os.getloadavg()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            proc = subprocess.run(plan["argv"], cwd=plan["cwd"], env=newcomer_env(folder),
                                  capture_output=True, text=True)
            seconds = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            load_after = os.getloadavg()
        finally:
            for hog in hog_procs:
                hog.kill()
                hog.wait()
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
            for db in (folder / "repo").glob("studies/*.db"):
                shutil.copy2(db, keep / db.name)
    timed = time_v_fields(proc.stderr)
    # the hogs are children too, so getrusage counts them; /usr/bin/time counts the command alone
    cpu = (timed["user"] + timed["system"] if "user" in timed and "system" in timed
           else after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    peak_kib = timed.get("max_rss_kib", after.ru_maxrss)  # Linux: KiB
    record = {"command": plan["command"], "commit": plan["commit"], "fresh_venv": True, "worst_case": worst_case,
              "hogs": hogs,
              "settle_seconds": settle if hogs else 0,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
              "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
              "returncode": proc.returncode, "wall_seconds": seconds, "cpu_seconds": cpu,
              "cpu_percent": 100 * cpu / seconds if seconds else 0.0, "peak_rss_mib": peak_kib / 1024,
              "cpu_source": "/usr/bin/time -v" if "user" in timed else "getrusage(RUSAGE_CHILDREN)",
              "load_before": load_before, "load_after": load_after,
              "stdout": proc.stdout.splitlines(), "stderr_tail": proc.stderr.splitlines()[-60:]}
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{seconds:.0f} s, CPU {record['cpu_percent']:.0f}%, peak {record['peak_rss_mib']:.0f} MiB; exit {proc.returncode}")
    print(f"wrote {out}")
    if proc.returncode != 0:
        raise SystemExit(proc.returncode)


if __name__ == "__main__":
    main()
