"""Do the capacity knob's routers learn which tokens need a repeated pass? A synthetic task (issue 55): one layer
run twice (schedule 0,0) at capacity C, on sequences of position pairs, each either two symbols (kind A: each
symbol's target is f(s), f a fixed random permutation of the symbols) or a marker then a symbol (kind B: the
symbol's target is f(f(s)); the marker's target is the marker). The layer's shared weights can learn f once and
apply it again to the B tokens in the routed pass, which must skip the A tokens (a second f is wrong for them). The
router's selection rate of each kind is measured on fresh sequences, both as training chooses (top ceil(C T) by z)
and as evaluation decides (z > 0).

    python benchmarks/router_synthetic.py                    # seeds 0-3, 300 steps, C 0.5
    python benchmarks/router_synthetic.py --seeds 0 --steps 600

About 10 s a seed on one core (OMP_NUM_THREADS=1). Measured (300 steps, C 0.5, d_model 16, CPU):

    seed 0: top-k chosen A 0.58 B 0.84 marker 0.00 | z > 0 A 0.57 B 0.82 marker 0.00
    seed 1: top-k chosen A 0.37 B 0.24 marker 1.00 | z > 0 A 0.35 B 0.20 marker 1.00
    seed 2: top-k chosen A 0.37 B 0.25 marker 1.00 | z > 0 A 0.38 B 0.28 marker 1.00
    seed 3: top-k chosen A 0.61 B 0.80 marker 0.00 | z > 0 A 0.61 B 0.79 marker 0.00

Seeds 0 and 3 route the needy kind B (0.80 to 0.84, against 0.58 to 0.61 of A); seeds 1 and 2 route every marker
and fewer B than A: the routed pass then runs on the markers, and the B tokens' f(f(s)) is learned in the first
pass. The routers always choose by kind, not always by need.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ilr_search.config import ModelConfig
from ilr_search.training.model import ILRTransformer

SYMBOLS, T = 64, 32
MARKER = SYMBOLS  # the marker's id, after the symbols
KINDS = ("A", "B", "marker")


def permutation() -> torch.Tensor:
    return torch.randperm(SYMBOLS, generator=torch.Generator().manual_seed(5))


def batch(gen: torch.Generator, B: int, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, targets and kinds (0: A, 1: B, 2: marker), each (B, T)."""
    symbols = torch.randint(0, SYMBOLS, (B, T), generator=gen)
    marked = torch.rand(B, T // 2, generator=gen) < 0.5  # each pair: marker + symbol (B), or two symbols (A)
    x = symbols.clone()
    x[:, 0::2] = torch.where(marked, MARKER, symbols[:, 0::2])
    y = f[symbols]
    y[:, 1::2] = torch.where(marked, f[f[symbols[:, 1::2]]], y[:, 1::2])
    y[:, 0::2] = torch.where(marked, MARKER, y[:, 0::2])
    kind = torch.zeros(B, T, dtype=torch.long)
    kind[:, 1::2] = marked.long()
    kind[:, 0::2] = 2 * marked.long()
    return x, y, kind


@dataclass(frozen=True)
class Rates:
    """Per kind, the fraction of its tokens that training's top-k chooses and that evaluation's z > 0 takes."""

    topk: dict[str, float]
    positive: dict[str, float]
    loss: dict[str, float]


def train_and_measure(seed: int, steps: int, capacity: float = 0.5, d_model: int = 16) -> Rates:
    torch.manual_seed(seed)
    cfg = ModelConfig(SYMBOLS + 1, 1, d_model, 2, T, mlp_ratio=1.0, max_reuse=2, capacity=capacity)
    model, schedule, f = ILRTransformer(cfg), [0, 0], permutation()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y, _ = batch(gen, 16, f)
        loss = model.loss(x, y, schedule)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    x, y, kind = batch(torch.Generator().manual_seed(999), 64, f)
    with torch.no_grad():
        states: list[torch.Tensor] = []
        logits = F.linear(model.hidden(x, schedule, states=states), model.head_weight)
        token_loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(x.shape)
        assert model.routers is not None
        z = F.linear(F.rms_norm(states[0], (d_model,), eps=cfg.norm_eps), model.routers[0, 0][None])[..., 0]
    chosen = torch.zeros_like(z, dtype=torch.bool).scatter(1, z.topk(math.ceil(capacity * T), dim=1).indices, True)

    def per_kind(values: torch.Tensor) -> dict[str, float]:
        return {name: values[kind == k].float().mean().item() for k, name in enumerate(KINDS)}

    return Rates(per_kind(chosen), per_kind(z > 0), per_kind(token_loss))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0,1,2,3")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--capacity", type=float, default=0.5)
    args = parser.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        r = train_and_measure(seed, args.steps, args.capacity)
        print(
            f"seed {seed}: top-k chosen "
            + " ".join(f"{k} {v:.2f}" for k, v in r.topk.items())
            + " | z > 0 "
            + " ".join(f"{k} {v:.2f}" for k, v in r.positive.items())
            + " | loss "
            + " ".join(f"{k} {v:.3f}" for k, v in r.loss.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
