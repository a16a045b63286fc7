"""Does a run's result depend on the group it trains in? Four maps at two seeds, each trained alone with train_proxy
and as a member of four fused groups (train_fused); prints, per (map, seed), its loss alone and in each group.

    python benchmarks/fused_alone.py

fp32 on the CPU, one thread, d_model 32, 48 steps at the default lr: small enough to run in a minute, long enough for
a rounding difference to show. The study path (training/jobs.py) trains a fusable run of a fusing study through the
fused trainer even alone, so that which group a run lands in (the race's workers claim by timing) changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.training.fused import train_fused
from ilr_search.training.train import train_proxy


def main() -> None:
    torch.set_num_threads(1)
    data = load_tokens(DataConfig())
    model = ModelConfig(vocab_size=256, n_layers=4, d_model=32, n_heads=4, seq_len=64)
    train = TrainConfig(
        steps=48, eval_fractions=(0.5, 1.0), eval_windows=8, checkpoint_every=0, dtype="fp32", device="cpu"
    )
    maps = [[0, 1, 2, 3], [0, 0, 1, 2, 3], [0, 1, 1, 2, 2, 3], [0, 0, 0, 1, 2, 3, 3]]
    alone = {
        (i, s): train_proxy(model, m, data, replace(train, seed=s)).val_loss for i, m in enumerate(maps) for s in (1, 2)
    }
    grouped: dict[tuple[int, int], list[float]] = {key: [] for key in alone}
    for group in ([0, 1], [1, 2, 3], [0, 3], [2, 3]):
        for s in (1, 2):
            results = train_fused(model, [maps[i] for i in group], data, train, seeds=[s] * len(group))
            for i, r in zip(group, results, strict=True):
                grouped[(i, s)].append(r.val_loss)
    same_in_groups = sum(len(set(v)) == 1 for v in grouped.values())
    equal_alone = sum(v[0] == alone[k] for k, v in grouped.items())
    for (i, s), losses in sorted(grouped.items()):
        print(f"map {maps[i]} seed {s}: train_proxy {alone[(i, s)]:.7f}, fused {', '.join(f'{v:.7f}' for v in losses)}")
    print(f"{same_in_groups} of {len(grouped)} runs give one loss in every group; {equal_alone} equal train_proxy's")


if __name__ == "__main__":
    main()
