"""Training throughput of the ILR transformer in three modes, with model FLOP/s and MFU.

    python benchmarks/throughput.py                       # d_model 128, 4 layers, 4 heads, seq 256, batch 32
    python benchmarks/throughput.py --device cuda --batch-size 64

MFU = analytic model FLOP/s (3 x forward FLOPs per token x tokens/s) / the machine's dense matmul FLOP/s at
the same dtype, measured in this run. The compiled mode compiles each decoder layer, so a second map with
another schedule should compile nothing new: its first-step overhead is printed.

Two training steps are compared in one run (--heads-impl):
  plain  the unfused trainer: logits materialised, F.cross_entropy on an fp32 copy, loss.item() per step;
  fused  the trainer now: the chunked, fused head and loss of ilr_search/training/loss.py (compiled with the layers),
         the loss kept on the device (one host read per timing window here, every 16 steps in the trainer).
Tokens/s is the median over --repeats windows of --steps steps, each window timed with one sync at its end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from ilr_search.training.flops import forward_flops_per_token
from ilr_search.training.model import ILRTransformer
from ilr_search.config import ModelConfig
from ilr_search.training.schedule import reuse_map_schedule


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(dtype: torch.dtype, device: torch.device, repeats: int = 5) -> float:
    """Best dense matmul FLOP/s over a few square sizes."""
    best = 0.0
    for n in (1024, 2048, 4096):
        a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
        a @ b
        sync(device)
        samples = []
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            sync(device)
            samples.append(time.perf_counter() - t)
        best = max(best, 2 * n**3 / statistics.median(samples))
    return best


def train_step(model: ILRTransformer, opt: torch.optim.Optimizer, schedule: list[int], batch: torch.Tensor,
               dtype: torch.dtype, head: str, compiled: bool) -> torch.Tensor:
    x, y = batch[:, :-1], batch[:, 1:]
    autocast = torch.autocast(batch.device.type, dtype=dtype) if dtype == torch.bfloat16 else contextlib.nullcontext()
    with autocast:
        if head == "plain":
            loss = F.cross_entropy(model(x, schedule).float().flatten(0, 1), y.flatten())
        else:
            loss = model.loss(x, y, schedule, dtype, compiled=compiled)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if head == "plain":
        loss.item()  # the old trainer read the loss every step: a host sync
    return loss.detach()


def step_times(model: ILRTransformer, schedule: list[int], batch: torch.Tensor, dtype: torch.dtype, head: str,
               compiled: bool, steps: int, repeats: int) -> tuple[float, list[float]]:
    """(first step seconds, seconds per step of each timing window)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    t = time.perf_counter()
    train_step(model, opt, schedule, batch, dtype, head, compiled)
    sync(batch.device)
    first = time.perf_counter() - t
    train_step(model, opt, schedule, batch, dtype, head, compiled)  # a second warm step (autotuning, caches)
    sync(batch.device)
    windows = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(steps):
            train_step(model, opt, schedule, batch, dtype, head, compiled)
        sync(batch.device)
        windows.append((time.perf_counter() - t) / steps)
    return first, windows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10, help="steps per timing window")
    ap.add_argument("--repeats", type=int, default=3, help="timing windows per mode (the median is reported)")
    ap.add_argument("--heads-impl", default="plain,fused", help="plain (the old trainer step) and/or fused")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--modes", default="fp32,bf16,bf16+compile")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    device = torch.device(args.device)
    cfg = ModelConfig(vocab_size=args.vocab, n_layers=args.layers, d_model=args.d_model, n_heads=args.heads,
                      seq_len=args.seq_len)
    schedule = reuse_map_schedule([1] * args.layers)
    second = reuse_map_schedule([2] + [1] * (args.layers - 1))
    batch = torch.randint(0, args.vocab, (args.batch_size, args.seq_len + 1), device=device)
    tokens = args.batch_size * args.seq_len
    model_flops_per_token = 3 * forward_flops_per_token(cfg, schedule)
    peaks = {"fp32": matmul_peak(torch.float32, device), "bf16": matmul_peak(torch.bfloat16, device)}

    rows = []
    for mode in args.modes.split(","):
        for head in args.heads_impl.split(","):
            dtype = torch.bfloat16 if mode.startswith("bf16") else torch.float32
            peak = peaks["bf16" if dtype == torch.bfloat16 else "fp32"]
            compiled = mode.endswith("+compile")
            torch.manual_seed(0)
            torch._dynamo.reset()
            model = ILRTransformer(cfg).to(device)
            if compiled:
                model.compile_layers()
            first, windows = step_times(model, schedule, batch, dtype, head, compiled, args.steps, args.repeats)
            median = statistics.median(windows)
            row = {"mode": mode, "head": head, "tokens_per_second": tokens / median, "step_ms": 1e3 * median,
                   "model_tflops": model_flops_per_token * tokens / median / 1e12,
                   "peak_tflops": peak / 1e12, "mfu": model_flops_per_token * tokens / median / peak,
                   "first_step_s": first, "max_memory_gib": (torch.cuda.max_memory_allocated() / 2**30
                                                             if device.type == "cuda" else None)}
            if compiled:
                first2, windows2 = step_times(model, second, batch, dtype, head, compiled, 2, 1)
                # compile overhead of a new map: its first step minus a normal step of that map
                row["second_map_compile_s"] = max(0.0, first2 - statistics.median(windows2))
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            del model
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)

    if args.json:
        print(json.dumps({"config": vars(args), "rows": rows}))
        return
    print(f"d_model {args.d_model}, {args.layers} layers, {args.heads} heads, seq {args.seq_len}, batch "
          f"{args.batch_size}, vocab {args.vocab}, device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| mode | head | tokens/s | step ms | model TFLOP/s | matmul peak TFLOP/s | MFU | first step s | 2nd map compile s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        extra = f"{r['second_map_compile_s']:.2f}" if "second_map_compile_s" in r else "-"
        print(f"| {r['mode']} | {r['head']} | {r['tokens_per_second']:,.0f} | {r['step_ms']:.1f} | {r['model_tflops']:.3f} | "
              f"{r['peak_tflops']:.3f} | {r['mfu']:.0%} | {r['first_step_s']:.1f} | {extra} |")


if __name__ == "__main__":
    main()
