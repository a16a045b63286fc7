"""One member's forward pass against transformers', side by side in one process: SmolLM2-135M (a GGUF, or the
transformers folder it converts to) scoring one chunk of held-out windows (32 windows of 256 tokens, batches of 8)
through the frozen evaluator, fp32 and bf16, beside transformers' LlamaForCausalLM forward of the same batches (the
same weights, logits and no loss; use_cache off), and beside that forward with `labels` (its own fp32 cross-entropy:
what a user scoring perplexity with transformers runs; the evaluator computes the same loss), and beside
ilr-search's own forward to the logits (ILRTransformer.forward of the evaluator's model: the same work as
transformers' logits-only forward). Issue 57, item 5.

    python benchmarks/forward_speed.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --label HEAD --out A.json
    python benchmarks/forward_speed.py --folder studies/.cache/gguf-... --label 3e1ded7 --out B.json  # older commits

The four passes (ilr-search fp32, transformers fp32, ilr-search bf16, transformers bf16) run in rounds, each round
in a rotated order, so that all four see the same machine load; per round the ratio ilr-search / transformers of
each dtype, and over the rounds the medians (the machine is shared: a ratio of one round is the figure, not a time),
by wall time and by the process's CPU time.
It runs at any commit that has a frozen evaluator: training/frozen.py's FrozenEvaluator (weights cast once to the
dtype), or before it (3e1ded7 and older) window_losses (fp32 weights, bf16 under autocast), as that commit scored a
frozen run. The JSON also holds each dtype's window losses' sum, so that runs at two commits can be compared.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

SEQ = 256
BATCH = 8


def folder_of(gguf: str) -> Path:
    """The transformers folder the GGUF converts to (this commit's converter)."""
    from ilr_search.training.pretrained import resolve_source

    return resolve_source(gguf)


def before_pass(run_and_batches, dtype: str):
    """--before-too: the same evaluator run as main's 754bbb3 ran it, in this process (ILRTransformer.hidden without
    the rotation tables: apply_rope in attend; the head's tensors fresh each row), for an A/B that one machine's
    load cannot tilt."""
    evaluator, run, batches = run_and_batches

    def before():
        layer_fn, head = evaluator.model.layer_fn, evaluator._head
        from ilr_search.training.model import model_layer

        evaluator.model.layer_fn, evaluator._head = model_layer, None  # not decoder_layer: no rotation tables
        try:
            return run()
        finally:
            evaluator.model.layer_fn, evaluator._head = layer_fn, head

    return before


def ilr_pass(source: str, folder: Path, dtype: str, windows: int):
    """(run, losses) of the frozen evaluator at this commit: run() scores the chunk, losses() its window losses."""
    import torch

    from ilr_search.config import DataConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.pretrained import open_checkpoint

    try:
        from ilr_search.training.build import build_model
    except ImportError:  # before training/build.py
        from ilr_search.training.train import build_model  # type: ignore[no-redef]
    cfg = open_checkpoint(source, seq_len=SEQ).config
    data = load_tokens(DataConfig(tokenizer=f"file:{folder / 'tokenizer.json'}"), seq_len=SEQ)
    plain = list(range(cfg.n_layers))
    model = build_model(cfg, 0)
    try:
        from ilr_search.training.frozen import FrozenEvaluator

        evaluator = FrozenEvaluator(model, data, dtype, BATCH, 0)

        def run():
            return evaluator.evaluate(cfg, plain, 0, windows, share=False).scores

        run.evaluator = evaluator  # type: ignore[attr-defined]
    except ImportError:  # before the evaluator: fp32 weights, bf16 under autocast (an older commit's name)
        window_losses = getattr(importlib.import_module("ilr_search.training.frozen"), "window_losses")  # noqa: B009

        compute = torch.bfloat16 if dtype == "bf16" else torch.float32
        model.eval()

        def run():
            return window_losses(model, plain, data, 0, windows, BATCH, compute).losses

    batches = [torch.from_numpy(x) for x, _ in data.window_batches(data.window_chunk(0, windows, SEQ), SEQ, BATCH)]
    return run, batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", help="the GGUF (this commit converts it)")
    ap.add_argument("--folder", help="the transformers folder instead (commits without the GGUF converter)")
    ap.add_argument("--label", default="")
    ap.add_argument("--windows", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--before-too", action="store_true", help="also main 754bbb3's path in this process (A/B)")
    args = ap.parse_args()
    import torch
    import transformers

    import ilr_search

    if not (args.gguf or args.folder):
        ap.error("--gguf or --folder")
    folder = Path(args.folder) if args.folder else folder_of(args.gguf)
    source = args.gguf or str(folder)
    tokens = args.windows * SEQ
    runs = {}
    for dtype in ("fp32", "bf16"):
        ilr, batches = ilr_pass(source, folder, dtype, args.windows)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        hf = hf.to(torch.bfloat16 if dtype == "bf16" else torch.float32)

        def hf_run(model=hf, batches=batches):
            with torch.no_grad():
                for x in batches:
                    model(input_ids=x, use_cache=False)

        def hf_loss_run(model=hf, batches=batches):
            with torch.no_grad():
                for x in batches:
                    model(input_ids=x, labels=x, use_cache=False)

        runs[f"ilr_{dtype}"], runs[f"hf_{dtype}"], runs[f"hfloss_{dtype}"] = ilr, hf_run, hf_loss_run
        if hasattr(ilr, "evaluator"):  # the same model's forward to the logits, as transformers' hf_run

            def ilr_logits_run(model=ilr.evaluator.model, batches=batches):
                with torch.inference_mode():
                    for x in batches:
                        model(x)

            runs[f"ilrlogits_{dtype}"] = ilr_logits_run
        if args.before_too:
            runs[f"before_{dtype}"] = before_pass((ilr.evaluator, ilr, batches), dtype)
    names = list(runs)
    scored = [name for name in names if name.startswith(("ilr_", "before_"))]
    losses = {name: [float(v) for v in runs[name]()] for name in scored}  # untimed
    for name in names:
        if name not in scored:
            runs[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in names}  # the process's CPU time (both threads)
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0, c0 = time.perf_counter(), time.process_time()
            runs[name]()
            seconds[name].append(time.perf_counter() - t0)
            cpu_seconds[name].append(time.process_time() - c0)
    loads.append(os.getloadavg()[0])

    def ratios_of(times: dict[str, list[float]], against: str = "hf") -> dict[str, list[float]]:
        return {
            dtype: [h / i for i, h in zip(times[f"ilr_{dtype}"], times[f"{against}_{dtype}"], strict=True)]
            for dtype in ("fp32", "bf16")
        }

    ratios, cpu_ratios = ratios_of(seconds), ratios_of(cpu_seconds)
    loss_ratios = ratios_of(seconds, "hfloss")
    # ilr-search's forward to the logits against transformers' (the same work: no loss on either side)
    logits_ratios = {
        dtype: [h / i for i, h in zip(seconds[f"ilrlogits_{dtype}"], seconds[f"hf_{dtype}"], strict=True)]
        for dtype in ("fp32", "bf16")
        if f"ilrlogits_{dtype}" in seconds
    }
    before_over_now = {
        dtype: [b / i for i, b in zip(seconds[f"ilr_{dtype}"], seconds[f"before_{dtype}"], strict=True)]
        for dtype in ("fp32", "bf16")
        if f"before_{dtype}" in seconds
    }
    result = {
        "label": args.label,
        "code": str(Path(ilr_search.__file__).resolve().parent.parent),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(ilr_search.__file__).resolve().parent,
            check=False,
        ).stdout.strip(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "command": " ".join([sys.executable, *sys.argv]),
        "tokens": tokens,
        "rounds": args.rounds,
        "load_per_round": loads,
        "seconds": seconds,
        "tokens_per_second_median": {name: tokens / statistics.median(s) for name, s in seconds.items()},
        "ratio_per_round": ratios,
        "ratio_median": {dtype: statistics.median(v) for dtype, v in ratios.items()},
        "ratio_with_loss_per_round": loss_ratios,
        "ratio_with_loss_median": {dtype: statistics.median(v) for dtype, v in loss_ratios.items()},
        "logits_ratio_per_round": logits_ratios,
        "logits_ratio_median": {dtype: statistics.median(v) for dtype, v in logits_ratios.items()},
        "before_over_now_per_round": before_over_now,
        "before_over_now_median": {dtype: statistics.median(v) for dtype, v in before_over_now.items()},
        "cpu_seconds": cpu_seconds,
        "cpu_ratio_per_round": cpu_ratios,
        "cpu_ratio_median": {dtype: statistics.median(v) for dtype, v in cpu_ratios.items()},
        "loss_sum": {name: sum(v) for name, v in losses.items()},
        "losses": losses,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    tps = result["tokens_per_second_median"]
    for dtype in ("fp32", "bf16"):
        print(
            f"{args.label} {dtype}: ilr-search {tps[f'ilr_{dtype}']:.0f} tokens/s, transformers "
            f"{tps[f'hf_{dtype}']:.0f}, ratio {result['ratio_median'][dtype]:.3f} (median of "
            f"{', '.join(f'{v:.2f}' for v in ratios[dtype])}); by CPU time "
            f"{result['cpu_ratio_median'][dtype]:.3f}; against transformers' forward with its loss (labels) "
            f"{result['ratio_with_loss_median'][dtype]:.3f}"
        )
    for dtype, v in logits_ratios.items():
        print(
            f"{dtype}, forward to the logits on both sides: ilr-search {tps[f'ilrlogits_{dtype}']:.0f} tokens/s, "
            f"ratio {statistics.median(v):.3f} (median of {', '.join(f'{x:.2f}' for x in v)})"
        )
    for dtype, v in before_over_now.items():
        print(
            f"{dtype}: main's path / this one {statistics.median(v):.3f} (median of {', '.join(f'{x:.2f}' for x in v)})"
        )
    print(f"load {min(loads):.1f} to {max(loads):.1f}; wrote {args.out}")


if __name__ == "__main__":
    main()
