"""Tokens/s of K proxies trained fused (ilr_search/training/fused.py) against the same K trained one after another with
train_proxy, in one run (issue 20).

    python benchmarks/fused.py                                   # default size and d_model 128, threads 1 and 2
    python benchmarks/fused.py --steps 10 --ks 1,2,4,8 --widths 32 --threads 1

Each K trains K random reuse maps of the default space (search_spaces/default.toml: 8 layers, d_model 32,
seq 64, batch 8, byte vocab; --widths sets d_model), end to end through the real trainers: --steps steps,
one evaluation at the end over --eval-windows windows. Tokens/s = K * steps * batch * seq_len / wall seconds.
The fused and the one-after-another runs of a K alternate, so both see the same machine load; the load
(os.getloadavg) before and after each K goes into the JSON. At the default size at K = 8 the run also
compares the ways of handling schedules of different lengths: prefix masking (the trainer's), masking with
torch.where (every member computes every position), and grouping the members by schedule length.
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

from ilr_search.config import DataConfig  # noqa: E402
from ilr_search.data.tokens import load_tokens
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


def machine() -> str:
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
    p.add_argument("--out", default=None)
    args = p.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    space = load_space("default")
    data = load_tokens(DataConfig())
    base_model = model_config(space, data.vocab_size)
    cfg = replace(space.train, steps=args.steps, eval_fractions=(1.0,), eval_windows=args.eval_windows,
                  device="cpu", dtype="fp32", checkpoint_every=0, compile=False)
    rows: list[dict] = []
    masking: list[dict] = []
    now = datetime.now(timezone.utc)
    out = Path(args.out or f"benchmarks/data/fused-cpu-{now.date().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every row: a run cut short keeps what it measured
        result = {"date": now.isoformat(timespec="seconds"), "machine": machine(), "torch": torch.__version__,
                  "steps": args.steps, "batch_size": cfg.batch_size, "seq_len": base_model.seq_len,
                  "n_layers": base_model.n_layers, "command": " ".join(sys.argv), "rows": rows,
                  "length_masking": masking}
        out.write_text(json.dumps(result, indent=1), encoding="utf-8")

    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for width in [int(w) for w in args.widths.split(",")]:
            model_cfg = replace(base_model, d_model=width)
            warm = replace(cfg, steps=2)  # first-call costs (allocator, kernels' first runs) stay out of the table
            train_fused(model_cfg, [list(range(model_cfg.n_layers))] * 2, data, warm)
            train_proxy(model_cfg, list(range(model_cfg.n_layers)), data, warm)
            for k in ks:
                schedules = [reuse_map_schedule(m) for m in random_maps(k, model_cfg.n_layers,
                                                                         space.search.max_reuse, seed=k)]
                tokens = k * cfg.tokens(model_cfg.seq_len)
                load_before = os.getloadavg()[0]
                fused_s = timed(lambda: train_fused(model_cfg, schedules, data, cfg))
                single_s = timed(lambda: [train_proxy(model_cfg, s, data, cfg) for s in schedules])
                row = {"threads": threads, "d_model": width, "k": k, "schedule_runs": [len(s) for s in schedules],
                       "fused_tokens_per_s": tokens / fused_s, "single_tokens_per_s": tokens / single_s,
                       "speedup": single_s / fused_s, "load_before": load_before, "load_after": os.getloadavg()[0]}
                rows.append(row)
                save()
                print(f"threads {threads}  d_model {width:4d}  K {k:2d}  fused {row['fused_tokens_per_s']:8.0f} tok/s  "
                      f"one after another {row['single_tokens_per_s']:8.0f} tok/s  x{row['speedup']:.2f}  "
                      f"(load {load_before:.1f})", flush=True)
                if width == base_model.d_model and k == 8:
                    by_length: dict[int, list[list[int]]] = {}
                    for s in schedules:
                        by_length.setdefault(len(s), []).append(s)
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
