"""Does a refactor of the training engine keep its numbers? Records train_proxy's and train_fused's results on a
spread of settings (knobs, grouped-query attention with biases and q/k norms, bf16, gradient accumulation,
divergence, a stop by the evaluation callback, checkpoint and resume, a wsd stable checkpoint and its continuation,
fused groups, a fused divergence and a fused resume), every number but the timings, into one JSON; `--compare`
lists where two such files differ (NaN equals NaN).

    python benchmarks/engine_identity.py --out A.json          # at one commit
    python benchmarks/engine_identity.py --out B.json          # at another (git checkout, or a worktree)
    python benchmarks/engine_identity.py --compare A.json B.json

A run of it takes seconds (tiny models, 40 steps, fp32 on the CPU unless the setting says bf16).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

TIMINGS = ("train_seconds", "tokens_per_second", "data_seconds", "eval_seconds")


def record(result) -> dict:
    return json.loads(json.dumps({k: v for k, v in asdict(result).items() if k not in TIMINGS}, default=str))


def results(work: Path) -> dict:
    from ilr_search.config import DataConfig, ModelConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.fused import train_fused
    from ilr_search.training.train import train_proxy

    data = load_tokens(DataConfig())

    def model(**kw) -> ModelConfig:
        return replace(ModelConfig(vocab_size=256, n_layers=3, d_model=16, n_heads=2, seq_len=32), **kw)

    base = TrainConfig(
        steps=40,
        batch_size=4,
        lr=3e-3,
        eval_fractions=(0.25, 0.5, 1.0),
        eval_windows=8,
        dtype="fp32",
        device="cpu",
        checkpoint_every=0,
    )

    def train(**kw) -> TrainConfig:
        return replace(base, **kw)

    out: dict = {}
    s = [0, 0, 1, 2]
    out["plain"] = record(train_proxy(model(), [0, 1, 2], data, train()))
    out["ilr"] = record(train_proxy(model(), s, data, train()))
    out["grad_accum"] = record(train_proxy(model(), s, data, train(grad_accum=2)))
    out["bf16"] = record(train_proxy(model(), s, data, train(dtype="bf16")))
    settings = {
        "injection_gated": {"injection": "gated"},
        "iteration_encoding": {"iteration_encoding": True, "max_reuse": 2},
        "iteration_norms": {"iteration_norms": True, "max_reuse": 2},
        "repeat_scale_lr": {"repeat_scale": "lr"},
        "repeat_scale_residual": {"repeat_scale": "residual"},
        "damping": {"damping": 0.5},
        "gqa_bias_qknorm_untied": {
            "n_heads": 4,
            "n_kv_heads": 2,
            "head_dim": 4,
            "qk_norm": True,
            "qkv_bias": True,
            "tie_embeddings": False,
        },
        "alibi": {"pe": "alibi"},
        "learned": {"pe": "learned"},
    }
    for name, options in settings.items():
        out[name] = record(train_proxy(model(**options), s, data, train()))
    out["diverged"] = record(train_proxy(model(), s, data, train(lr=50.0)))
    out["stopped"] = record(train_proxy(model(), s, data, train(), on_eval=lambda p: p.step >= 20))
    checkpoint = work / "checkpoint.pt"
    out["checkpoint_first"] = record(
        train_proxy(model(), s, data, train(checkpoint_every=10), lambda p: p.step >= 20, checkpoint_path=checkpoint)
    )
    out["checkpoint_resumed"] = record(
        train_proxy(model(), s, data, train(checkpoint_every=10), checkpoint_path=checkpoint)
    )
    wsd = train(lr_schedule="wsd", cooldown_frac=0.25)
    stable = work / "stable.pt"
    out["wsd"] = record(train_proxy(model(), s, data, wsd, stable_checkpoint=stable))
    out["wsd_continued"] = record(train_proxy(model(), s, data, replace(wsd, steps=60), start_from=stable))
    out["fused"] = [
        record(r) for r in train_fused(model(), [s, [0, 1, 2], [0, 1, 1, 2, 2]], data, train(), seeds=[0, 1, 2])
    ]
    out["fused_diverged"] = [record(r) for r in train_fused(model(), [s, [0, 1, 2]], data, train(lr=50.0))]
    paths = [work / "member0.pt", work / "member1.pt"]
    out["fused_checkpoint_first"] = [
        record(r)
        for r in train_fused(
            model(),
            [s, [0, 1, 2]],
            data,
            train(checkpoint_every=10),
            [lambda p: p.step >= 20] * 2,
            checkpoint_paths=paths,
        )
    ]
    out["fused_checkpoint_resumed"] = [
        record(r)
        for r in train_fused(model(), [s, [0, 1, 2]], data, train(checkpoint_every=10), checkpoint_paths=paths)
    ]
    return out


def differences(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2)
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        found = differences(a, b)
        settings = sorted({d.split(".")[1].split("[")[0].split(":")[0] for d in found})
        print(f"{len(a)} settings; {len(settings)} differ: {', '.join(settings) or 'none'}")
        for d in found[:40]:
            print(" ", d)
        sys.exit(0)
    with tempfile.TemporaryDirectory() as work:
        Path(args.out).write_text(json.dumps(results(Path(work)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
