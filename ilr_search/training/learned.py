"""Learned schedules (`run --learn`): one model trained at the widest schedule the space allows, every layer run
max_reuse times in a row, with a gate in [0, 1] on each pass k >= 1 of each layer, trained with the weights (frozen,
with `cfg.steps` 0: the weights fixed, only the gates train, on chunk cfg.seed of the held-out windows, the windows
a frozen study's trials are scored on).

The gates are ordered: pass k's effective gate is the product sigmoid(theta[l, 1]) ... sigmoid(theta[l, k]), so
pass k + 1 is open only where pass k is, and one pass is never split across two half-open gates. A gate is a factor
on both residual branches of its pass, passed to the one forward pass as its branch factor (a 0-dim tensor, as
damping's float is; model.decoder_layer): a gate of exactly 1 is the widest map, of exactly 0 on every repeat the
plain model. The expected forward FLOPs count each pass at its gate (flops.py's layer cost). The budget is held by a
projection: after each gate step, where the expected FLOPs exceed the step's target, every gate logit is shifted
down by one common amount (found by bisection) until they meet it; where they are under it nothing acts, so a
schedule cheaper than the budget can win. The target starts at the widest schedule's expected FLOPs and falls
linearly to the budget over the first ANNEAL_SHARE of the steps: the gates start open and the weights learn to use
the passes before the budget closes the ones the loss values least. (Held at the budget from the first step, or
by a Lagrange multiplier, every gate starts half-open and the loss closes them all on a proxy trained from scratch:
benchmarks/learned_gate_projection.py, reports/learned-schedule_cpu-2core_2026-12-06.md.) `shift` is the total
shift the budget imposed (0: it never bound).

The read-off rule (LearnedGates.counts): a pass is kept where its effective gate is >= 0.5 (by the ordering, the
kept passes of a layer are its first ones); a map over the budget drops its kept passes of the lowest gates until it
fits. search/learn.py turns the kept gates into the damping knob's setting where the study searches damping, and
drops them (1, the plain repeat) where it does not.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ilr_search.config import ModelConfig, TrainConfig
from ilr_search.data.tokens import TokenData
from ilr_search.training.build import build_model
from ilr_search.training.device import autocast_for, resolve_device, resolve_dtype
from ilr_search.training.flops import baseline_flops_per_token, layer_flops_per_token
from ilr_search.training.loss import linear_cross_entropy
from ilr_search.training.model import ILRTransformer, PositionScale
from ilr_search.training.train import build_optimizer, set_lr

if TYPE_CHECKING:
    from ilr_search.training.frozen import EvalData

GATE_START = 3.0  # each pass's own sigmoid starts at 0.95: the widest schedule, nearly open
GATE_LR = 0.1  # the gates' Adam step (constant: the weights' schedule would freeze them as it decays)
ANNEAL_SHARE = 0.8  # the share of the steps over which the budget's target falls from the widest schedule's FLOPs
FROZEN_STEPS = 200  # gate steps of a frozen study (cfg.steps is 0 there)
KEEP_AT = 0.5  # the read-off rule: a pass is kept where its effective gate is at least this


def widest_schedule(n_layers: int, max_reuse: int) -> list[int]:
    """Every layer run max_reuse times in a row."""
    return [layer for layer in range(n_layers) for _ in range(max_reuse)]


def effective_gates(logits: torch.Tensor) -> torch.Tensor:
    """(layers, max_reuse - 1) effective gates of passes 1.. from their logits: the running product of sigmoids."""
    return torch.sigmoid(logits).cumprod(dim=1)


def gate_scales(gates: torch.Tensor) -> list[PositionScale]:
    """The branch factor of each position of the widest schedule: None (1) at a layer's first pass, its 0-dim gate
    tensor at pass k >= 1."""
    layers, passes = gates.shape[0], gates.shape[1] + 1
    return [None if k == 0 else gates[layer, k - 1] for layer in range(layers) for k in range(passes)]


def gated_loss(
    model: ILRTransformer,
    x: torch.Tensor,
    y: torch.Tensor,
    gates: torch.Tensor,
    compute_dtype: torch.dtype | None = None,
    ignore_index: int | None = None,
) -> torch.Tensor:
    """The mean loss of the widest schedule with each pass k >= 1 scaled by its effective gate."""
    schedule = widest_schedule(gates.shape[0], gates.shape[1] + 1)
    hidden = model.hidden(x, schedule, gate_scales(gates))
    return linear_cross_entropy(hidden, model.head_weight, y, compute_dtype, "mean", False, ignore_index)


def expected_ratio(cfg: ModelConfig, gates: torch.Tensor) -> torch.Tensor:
    """Expected forward FLOPs per token over the all-ones map's: every pass k >= 1 at its gate's share of a layer."""
    base = baseline_flops_per_token(cfg)
    return (base + layer_flops_per_token(cfg) * gates.sum()) / base


@dataclass(frozen=True)
class LearnedGates:
    """What learning gave: each layer's effective gates of passes 1..max_reuse-1, the final expected FLOPs ratio
    and the total logit shift the budget imposed, and what it cost (steps, seconds)."""

    gates: tuple[tuple[float, ...], ...]
    expected_ratio: float
    budget_ratio: float
    shift: float
    steps: int
    seconds: float
    frozen: bool

    def counts(self, max_layer_runs: int) -> tuple[int, ...]:
        """The read-off map's counts: 1 + the passes kept (gate >= KEEP_AT), the lowest-gated kept passes dropped
        until the map runs at most `max_layer_runs` layers (the budget's)."""
        kept = sorted(
            ((g, layer) for layer, row in enumerate(self.gates) for g in row if g >= KEEP_AT), key=lambda t: -t[0]
        )
        counts = [1] * len(self.gates)
        for _, layer in kept[: max(0, max_layer_runs - len(self.gates))]:
            counts[layer] += 1
        return tuple(counts)

    def kept_gates(self, counts: tuple[int, ...]) -> list[float]:
        """The effective gates of the passes a map of `counts` keeps."""
        return [g for row, r in zip(self.gates, counts, strict=True) for g in row[: r - 1]]


def project_to(cfg: ModelConfig, logits: torch.Tensor, target: float) -> float:
    """Shift every gate logit down by one amount (bisection, to 1e-6) so that the expected FLOPs ratio is at most
    `target`, in place; the shift (0 where they are within it already)."""
    with torch.no_grad():
        if float(expected_ratio(cfg, effective_gates(logits))) <= target:
            return 0.0
        low, high = 0.0, 64.0
        while high - low > 1e-6:
            mid = (low + high) / 2
            if float(expected_ratio(cfg, effective_gates(logits - mid))) > target:
                low = mid
            else:
                high = mid
        logits -= high
        return high


def learn_gates(
    model_cfg: ModelConfig, data: EvalData, cfg: TrainConfig, budget_ratio: float, max_reuse: int
) -> LearnedGates:
    """Train the gates (module docstring): with the weights for cfg.steps steps on the training batches of seed
    cfg.seed, or frozen (cfg.steps 0) for FROZEN_STEPS steps over chunk cfg.seed of the held-out windows."""
    if not isinstance(data, TokenData):
        raise TypeError("gates are learned on token windows (an LM loss), not on task items")
    t0 = time.perf_counter()
    device = resolve_device(cfg.device)
    compute_dtype = torch.bfloat16 if resolve_dtype(cfg.dtype, device) == "bf16" else torch.float32
    frozen = cfg.steps == 0
    model = build_model(model_cfg, cfg.seed).to(device)
    logits = torch.full((model_cfg.n_layers, max_reuse - 1), GATE_START, device=device, requires_grad=True)
    gate_optimizer = torch.optim.Adam([logits], lr=GATE_LR)
    seq_len = model_cfg.seq_len
    if frozen:
        model.requires_grad_(False)
        windows = data.window_chunk(cfg.seed, cfg.eval_windows, seq_len)
        batches = itertools.cycle(list(data.window_batches(windows, seq_len, cfg.batch_size)))
        steps, optimizer = FROZEN_STEPS, None
    else:
        steps, optimizer = cfg.steps, build_optimizer(model, cfg, device)
    widest = float(expected_ratio(model_cfg, effective_gates(logits.detach())))

    def target(step: int) -> float:  # the budget's target after `step` steps
        return widest + (budget_ratio - widest) * min(1.0, step / max(1.0, ANNEAL_SHARE * steps))

    shift = 0.0
    for step in range(1, steps + 1):
        if optimizer is not None:
            set_lr(optimizer, step, cfg)
        for micro in range(1 if frozen else cfg.grad_accum):
            index = (step - 1) * cfg.grad_accum + micro
            x_np, y_np = next(batches) if frozen else data.train_batch(index, cfg.batch_size, seq_len, cfg.seed)
            x, y = torch.from_numpy(x_np).to(device), torch.from_numpy(y_np).to(device)
            gates = effective_gates(logits)
            with autocast_for(device, compute_dtype):
                loss = gated_loss(model, x, y, gates, compute_dtype, data.ignore_index)
            loss.div(1 if frozen else cfg.grad_accum).backward()
        if optimizer is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        gate_optimizer.step()
        gate_optimizer.zero_grad(set_to_none=True)
        shift += project_to(model_cfg, logits, target(step))
    with torch.no_grad():
        final = effective_gates(logits)
        ratio = float(expected_ratio(model_cfg, final))
    return LearnedGates(
        tuple(tuple(round(float(g), 6) for g in row) for row in final.cpu()),
        ratio,
        budget_ratio,
        shift,
        steps,
        time.perf_counter() - t0,
        frozen,
    )
