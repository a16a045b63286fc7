"""Tokens/s of K proxies trained fused (ilr_search/training/fused.py) against the same K trained one after another with
train_proxy, in one run.

    python benchmarks/fused.py                                   # default size and d_model 128, threads 1 and 2
    python benchmarks/fused.py --steps 10 --ks 1,2,4,8 --widths 32 --threads 1
    python benchmarks/fused.py --space paper-small-offline --device cuda --dtype bf16 --compile --widths 128 \
        --ks 8,4,2,1 --threads 1 --masking-k 0 --out fused_cuda.json    # benchmarks/gpu_check.sh

Each K trains K random reuse maps of the default space (search_spaces/default.toml: 8 layers, d_model 32,
seq 64, batch 8, byte vocab; --widths sets d_model), end to end through the real trainers: --steps steps,
one evaluation at the end over --eval-windows windows (--space takes another space's model, data and batch).
Tokens/s = K * steps * batch * seq_len / wall seconds. With --compile (layers and head compiled, as on CUDA by
default), each K's fused and one-after-another runs first train 2 steps untimed, so that the timed runs compile
nothing; those warm-up seconds (mostly compiling the shapes that K's schedules bring) go into the JSON.
The fused and the one-after-another runs of a K alternate, so both see the same machine load; the load
(os.getloadavg) before and after each K goes into the JSON. At the default size at K = 8 the run also
compares the ways of handling schedules of different lengths: prefix masking (the trainer's), masking with
torch.where (every member computes every position), and grouping the members by schedule length (at K =
--masking-k; 0 skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ilr_search.data.tokens import load_space_tokens  # noqa: E402
from ilr_search.data.tokenizers import model_config  # noqa: E402
from ilr_search.training.fused import train_fused  # noqa: E402
from ilr_search.training.schedule import reuse_map_schedule  # noqa: E402
from ilr_search.space import load_space  # noqa: E402
from ilr_search.training.train import train_proxy  # noqa: E402


def random_maps(n: int, n_layers: int, max_reuse: int, seed: int) -> list[list[int]]:
    """Reuse maps like a search's: most layers once, some up to max_reuse times."""
    rng = random.Random(seed)
    return [[rng.randint(2, max_reuse) if rng.random() < 0.3 else 1 for _ in range(n_layers)] for _ in range(n)]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def machine(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name()}, {os.cpu_count()} CPU cores, {platform.system()}"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores, {platform.system()}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ks", default="1,2,4,8,16")
    p.add_argument("--widths", default="32,128", help="d_model values (the default space has 32)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--eval-windows", type=int, default=8)
    p.add_argument("--space", default="default", help="the space whose model, data and batch size are trained")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--compile", action="store_true", help="compile the layers and the loss head")
    p.add_argument("--masking-k", type=int, default=8, help="the K at which the length maskings are compared "
                   "(at the space's d_model; 0: not compared)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    space = load_space(args.space)
    data = load_space_tokens(space)
    base_model = model_config(space, data.vocab_size)
    cfg = replace(space.train, steps=args.steps, eval_fractions=(1.0,), eval_windows=args.eval_windows,
                  device=args.device, dtype=args.dtype, checkpoint_every=0, compile=args.compile)
    warm = replace(cfg, steps=2)  # first-call costs (allocator, kernels' first runs, compiles) stay out of the table
    rows: list[dict] = []
    masking: list[dict] = []
    now = datetime.now(timezone.utc)
    out = Path(args.out or f"benchmarks/data/fused-{args.device}-{now.date().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every row: a run cut short keeps what it measured
        result = {"date": now.isoformat(timespec="seconds"), "machine": machine(args.device),
                  "torch": torch.__version__,
                  "space": args.space, "device": args.device, "dtype": args.dtype, "compile": args.compile,
                  "steps": args.steps, "batch_size": cfg.batch_size, "seq_len": base_model.seq_len,
                  "n_layers": base_model.n_layers, "command": " ".join(sys.argv), "rows": rows,
                  "length_masking": masking}
        out.write_text(json.dumps(result, indent=1), encoding="utf-8")

    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for width in [int(w) for w in args.widths.split(",")]:
            model_cfg = replace(base_model, d_model=width)
            train_fused(model_cfg, [list(range(model_cfg.n_layers))] * 2, data, warm)
            train_proxy(model_cfg, list(range(model_cfg.n_layers)), data, warm)
            for k in ks:
                schedules = [reuse_map_schedule(m) for m in random_maps(k, model_cfg.n_layers,
                                                                         space.search.max_reuse, seed=k)]
                tokens = k * cfg.tokens(model_cfg.seq_len)
                warm_s = {}
                if args.compile:  # every shape of these schedules compiled before the timed runs
                    warm_s = {"fused": timed(lambda: train_fused(model_cfg, schedules, data, warm)),
                              "single": timed(lambda: [train_proxy(model_cfg, s, data, warm) for s in schedules])}
                load_before = os.getloadavg()[0]
                if args.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                fused_s = timed(lambda: train_fused(model_cfg, schedules, data, cfg))
                fused_memory = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
                single_s = timed(lambda: [train_proxy(model_cfg, s, data, cfg) for s in schedules])
                row = {"threads": threads, "d_model": width, "k": k, "schedule_runs": [len(s) for s in schedules],
                       "fused_tokens_per_s": tokens / fused_s, "single_tokens_per_s": tokens / single_s,
                       "speedup": single_s / fused_s, "warm_up_s": warm_s, "fused_max_memory_gib": fused_memory,
                       "load_before": load_before, "load_after": os.getloadavg()[0]}
                rows.append(row)
                save()
                print(f"threads {threads}  d_model {width:4d}  K {k:2d}  fused {row['fused_tokens_per_s']:8.0f} tok/s  "
                      f"one after another {row['single_tokens_per_s']:8.0f} tok/s  x{row['speedup']:.2f}  "
                      f"(load {load_before:.1f})", flush=True)
                if width == base_model.d_model and k == args.masking_k:
                    by_length: dict[int, list[list[int]]] = {}
                    for s in schedules:
                        by_length.setdefault(len(s), []).append(s)
                    if args.compile:  # the groups' own shapes (fewer members), compiled untimed
                        for g in by_length.values():
                            train_fused(model_cfg, g, data, warm)
                    seconds = {
                        "prefix": fused_s,
                        "where": timed(lambda: train_fused(model_cfg, schedules, data, cfg, length_masking="where")),
                        "grouped_by_length": timed(lambda: [train_fused(model_cfg, g, data, cfg)
                                                            for g in by_length.values()]),
                    }
                    masking.append({"threads": threads, "k": k, "groups_by_length": len(by_length),
                                    "tokens_per_s": {mode: tokens / s for mode, s in seconds.items()},
                                    "load": os.getloadavg()[0]})
                    save()
                    print("  schedules of different lengths: " + ", ".join(f"{mode} {tokens / s:.0f} tok/s"
                                                                          for mode, s in seconds.items()), flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
