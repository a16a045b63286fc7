"""Analytic FLOP accounting and compute budgets.

Every matmul (m x k) @ (k x n) costs 2*m*n*k. Attention scores and values are counted as dense T x T
products, as torch's FlopCounterMode counts them; norms, activations and softmax are not counted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ilr_search.config import ModelConfig
from ilr_search.errors import UserInputError
from ilr_search.records import record_json

if TYPE_CHECKING:
    import torch


class BudgetError(UserInputError):
    """A budget that cannot be parsed or cannot be met."""


def branch_flops_per_token(cfg: ModelConfig) -> tuple[int, int]:
    """(attention, MLP) FLOPs per token of one pass of a layer's branch. Biases and the q/k norms are elementwise:
    not counted."""
    d, f, T = cfg.d_model, cfg.mlp_hidden, cfg.seq_len
    q, kv = cfg.n_heads * cfg.head_size, cfg.kv_heads * cfg.head_size  # query and key/value widths
    projections = 2 * d * (q + 2 * kv) + 2 * q * d  # qkv and output projection
    attention = 2 * 2 * T * q  # q k^T and (scores) v, per token, all query heads together
    mlp = 2 * d * 2 * f + 2 * f * d  # SwiGLU: gate and up, then down
    return projections + attention, mlp


def layer_flops_per_token(cfg: ModelConfig) -> float:
    """One pass of a whole layer."""
    return float(sum(branch_flops_per_token(cfg)))


def adapter_flops_per_token(cfg: ModelConfig) -> tuple[int, int]:
    """(attention's, MLP's) FLOPs per token of one pass's adapters (ModelConfig.adapter_rank): h A^T, then B, for
    each adapted matrix (model.adapter_shapes)."""
    each = {name: 2 * cfg.adapter_rank * (n_in + n_out) for name, (n_in, n_out) in cfg.adapter_shapes.items()}
    return each["qkv"] + each["proj"], each["gate_up"] + each["down"]


def head_flops_per_token(cfg: ModelConfig) -> float:
    return float(2 * cfg.d_model * cfg.vocab_size)


def attention_score_flops_per_token(cfg: ModelConfig) -> int:
    """The part of a pass's attention branch that grows with the sequence: q k^T and (scores) v at cfg.seq_len."""
    return 2 * 2 * cfg.seq_len * cfg.n_heads * cfg.head_size


def forward_flops_per_token(
    cfg: ModelConfig,
    schedule: Sequence[int],
    realised: Mapping[tuple[int, int], tuple[float, float]] | None = None,
) -> float:
    """Forward FLOPs per token of a sequence of cfg.seq_len tokens, LM head included: the branches each position
    runs (ModelConfig.parts), the adapters of a branch's passes after its first, and with capacity C below 1 the
    routed passes (model.routed_positions): each costs C times its projections and MLP, C^2
    times its attention scores (C T tokens attend over C T) and its router's 2 d_model on every token. That is the
    nominal cost (the budget's); `realised` gives each routed pass's measured factors instead ((layer, repeat) ->
    (fraction, attention factor), model.RouteCounts.factors)."""
    if cfg.capacity < 1:
        return routed_flops_per_token(cfg, schedule, realised or {})
    if not cfg.parts and not cfg.adapter_rank:
        return len(schedule) * layer_flops_per_token(cfg) + head_flops_per_token(cfg)
    from ilr_search.training.model import branch_passes

    branches, adapters = branch_flops_per_token(cfg), adapter_flops_per_token(cfg)
    total = 0
    for passes in branch_passes(cfg, schedule):
        for k, branch, adapter in zip(passes, branches, adapters, strict=True):
            total += 0 if k is None else branch + (adapter if k >= 1 else 0)
    return float(total) + head_flops_per_token(cfg)


def routed_flops_per_token(
    cfg: ModelConfig, schedule: Sequence[int], realised: Mapping[tuple[int, int], tuple[float, float]]
) -> float:
    """forward_flops_per_token of a model with capacity below 1."""
    from ilr_search.training.model import branch_passes, repeat_indices, routed_positions

    branches, adapters = branch_flops_per_token(cfg), adapter_flops_per_token(cfg)
    scores, router = attention_score_flops_per_token(cfg), 2 * cfg.d_model
    total = 0.0
    routed = routed_positions(cfg, schedule)
    for s, (layer, repeat, passes) in enumerate(
        zip(schedule, repeat_indices(schedule), branch_passes(cfg, schedule), strict=True)
    ):
        linear = sum(
            b + (a if k >= 1 else 0) for k, b, a in zip(passes, branches, adapters, strict=True) if k is not None
        )
        score = scores if passes[0] is not None else 0
        if not routed[s]:
            total += linear
            continue
        fraction, square = realised.get((layer, repeat), (cfg.capacity, cfg.capacity**2))
        total += fraction * (linear - score) + square * score + router
    return total + head_flops_per_token(cfg)


def baseline_flops_per_token(cfg: ModelConfig) -> float:
    return forward_flops_per_token(cfg, range(cfg.n_layers))


def param_count(cfg: ModelConfig) -> int:
    """ILRTransformer(cfg).num_params() (model.py), from its shapes without building the model or loading torch (the
    schedule never changes it): building the model, even on the meta device, would load torch
    (tests/test_model_flops.py checks the two agree)."""
    D, H = cfg.d_model, cfg.mlp_hidden
    q, kv = cfg.n_heads * cfg.head_size, cfg.kv_heads * cfg.head_size  # query and key/value widths
    layer = 2 * D + D * (q + 2 * kv) + q * D + 2 * D * H + H * D  # two RMSNorm gains, qkv, proj, gate_up, down
    layer += (q + 2 * kv) if cfg.qkv_bias else 0
    layer += 2 * cfg.head_size if cfg.qk_norm else 0  # the q and k norms' gains
    count = cfg.vocab_size * D + cfg.n_layers * layer + D  # embedding, the layers, the final norm
    count += 0 if cfg.tie_embeddings else cfg.vocab_size * D  # an LM head of its own
    count += cfg.seq_len * D if cfg.pe == "learned" else 0
    count += cfg.n_layers if cfg.injection == "gated" else 0
    count += cfg.max_reuse * D if cfg.iteration_encoding else 0
    count += cfg.n_layers * (cfg.max_reuse - 1) * 2 * D if cfg.iteration_norms and cfg.max_reuse > 1 else 0
    return count + cfg.n_layers * (cfg.max_reuse - 1) * cfg.adapter_params_per_pass + cfg.router_params


def map_param_count(cfg: ModelConfig, schedule: Sequence[int]) -> int:
    """The parameters a map uses: the model's, less the adapters and routers of passes its schedule never runs (the
    model holds max_reuse - 1 passes' adapters and routers for every layer; an exported checkpoint merges the used
    adapters into its copies)."""
    from ilr_search.training.model import branch_passes, routed_positions

    routers = sum(cfg.d_model for routed in routed_positions(cfg, schedule) if routed) if cfg.router_params else 0
    count = param_count(cfg) - cfg.router_params + routers
    if not cfg.adapter_rank:
        return count

    attn_each, mlp_each = (
        sum(cfg.adapter_rank * (n_in + n_out) for name, (n_in, n_out) in cfg.adapter_shapes.items() if name in names)
        for names in (("qkv", "proj"), ("gate_up", "down"))
    )
    used = sum(
        (attn_each if attn is not None and attn >= 1 else 0) + (mlp_each if mlp is not None and mlp >= 1 else 0)
        for attn, mlp in branch_passes(cfg, schedule)
    )
    return count - cfg.n_layers * (cfg.max_reuse - 1) * cfg.adapter_params_per_pass + used


def flops_ratio(cfg: ModelConfig, schedule: Sequence[int]) -> float:
    """Forward compute of a schedule relative to the plain model (every layer run once)."""
    return forward_flops_per_token(cfg, schedule) / baseline_flops_per_token(cfg)


def train_flops(cfg: ModelConfig, schedule: Sequence[int], tokens: int) -> float:
    """Training FLOPs: forward plus backward (twice the forward) over `tokens` tokens."""
    return 3.0 * forward_flops_per_token(cfg, schedule) * tokens


@dataclass(frozen=True)
class Budget:
    """A forward-compute budget, as a ratio to the plain model's and as FLOPs per token."""

    text: str
    ratio: float
    flops_per_token: float

    def allows(self, ratio: float) -> bool:
        return ratio <= self.ratio * (1 + 1e-9)

    def to_dict(self) -> dict[str, str | float]:
        """What a study stores of its budget (its configuration's `budget`, recipes' too): the text as given and the
        ratio; from_dict reads it back."""
        return {"text": self.text, "ratio": round(self.ratio, 9)}

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any], cfg: ModelConfig) -> Budget:
        """A stored budget (to_dict's) of a study of the model `cfg`."""
        ratio = float(stored["ratio"])
        return cls(str(stored["text"]), ratio, ratio * baseline_flops_per_token(cfg))

    def max_layer_runs(self, cfg: ModelConfig) -> int:
        """The largest schedule length (total layer runs) the budget pays for."""
        return int(math.floor(self.layer_runs(cfg) * (1 + 1e-9)))

    def layer_runs(self, cfg: ModelConfig) -> float:
        """The whole layer runs the budget pays for, as a fraction (a one-branch pass costs less than one)."""
        return (self.flops_per_token - head_flops_per_token(cfg)) / layer_flops_per_token(cfg)

    def pass_costs(self, cfg: ModelConfig) -> PassCosts:
        """What a map may spend beyond the plain model, in whole layer runs, and what each part's extra pass costs."""
        layer = layer_flops_per_token(cfg)
        adapters = adapter_flops_per_token(cfg)
        attn, mlp = (b + a for b, a in zip(branch_flops_per_token(cfg), adapters, strict=True))
        if cfg.capacity < 1:  # a routed pass (forward_flops_per_token): the router, C of the rest, C^2 of the scores
            c, score, router = cfg.capacity, attention_score_flops_per_token(cfg), 2 * cfg.d_model
            routed_attn, routed_mlp = c * (attn - score) + c * c * score, c * mlp
            costs = {"": routed_attn + routed_mlp + router, "a": routed_attn + router, "m": routed_mlp + router}
            return PassCosts(self.layer_runs(cfg), cfg.n_layers, {part: cost / layer for part, cost in costs.items()})
        return PassCosts(
            self.layer_runs(cfg), cfg.n_layers, {"": (attn + mlp) / layer, "a": attn / layer, "m": mlp / layer}
        )


@dataclass(frozen=True)
class PassCosts:
    """A budget in whole layer runs (`runs`, a fraction) for a model of `n_layers`, and the cost of one extra pass of
    each part (ModelConfig.parts: "" a whole layer, "a" its attention, "m" its MLP; with adapters, theirs too), in
    whole layer runs: what the search's budget repair spends (search/maps.py)."""

    runs: float
    n_layers: int
    part: Mapping[str, float]

    def spent(self, counts: Sequence[int], parts: Sequence[str]) -> float:
        """The layer runs of a map of these counts and parts (() for whole layers)."""
        return self.n_layers + sum((r - 1) * self.part[parts[i] if parts else ""] for i, r in enumerate(counts))

    def fits(self, counts: Sequence[int], parts: Sequence[str]) -> bool:
        return self.spent(counts, parts) <= self.runs * (1 + 1e-9)


_RATIO = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([xX%])\s*$")
_ABSOLUTE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*$")
# A bare number below this is surely a ratio with its `x` left out: no model costs under 100 FLOPs a token
# (the LM head alone is 2 * d_model * vocab_size), so it is refused with the ratio suggested, not read as FLOPs.
RATIO_LIKE_BELOW = 100.0


def parse_budget(text: str, cfg: ModelConfig) -> Budget:
    """`1.5x`, `150%` (of the plain model's compute) or an absolute forward FLOP count per token like `4.2e6`; a bare
    number under RATIO_LIKE_BELOW (`1.5`) is refused as a ratio missing its `x`."""
    base = baseline_flops_per_token(cfg)
    raw = "" if text is None else str(text)
    if m := _RATIO.match(raw):
        ratio = float(m.group(1)) / (100.0 if m.group(2) == "%" else 1.0)
        absolute = ratio * base
    elif m := _ABSOLUTE.match(raw):
        absolute = float(m.group(1))
        ratio = absolute / base
        if 0 < absolute < RATIO_LIKE_BELOW:
            raise BudgetError(
                f"budget {raw!r} is a bare number, which means forward FLOPs per token (the plain "
                f"model costs {base:.4g}); did you mean {raw.strip()}x? Write a ratio as 1.5x or 150%"
            )
    else:
        raise BudgetError(
            f"budget {raw!r} is not understood; write a ratio like 1.5x or 150%, or forward FLOPs per token like 4.2e6"
        )
    if not math.isfinite(ratio) or ratio <= 0:
        raise BudgetError(f"budget {raw!r} must be a positive, finite amount of compute")
    if ratio < 1 - 1e-9:
        raise BudgetError(
            f"budget {raw!r} ({absolute:.4g} FLOPs/token, {ratio:.3f}x) is below the plain model's "
            f"cost ({base:.4g} FLOPs/token, 1x); give at least 1x"
        )
    return Budget(text=raw.strip(), ratio=ratio, flops_per_token=absolute)


def count_flops(model: torch.nn.Module, *args: Any) -> int:
    """FLOPs torch's FlopCounterMode counts for one call of `model`, with CPU flash attention counted
    like the CUDA kernels are (dense T x T), which torch's registry leaves out."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_flash_flop(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    aten = torch.ops.aten
    mapping = (
        {aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash_flop}
        if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu")
        else {}
    )
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        model(*args)
    return counter.get_total_flops()


@dataclass(frozen=True)
class FlopsCount:
    """The compute of one schedule (describe): its reuse map and schedule, parameters, forward FLOPs per token
    beside the plain model's and their ratio, the training FLOPs over the run's tokens, and the block recurrence
    K where it is one. to_dict is the core of `ilr-search flops --json`."""

    reuse_map: tuple[int, ...]
    schedule: tuple[int, ...]
    params: int
    flops_per_token: float
    baseline_flops_per_token: float
    flops_ratio: float
    train_flops: float
    block: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return record_json(self, omit=() if self.block is not None else ("block",))


def describe(
    cfg: ModelConfig,
    reuse_map: Sequence[int],
    schedule: Sequence[int],
    tokens: int,
    params: int,
    block: int | None = None,
) -> FlopsCount:
    """The `ilr-search flops` count for one schedule."""
    return FlopsCount(
        tuple(reuse_map),
        tuple(schedule),
        params,
        forward_flops_per_token(cfg, schedule),
        baseline_flops_per_token(cfg),
        flops_ratio(cfg, schedule),
        train_flops(cfg, schedule, tokens),
        block,
    )
