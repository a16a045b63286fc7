"""A LLaMA-style decoder whose forward pass follows an execution schedule.

The schedule is a list of layer indices. The plain model runs [0, 1, ..., L-1]; intra-layer recurrence
with reuse map [2, 1, 1, 1] runs [0, 0, 1, 2, 3]; block recurrence K=2 runs [0, 1, 2, 3, 0, 1, 2, 3].
The parameters depend only on the architecture, never on the schedule. The model is member-batched: m members of
one architecture, each with its own weights and schedule, run at once. decoder_layer is the one decoder layer,
members_hidden the one forward pass, schedule_positions the recurrence (which layer each member runs at each
position, its repeat index, its branch factor) and before_run the knobs below. ILRTransformer runs them with m = 1,
the fused trainer (fused.py) with the K members of a group.

Recurrence knobs (all off by default) make a repeated layer behave differently at each pass. A layer's k-th
run in the schedule (k = 0, 1, ...; in [0, 0, 1] layer 0 runs with k = 0, then k = 1) gets, before it runs:
- injection "add": x += e at every k >= 1, where e is the embedding output (token, plus learned positions);
  "gated": x += g_l * e, with a learned scalar g_l per layer, starting at 0 (the plain model);
- iteration_encoding: x += E[k], a learned (max_reuse, d_model) table shared by the layers, starting at 0;
- iteration_norms: the layer's two RMSNorms use gains of their own for each k (k = 0 uses the layer's norms);
- init_depth D > 0: residual projections start with std 0.02 / sqrt(2 D) instead of 0.02 / sqrt(2 n_layers);
- repeat_scale, for a layer that runs r > 1 times in the schedule (r = 1 layers, so the all-ones baseline, are
  untouched by every setting):
  "residual": each of its passes adds its attention and MLP branches scaled by 1/r;
  "lr": its parameters (matrices and norm gains) train at lr / r (`parameter_lr_scales`; train.py's optimizer
  puts them in param groups of their own; AdamW's decoupled weight decay, lr * wd, shrinks with them);
- damping a in (0, 1]: every pass with k >= 1 (a repeat of a layer, or of a block's layers, after its first) adds
  its attention and MLP branches scaled by a; k = 0 is the plain layer, and a = 1 is the plain repeat.
"residual" and damping are one mechanism: a factor on both residual branches at each position of the schedule
(`branch_scales`), which an exported checkpoint carries as scaled copies of o_proj and down_proj.
Additions and gains are elementwise: the knobs add no matmul FLOPs.

capacity C in (0, 1] (Mixture-of-Recursions' expert-choice routing; 1: off, no routers): each routed position of the
schedule (routed_positions: a pass k >= 1 that runs no branch for the first time) runs only the tokens its router,
a d_model vector w per layer and pass, chooses; the others keep their stream. z = rmsnorm(x) . w on the stream x
before the pass, g = sigmoid(z) multiplies the chosen tokens' branches (times any branch factor), and the chosen
tokens, in position order, run decoder_layer as a sub-sequence at their own RoPE positions (routed_pass). Training
chooses the top ceil(C T) tokens of each sequence by z and adds ROUTER_AUX_WEIGHT times the BCE of z against that
choice to the loss; evaluation is causal: a token takes the pass iff z > 0 and fewer than ceil(C T) of its
sequence's earlier tokens took it, one sequence at a time, its realised counts kept (RouteCounts) for the realised
FLOPs. ALiBi and the fused trainer are refused with it.

Why repeat_scale. A repeated layer's shared weights W get the sum of their gradients over the r passes, and a
change of W moves the output through all r passes: with one learning rate for every map, a layer run r times
moves the function about r times as fast as a layer run once. Scaling its gradient alone would change nothing
(AdamW divides each gradient by its own running RMS, so it is invariant to a constant gradient scale), so the
knob scales what the update does instead. "lr" cuts the step in W by r. "residual" scales each pass's branch by
1/r (the depth-muP branch multiplier in the form that fits shared weights): the r passes together contribute on
the scale of one pass, and a step in W moves the output by r * (1/r) of one pass's move. 1/r rather than depth-muP's
1/sqrt(r): 1/sqrt(L) is derived for L independent branches, whose sum grows like sqrt(L); the r passes of one
layer share their weights and their branches are correlated, so their sum and their update grow like r.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.errors import UserInputError
from ilr_search.training.device import compile_backend, compiled_once
from ilr_search.training.loss import linear_cross_entropy


class Attention(nn.Module):
    """Causal self-attention's parameters: n_heads query heads of head_size sharing kv_heads key/value heads
    (grouped-query attention where fewer), optional q/k/v biases and per-head RMSNorms of q and k (applied before
    RoPE). decoder_layer runs them."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.q_dim, self.kv_dim = cfg.n_heads * cfg.head_size, cfg.kv_heads * cfg.head_size
        self.qkv = nn.Linear(cfg.d_model, self.q_dim + 2 * self.kv_dim, bias=cfg.qkv_bias)
        self.proj = nn.Linear(self.q_dim, cfg.d_model, bias=False)
        self.q_norm = nn.RMSNorm(cfg.head_size, eps=cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(cfg.head_size, eps=cfg.norm_eps) if cfg.qk_norm else nn.Identity()


# scaled_dot_product_attention's grouped-query attention without copying k and v (torch 2.5 and later)
SDPA_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor] | None,
    alibi: torch.Tensor | None,
) -> torch.Tensor:
    """Causal attention of queries q (N, n_heads, T, head_size) over keys and values k, v (N, kv_heads, T,
    head_size): RoPE on q and k where `rope` (rope_tables' cos, sin) is given, each key/value head serving
    n_heads / kv_heads query heads, then the ALiBi bias (which holds the causal mask) or the causal mask. Returns
    (N, T, n_heads * head_size), the heads side by side. decoder_layer calls it with N members x batch."""
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    n_heads, kv_heads = q.shape[1], k.shape[1]
    grouped: dict[str, Any] = {}
    if kv_heads != n_heads and SDPA_GQA:  # each key/value head serves its query heads in place
        grouped = {"enable_gqa": True}
    elif kv_heads != n_heads:
        k = k.repeat_interleave(n_heads // kv_heads, dim=1)
        v = v.repeat_interleave(n_heads // kv_heads, dim=1)
    if alibi is None:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **grouped)
    else:  # the ALiBi bias already holds the causal mask (-inf above the diagonal)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=alibi.to(q.dtype), **grouped)
    N, _, T, head_size = y.shape
    return y.transpose(1, 2).reshape(N, T, n_heads * head_size)


class SwiGLU(nn.Module):
    """The MLP's parameters: down(silu(gate) * up), gate and up from one matrix (decoder_layer runs them)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)


# The per-layer parameters decoder_layer takes, in its order (names as in DecoderLayer); a model without q/k/v
# biases or q/k norms has None in their places.
LAYER_WEIGHTS = (
    "attn_norm.weight",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.q_norm.weight",
    "attn.k_norm.weight",
    "attn.proj.weight",
    "mlp_norm.weight",
    "mlp.gate_up.weight",
    "mlp.down.weight",
)
# The matrices that take a pass's low-rank adapter (ModelConfig.adapter_rank), in order; after LAYER_WEIGHTS,
# decoder_layer's weights hold each one's (A, B) of the pass, or None where the pass has none.
ADAPTED = ("qkv", "proj", "gate_up", "down")


def member_rms_norm(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each member's h (m, B, T, D) with its gains w (m, D): nn.RMSNorm's kernel for one member."""
    D = h.shape[-1]
    return F.rms_norm(h, (D,), w[0], eps) if h.shape[0] == 1 else F.rms_norm(h, (D,), eps=eps) * w[:, None, None, :]


def decoder_layer(
    x: torch.Tensor,
    weights: tuple[torch.Tensor | None, ...],
    rope: tuple[torch.Tensor, torch.Tensor] | None,
    rope_rotation: RopeRotation | None,
    alibi: torch.Tensor | None,
    branch_scale: torch.Tensor | float | tuple[torch.Tensor | float, torch.Tensor | float] | None,
    n_heads: int,
    kv_heads: int,
    eps: float,
) -> torch.Tensor:
    """The decoder layer, for m members at once (m = 1: one model; fused.py: m stacked members, each with its own
    weights): x (m, B, T, D) -> x + a * attn(norm(x)), then + f * mlp(norm(x)), where a and f are `branch_scale`
    (a float, one factor (m, 1, 1, 1) per member, or None: 1; a pair where the two branches differ). A branch whose
    factor is the float 0.0 does not run (a one-branch pass: ModelConfig.parts).

    `weights`: each member's parameters (m, *shape) in LAYER_WEIGHTS order; rope_tables' (cos, sin) or None;
    `rope_rotation`, the same angles as rotation tables (RopeRotation), or None for apply_rope's real arithmetic;
    the ALiBi bias or None. A pure function of tensors and three constants, so that one compiled graph per shape
    serves every map and every group of a process (compiled_layer)."""

    attn_scale, mlp_scale = branch_scale if isinstance(branch_scale, tuple) else (branch_scale, branch_scale)

    def branch(y: torch.Tensor, scale: torch.Tensor | float | None) -> torch.Tensor:
        return y if scale is None else y * scale

    mlp_norm, gate_up_w, down_w = weights[6:9]
    assert mlp_norm is not None and gate_up_w is not None and down_w is not None  # the layer's own parameters
    gate_up_ab, down_ab = adapter_pairs(weights, 2), adapter_pairs(weights, 3)
    m, B, T, D = x.shape
    if not isinstance(attn_scale, float) or attn_scale != 0.0:
        x = x + branch(attention_branch(x, weights, rope, rope_rotation, alibi, n_heads, kv_heads, eps), attn_scale)
    if isinstance(mlp_scale, float) and mlp_scale == 0.0:
        return x
    h = member_rms_norm(x, mlp_norm, eps)
    gate, up = member_linear(h.reshape(m, B * T, D), gate_up_w, gate_up_ab).chunk(2, -1)
    return x + branch(member_linear(F.silu(gate) * up, down_w, down_ab).view(m, B, T, D), mlp_scale)


def member_linear(
    h: torch.Tensor, w: torch.Tensor, adapter: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """Each member's h (m, N, in) times its w^T (m, out, in), plus the low-rank h A^T B^T of `adapter` (A (m, rank,
    in), B (m, out, rank)) where given: one member takes the plain kernel (nn.Linear's, as fast as it is); several,
    a batched one."""
    if h.shape[0] == 1:
        y = F.linear(h[0], w[0])[None]
    else:
        y = torch.bmm(h, w.transpose(1, 2))
    if adapter is not None:
        a, b = adapter
        y = y + member_linear(member_linear(h, a), b)
    return y


def adapter_pairs(weights: tuple[torch.Tensor | None, ...], i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (A, B) of adapted matrix ADAPTED[i] in a layer's weights, or None where the pass has none."""
    a_at = len(LAYER_WEIGHTS) + 2 * i
    if len(weights) <= a_at or weights[a_at] is None:
        return None
    a, b = weights[a_at], weights[a_at + 1]
    assert a is not None and b is not None
    return a, b


def attention_branch(
    x: torch.Tensor,
    weights: tuple[torch.Tensor | None, ...],
    rope: tuple[torch.Tensor, torch.Tensor] | None,
    rope_rotation: RopeRotation | None,
    alibi: torch.Tensor | None,
    n_heads: int,
    kv_heads: int,
    eps: float,
) -> torch.Tensor:
    """decoder_layer's attention branch, attn(norm(x)) (m, B, T, D), before its factor."""
    linear = member_linear

    def head_norm(t: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:  # per-head RMSNorm (q_norm, k_norm)
        if w is None:
            return t
        heads, head_size = t.shape[1], t.shape[-1]
        normed = F.rms_norm(t, (head_size,), eps=eps).view(m, B, heads, T, head_size) * w[:, None, None, None, :]
        return normed.view(m * B, heads, T, head_size)

    attn_norm, qkv_w, qkv_b, q_norm, k_norm, proj_w = weights[:6]
    assert attn_norm is not None and qkv_w is not None and proj_w is not None  # the layer's own parameters
    m, B, T, D = x.shape
    head_size = qkv_w.shape[1] // (n_heads + 2 * kv_heads)
    h = member_rms_norm(x, attn_norm, eps)
    qkv = linear(h.reshape(m, B * T, D), qkv_w, adapter_pairs(weights, 0))
    if qkv_b is not None:
        qkv = qkv + qkv_b[:, None, :]
    q_dim, kv_dim = n_heads * head_size, kv_heads * head_size
    if rope_rotation is not None and q_norm is None and k_norm is None:
        cos2, sin2, rotation = rope_rotation
        if rotation is not None and kv_heads == n_heads and qkv.dtype == torch.float32:
            # the fused groups' rotation of each (even, odd) pair as one complex product, q and k together
            qkv = qkv.view(m * B, T, 3, n_heads, head_size)
            pairs = torch.view_as_complex(qkv[:, :, :2].unflatten(-1, (-1, 2)))
            qk = torch.view_as_real(pairs * rotation).flatten(-2)
            q, k, v = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
        else:  # apply_rope's arithmetic on q and k together, where the matmul wrote them (rotate_pairs)
            qk = rotate_pairs(qkv[..., : q_dim + kv_dim].reshape(m * B, T, n_heads + kv_heads, head_size), cos2, sin2)
            q, k = qk[:, :, :n_heads].transpose(1, 2), qk[:, :, n_heads:].transpose(1, 2)
            v = qkv[..., q_dim + kv_dim :].reshape(m * B, T, kv_heads, head_size).transpose(1, 2)
        rope = None  # applied here
    elif kv_heads == n_heads:
        q, k, v = qkv.view(m * B, T, 3, n_heads, head_size).permute(2, 0, 3, 1, 4)
    else:
        q, k, v = (
            t.reshape(m * B, T, -1, head_size).transpose(1, 2) for t in qkv.split((q_dim, kv_dim, kv_dim), dim=-1)
        )
    q, k = head_norm(q, q_norm), head_norm(k, k_norm)
    y = attend(q, k, v, rope, alibi)  # the m x B sequences in one call
    return linear(y.reshape(m, B * T, -1), proj_w, adapter_pairs(weights, 1)).view(m, B, T, D)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.kv_heads, self.eps = cfg.n_heads, cfg.kv_heads, cfg.norm_eps
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)
        # each pass k >= 1 of a branch (up to max_reuse - 1) has its own A (rank, in) and B (out, rank) per matrix
        passes, rank = cfg.max_reuse - 1, cfg.adapter_rank
        self.adapters = (
            nn.ParameterDict(
                {
                    f"{name}_{ab}": nn.Parameter(torch.empty(passes, *((rank, n_in) if ab == "a" else (n_out, rank))))
                    for name, (n_in, n_out) in cfg.adapter_shapes.items()
                    for ab in "ab"
                }
            )
            if rank and passes
            else None
        )

    def weights(self, attn_pass: int = 0, mlp_pass: int = 0) -> tuple[torch.Tensor | None, ...]:
        """The layer's parameters in LAYER_WEIGHTS order, each with a member axis of one (views), then the (A, B)
        adapters (ADAPTED) of the attention branch's pass `attn_pass` and the MLP's `mlp_pass` where a pass >= 1
        has them."""
        q_norm, k_norm = self.attn.q_norm, self.attn.k_norm
        weights = (
            self.attn_norm.weight,
            self.attn.qkv.weight,
            self.attn.qkv.bias,
            q_norm.weight if isinstance(q_norm, nn.RMSNorm) else None,
            k_norm.weight if isinstance(k_norm, nn.RMSNorm) else None,
            self.attn.proj.weight,
            self.mlp_norm.weight,
            self.mlp.gate_up.weight,
            self.mlp.down.weight,
        )
        if self.adapters is not None and (attn_pass or mlp_pass):
            for name, k in zip(ADAPTED, (attn_pass, attn_pass, mlp_pass, mlp_pass), strict=True):
                a, b = self.adapters[f"{name}_a"], self.adapters[f"{name}_b"]
                weights += (a[k - 1], b[k - 1]) if k else (None, None)
        return tuple(None if w is None else w[None] for w in weights)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        alibi: torch.Tensor | None = None,
        branch_scale: float | None = None,
    ) -> torch.Tensor:
        """decoder_layer for this one layer: x (B, T, D); both residual branches times `branch_scale` (None: 1)."""
        args = (rope, None, alibi, branch_scale, self.n_heads, self.kv_heads, self.eps)
        return decoder_layer(x[None], self.weights(), *args)[0]


def rope_tables(T: int, head_size: int, base: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, device=device, dtype=torch.float32) / head_size)
    angles = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)  # (T, head_size/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Rotate each (even, odd) pair of the head dimension by a position-dependent angle.
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return rotated.to(x.dtype)


def rotate_pairs(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """apply_rope of x (..., T, heads, head_size) in x's layout, from rope_rotation's (cos2, sin2) (T, 1, head_size):
    x cos2 + (x with each pair swapped) sin2 in fp32, in x's dtype. Each part has apply_rope's value to the bit: the
    even one x1 cos + x2 (-sin) = x1 cos - x2 sin (a negated product is exact, and so is adding it), the odd one
    x2 cos + x1 sin = x1 sin + x2 cos. Four elementwise passes over q and k together instead of seven each over q and
    over k (and a stack), and the result keeps x's (T, heads) order."""
    xf = x.float()
    swapped = xf.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (xf * cos2 + swapped * sin2).to(x.dtype)


# rope_rotation: (cos2, sin2), each (T, 1, head_size), the cosine of each pair's angle at both its places and the sine
# negated at the even place (rotate_pairs), and the complex form cos + i sin (T, 1, 1, pairs) where the fused groups
# rotate with it (else None).
RopeRotation = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def rope_rotation(rope: tuple[torch.Tensor, torch.Tensor], complex_rotation: bool) -> RopeRotation:
    cos, sin = rope
    T = cos.shape[0]
    cos2 = cos.repeat_interleave(2, dim=-1).view(T, 1, -1)
    sin2 = torch.stack((-sin, sin), dim=-1).flatten(-2).view(T, 1, -1)
    return cos2, sin2, torch.complex(cos, sin).view(T, 1, 1, -1) if complex_rotation else None


def alibi_slopes(n_heads: int) -> torch.Tensor:
    # Geometric slopes 2^(-8/n), 2^(-16/n), ... (Press et al., 2022), for any number of heads.
    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = [2 ** (-8 * (i + 1) / closest) for i in range(closest)]
    if closest < n_heads:
        extra = [2 ** (-4 * (2 * i + 1) / closest) for i in range(n_heads - closest)]
        slopes += extra
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, T: int, device: torch.device) -> torch.Tensor:
    pos = torch.arange(T, device=device)
    distance = (pos[None, :] - pos[:, None]).float()  # j - i, <= 0 on and below the diagonal
    bias = alibi_slopes(n_heads).to(device)[:, None, None] * distance
    return bias.masked_fill(distance > 0, float("-inf"))  # (heads, T, T)


# The factors on one position's residual branches: one for both (None: 1), or (attention, MLP) where they differ; a
# factor of 0.0 is a branch that does not run (a one-branch pass of ModelConfig.parts).
BranchScale = float | tuple[float, float] | None
# A position's factors as decoder_layer takes them: a member's BranchScale, or per-member tensors (running, 1, 1, 1)
PositionScale = torch.Tensor | float | tuple[torch.Tensor, torch.Tensor] | tuple[float, float] | None


@dataclass(frozen=True)
class Position:
    """One position of the members' schedules (members in order of schedule length, longest first): the first
    len(layers) members run it, member k its layer layers[k] for the (repeats[k] + 1)-th time, the residual branches
    times `scale` (a float for one member, (running, 1, 1, 1) factors for several; None: 1). Under "where" masking,
    `active` (members, 1, 1, 1) marks the members whose schedule reaches the position: every member runs it, and
    the others keep their stream. `index` (a fused group's): (member, layer, repeat) of each running member as a
    (3, running) tensor on its device, for the knobs' lookups; None: Python indices."""

    layers: list[int]
    repeats: list[int]
    scale: PositionScale
    active: torch.Tensor | None = None
    index: torch.Tensor | None = None


def schedule_positions(
    cfg: ModelConfig,
    schedules: Sequence[Sequence[int]],
    scales: Sequence[Sequence[PositionScale]] | None = None,
    device: torch.device | None = None,
    compiled: bool = False,
    masking: str = "prefix",
) -> list[Position]:
    """The recurrence: what runs at each position of the members' `schedules` (longest first), each member's
    residual branches times its factors in `scales` (branch_scales of `cfg` where not given).

    With no `device` (one member) a factor is a Python float. On a `device` (a fused group) the factors are
    tensors, None where no member's branches are scaled; `compiled`, ones there too if `cfg` scales any pass, so
    that every schedule takes the same graphs. `masking` "where": every member runs every position (a member past
    its schedule's end runs layer 0, its result discarded); "prefix": the members whose schedule reaches it."""
    if any(len(a) < len(b) for a, b in zip(schedules, schedules[1:], strict=False)):
        raise ValueError("members must be ordered by schedule length, longest first")
    scales = [branch_scales(cfg, s) for s in schedules] if scales is None else scales
    repeats = [repeat_indices(s) for s in schedules]
    for schedule, counts in zip(schedules, repeats, strict=True):
        for layer_index, repeat in zip(schedule, counts, strict=True):
            if repeat >= cfg.max_reuse and (cfg.iteration_encoding or cfg.iteration_norms or cfg.capacity < 1):
                raise ValueError(
                    f"layer {layer_index} runs {repeat + 1} times, more than max_reuse {cfg.max_reuse} "
                    "that the iteration knobs and routers cover"
                )
    always_scaled = compiled and (cfg.repeat_scale == "residual" or cfg.damping != 1.0)
    positions = []
    for s in range(len(schedules[0]) if schedules else 0):
        reached = [len(schedule) > s for schedule in schedules]
        members = range(len(schedules) if masking == "where" else sum(reached))
        factors = [scales[k][s] if reached[k] else None for k in members]
        scale: PositionScale
        if device is None:
            (scale,) = factors
        elif all(f is None for f in factors) and not always_scaled:
            scale = None
        elif any(isinstance(f, tuple) for f in factors):  # one-branch passes: a factor per branch, 0 where off
            pairs = [f if isinstance(f, tuple) else (1.0 if f is None else f,) * 2 for f in factors]
            attn, mlp = (torch.tensor(list(c), device=device).view(-1, 1, 1, 1) for c in zip(*pairs, strict=True))
            scale = (attn, mlp)
        else:
            scale = torch.tensor([1.0 if f is None else f for f in factors], device=device).view(-1, 1, 1, 1)
        layers = [schedules[k][s] if reached[k] else 0 for k in members]
        counts = [repeats[k][s] if reached[k] else 0 for k in members]
        active = torch.tensor(reached, device=device).view(-1, 1, 1, 1) if masking == "where" else None
        index = None if device is None else torch.tensor([list(members), layers, counts], device=device)
        positions.append(Position(layers, counts, scale, active, index))
    return positions


# What the layers need of the token positions (position_tables): rope_tables' (cos, sin), the same angles as
# decoder_layer's rotation tables (RopeRotation; None: apply_rope's real arithmetic), the ALiBi bias; None where the
# model has none.
PositionTables = tuple[tuple[torch.Tensor, torch.Tensor] | None, RopeRotation | None, torch.Tensor | None]


def position_tables(
    cfg: ModelConfig, T: int, device: torch.device, rotation: bool = False, complex_rotation: bool = False
) -> PositionTables:
    """The tables for T token positions; `rotation`: with decoder_layer's rotation tables (uncompiled);
    `complex_rotation`: with the complex form too (the fused groups')."""
    rope = rope_tables(T, cfg.head_size, cfg.rope_base, device) if cfg.pe == "rope" else None
    rotation_tables = rope_rotation(rope, complex_rotation) if rope is not None and rotation else None
    return rope, rotation_tables, alibi_bias(cfg.n_heads, T, device) if cfg.pe == "alibi" else None


# The weights of the members that run a schedule position (s, position), (running, *shape) in LAYER_WEIGHTS order
LayerWeights = Callable[[int, Position], tuple[torch.Tensor | None, ...]]


def before_run(
    cfg: ModelConfig,
    x: torch.Tensor,
    embedded: torch.Tensor,
    weights: tuple[torch.Tensor | None, ...],
    params: Mapping[str, torch.Tensor],
    position: Position,
) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
    """The recurrence knobs (module docstring) before the running members' layers at `position`: their stream x
    (running, B, T, D) with the injection and the iteration encoding added, and their layer weights with the
    repeat's norm gains."""
    m = x.shape[0]
    again = [repeat >= 1 for repeat in position.repeats]
    # each member's index, layer and repeat index: Python ints for one member, else (running,) tensors
    index: Any = (0, position.layers[0], position.repeats[0]) if position.index is None else position.index
    member, layer, repeat = index
    previous = max(repeat - 1, 0) if position.index is None else (repeat - 1).clamp(min=0)

    def entries(t: torch.Tensor, *indices: Any) -> torch.Tensor:  # each member's t[member, *indices]: (m, ...)
        found = t[(member,) + indices]
        return found if position.index is not None else found[None]

    if cfg.injection != "none" and any(again):
        e = embedded[:m]
        if cfg.injection == "gated":
            e = entries(params["injection_gates"], layer).view(m, 1, 1, 1) * e
        if not all(again):
            e = e * (repeat >= 1).to(e.dtype).view(m, 1, 1, 1)
        x = x + e
    if "iteration_embed" in params:
        x = x + entries(params["iteration_embed"], repeat)[:, None, None, :]
    if "iteration_norm_gains" in params and any(again):
        gains = entries(params["iteration_norm_gains"], layer, previous)  # (m, 2, D)
        attn_gain, mlp_gain = gains[:, 0], gains[:, 1]
        if not all(again):  # a member's first run of its layer keeps the layer's own gains
            mask = (repeat >= 1).view(m, 1)
            own_attn, own_mlp = weights[0], weights[6]
            assert own_attn is not None and own_mlp is not None  # every layer has its two norms
            attn_gain, mlp_gain = torch.where(mask, attn_gain, own_attn), torch.where(mask, mlp_gain, own_mlp)
        weights = (attn_gain, *weights[1:6], mlp_gain, *weights[7:])
    return x, weights


# The weight of the routers' auxiliary loss (Routing.aux) in the training loss: BCE of each routed pass's logits
# against its top-k selection, which teaches the causal decision z > 0 that evaluation takes.
ROUTER_AUX_WEIGHT = 0.1


@dataclass
class RouteCounts:
    """What evaluation's routed passes ran, per (layer, repeat index): tokens that took the pass, the sum over
    sequences of their count squared (the attention's cost), and tokens seen."""

    taken: dict[tuple[int, int], int] = field(default_factory=dict)
    squares: dict[tuple[int, int], int] = field(default_factory=dict)
    seen: dict[tuple[int, int], int] = field(default_factory=dict)

    def add(self, key: tuple[int, int], counts: Sequence[int], T: int) -> None:
        self.taken[key] = self.taken.get(key, 0) + sum(counts)
        self.squares[key] = self.squares.get(key, 0) + sum(n * n for n in counts)
        self.seen[key] = self.seen.get(key, 0) + T * len(counts)

    def clear(self) -> None:
        self.taken.clear()
        self.squares.clear()
        self.seen.clear()

    def fractions(self) -> dict[tuple[int, int], float]:
        """The realised fraction of tokens that took each routed pass."""
        return {key: self.taken[key] / self.seen[key] for key in sorted(self.seen) if self.seen[key]}

    def factors(self, seq_len: int) -> dict[tuple[int, int], tuple[float, float]]:
        """Per routed pass, the factors on its per-token cost at seq_len (flops.forward_flops_per_token's
        `realised`): on the projections and MLP the fraction taken, on the attention scores sum(n^2) / (seq_len
        * tokens seen), exact where the sequences were seq_len long."""
        return {
            key: (self.taken[key] / self.seen[key], self.squares[key] / (seq_len * self.seen[key]))
            for key in sorted(self.seen)
            if self.seen[key]
        }


@dataclass
class Routing:
    """How one forward pass routes (ILRTransformer.routing): `training` picks expert choice, else the causal
    decision, at `positions`; `hold`, g = 1 and every router says yes (the capacity alone chooses: a check of the
    routed step); `aux` receives the training's auxiliary losses, `counts` evaluation's realised counts."""

    capacity: float
    training: bool
    positions: frozenset[int]  # the schedule positions it routes (routed_positions)
    hold: bool = False
    aux: list[torch.Tensor] = field(default_factory=list)
    counts: RouteCounts | None = None


def gated_scale(
    scale: PositionScale, gate: torch.Tensor
) -> torch.Tensor | float | tuple[torch.Tensor | float, torch.Tensor | float]:
    """A position's branch factors times the per-token gate (1, B, k, 1); a branch that does not run (0.0) stays
    off."""
    if isinstance(scale, tuple):
        attn, mlp = (f if isinstance(f, float) and f == 0.0 else gate * f for f in scale)
        return attn, mlp
    return gate if scale is None else gate * scale


def gathered_tables(tables: PositionTables, idx: torch.Tensor) -> PositionTables:
    """The position tables of the tokens at positions idx (B, k), per sequence: RoPE's rows of their positions
    (B, 1, k, pairs) and the rotation tables' rows, broadcasting over the heads. ALiBi is refused with capacity
    (ModelConfig)."""
    rope, rotation, alibi = tables
    assert alibi is None  # ModelConfig refuses capacity with ALiBi
    rope = None if rope is None else (rope[0][idx][:, None], rope[1][idx][:, None])
    if rotation is not None:  # rope_rotation's (cos2, sin2) rows (B, k, 1, head_size); the complex form's likewise
        cos2, sin2, complex_form = rotation
        gathered = None if complex_form is None else complex_form.squeeze(1).squeeze(1)[idx][:, :, None, None]
        rotation = (cos2[idx], sin2[idx], gathered)
    return rope, rotation, None


def routed_pass(
    cfg: ModelConfig,
    x: torch.Tensor,
    h: torch.Tensor,
    weights: tuple[torch.Tensor | None, ...],
    tables: PositionTables,
    layer_fn: Callable[..., torch.Tensor],
    position: Position,
    routers: torch.Tensor,
    routing: Routing,
) -> torch.Tensor:
    """One routed pass (capacity C below 1) of one member: x (1, B, T, D) the stream before it, h the stream with
    the knobs added (before_run). The router of (layer, repeat) is a vector w: z = rmsnorm(x) . w (no gain), gate g
    = sigmoid(z). The chosen tokens, in position order, run decoder_layer as a sub-sequence at their own positions
    (causal by position, as the order is kept), each branch times g; the others keep x.

    Training: the top ceil(C T) tokens of each sequence by z (expert choice), and the auxiliary BCE of z against
    that choice into routing.aux. Evaluation: causal, token by token: a token takes the pass iff z > 0 and fewer
    than ceil(C T) tokens of its sequence before it took it, so at most a fraction C do; one sequence at a time,
    so that FLOPs are the realised ones, counted into routing.counts."""
    layer, repeat = position.layers[0], position.repeats[0]
    _, B, T, D = x.shape
    w = routers[layer, repeat - 1]
    z = F.linear(F.rms_norm(x[0], (D,), eps=cfg.norm_eps), w[None])[..., 0]  # (B, T)
    gate = torch.ones_like(z) if routing.hold else torch.sigmoid(z)
    cap = math.ceil(routing.capacity * T)
    args = (cfg.n_heads, cfg.kv_heads, cfg.norm_eps)
    if routing.training:
        idx = (torch.zeros_like(z) if routing.hold else z).topk(cap, dim=1).indices.sort(dim=1).values  # (B, k)
        chosen = torch.zeros_like(z).scatter(1, idx, 1.0)
        routing.aux.append(F.binary_cross_entropy_with_logits(z, chosen))
        rows = idx[..., None].expand(-1, -1, D)
        sub = h[0].gather(1, rows)[None]
        scale = gated_scale(position.scale, gate.gather(1, idx)[None, :, :, None])
        out = layer_fn(sub, weights, *gathered_tables(tables, idx), scale, *args)
        return x[0].scatter(1, rows, out[0])[None]
    yes = torch.ones_like(z, dtype=torch.bool) if routing.hold else z > 0
    before = yes.cumsum(1) - yes.long()  # how many before each token said yes
    admitted = yes & (before < cap)
    counts = admitted.sum(1).tolist()
    if routing.counts is not None:
        routing.counts.add((layer, repeat), counts, T)
    x = x.clone()
    for b, n in enumerate(counts):
        if not n:
            continue
        idx = admitted[b].nonzero()[:, 0][None]  # (1, n)
        scale = gated_scale(position.scale, gate[b, idx[0]].view(1, 1, n, 1))
        out = layer_fn(h[:, b : b + 1, idx[0]], weights, *gathered_tables(tables, idx), scale, *args)
        x[0, b, idx[0]] = out[0, 0]
    return x


def members_hidden(
    cfg: ModelConfig,
    tokens: torch.Tensor,
    params: Mapping[str, torch.Tensor],
    layer: LayerWeights,
    positions: Sequence[Position],
    tables: PositionTables,
    layer_fn: Callable[..., torch.Tensor] = decoder_layer,
    start: int = 0,
    state: torch.Tensor | None = None,
    states: list[torch.Tensor] | None = None,
    routing: Routing | None = None,
) -> torch.Tensor:
    """The forward pass: final normalised hidden states (m, B, T, d_model) of m members for their token ids
    (m, B, T). The embedding, then at each schedule position (schedule_positions) the knobs (before_run) and the
    layer of each member that runs it, then the final norm.

    `params`: the members' parameters outside the layers, by ILRTransformer's names, each with a leading member
    axis; `layer`: their layers' weights at each position. `state` (with `start` > 0): the residual stream after
    the first `start` positions, computed elsewhere (frozen.py's shared prefix); the layers run from position
    `start` on. `states`, where given, receives the residual stream after each position that runs. `routing` (one
    member, capacity below 1): its positions are routed passes (routed_pass)."""
    m, B, T = tokens.shape
    if T > cfg.seq_len:
        raise ValueError(f"sequence of {T} tokens is longer than seq_len {cfg.seq_len}")
    V, D = params["embed.weight"].shape[1:]
    if m > 1:  # member k's ids index its own rows of the members' embeddings, side by side
        tokens = tokens + torch.arange(m, device=tokens.device).view(m, 1, 1) * V
    x = F.embedding(tokens, params["embed.weight"].reshape(m * V, D))
    if "pos_embed.weight" in params:
        x = x + params["pos_embed.weight"][:, None, :T]
    embedded = x
    # The stream starts as a view of the embedding: the embedding's gradient is then the first layer's (summed in
    # the view) plus the injections', one rounding whatever the number of the layer's uses.
    x = embedded.view_as(embedded) if state is None else state
    for s, position in enumerate(positions):
        if s < start:
            continue
        running = len(position.layers)
        h, weights = before_run(cfg, x[:running] if running < m else x, embedded, layer(s, position), params, position)
        if routing is not None and s in routing.positions:  # one member: the tokens its routers choose
            x = routed_pass(cfg, x, h, weights, tables, layer_fn, position, params["routers"][0], routing)
            if states is not None:
                states.append(x)
            continue
        h = layer_fn(h, weights, *tables, position.scale, cfg.n_heads, cfg.kv_heads, cfg.norm_eps)
        if position.active is not None:
            x = torch.where(position.active, h, x)
        elif running < m:
            x = torch.cat((h, x[running:]))
        else:
            x = h
        if states is not None:
            states.append(x)
    return member_rms_norm(x, params["norm.weight"], cfg.norm_eps)


# Dynamo's cache entries per code object before it gives up compiling and runs decoder_layer eagerly: one entry
# per shape (members running at a position, 1..K; a shorter last validation batch), grad mode and autocast
# dtype, so K = 16 in training and evaluation alone needs 32 (torch's default limit is 8).
LAYER_RECOMPILE_LIMIT = 128


def model_layer(*args: Any) -> torch.Tensor:
    """decoder_layer under a code object of its own, which ILRTransformer.compile_layers compiles: a model's branch
    factors are Python floats, which dynamo compiles as constants and, at a second value, as symbolic floats
    (automatic dynamic shapes); its graphs stay apart from the fused groups' static ones (compiled_layer)."""
    return decoder_layer(*args)


def compiled_layer() -> Callable[..., torch.Tensor]:
    """decoder_layer compiled once per process (device.compiled_once), with static shapes: every fused group, of any
    maps, reuses the graph of each shape it has seen (a schedule's layer indices and its
    members' running counts stay on the Python side, outside the graph)."""
    return compiled_once(decoder_layer, LAYER_RECOMPILE_LIMIT)


# Building a model draws its initial weights from torch's one global generator. Lanes (training/jobs.py) build
# models in several threads: a seeded build (train.build_model) holds this lock from the seeding to its last
# weight, and every other build waits for it, so no thread draws from a generator that another has seeded.
GLOBAL_RNG = threading.RLock()


class ILRTransformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        with GLOBAL_RNG:
            self._build(cfg)

    def _build(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.pe == "learned" else None
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        # Knob parameters (see the module docstring); none exist when the knobs are off.
        self.injection_gates = nn.Parameter(torch.zeros(cfg.n_layers)) if cfg.injection == "gated" else None
        self.iteration_embed = nn.Parameter(torch.zeros(cfg.max_reuse, cfg.d_model)) if cfg.iteration_encoding else None
        # (layer, repeat - 1, attention/MLP, d_model): repeat 0 uses the layer's own norms
        self.iteration_norm_gains = (
            nn.Parameter(torch.ones(cfg.n_layers, cfg.max_reuse - 1, 2, cfg.d_model))
            if cfg.iteration_norms and cfg.max_reuse > 1
            else None
        )
        # the LM head: the embedding (tied), or a matrix of its own
        self.lm_head = None if cfg.tie_embeddings else nn.Parameter(torch.empty(cfg.vocab_size, cfg.d_model))
        # capacity below 1: a router per layer and pass k >= 1 (routed_pass), and evaluation's realised counts
        self.routers = (
            nn.Parameter(torch.empty(cfg.n_layers, cfg.max_reuse - 1, cfg.d_model)) if cfg.router_params else None
        )
        self.route_counts = RouteCounts()
        self.hold_routers = False  # Routing.hold: g = 1 and every router says yes
        self.layer_fn: Callable[..., torch.Tensor] = decoder_layer  # compile_layers: compiled_layer
        self.reset_parameters()

    def reset_parameters(self) -> None:
        residual_std = 0.02 / math.sqrt(2 * (self.cfg.init_depth or self.cfg.n_layers))
        adapters = {name: p for name, p in self.named_parameters() if ".adapters." in name}
        for name, p in self.named_parameters():
            if name in adapters or name == "routers":
                continue
            if name == "injection_gates" or name == "iteration_embed" or name.endswith(".bias"):
                nn.init.zeros_(p)
            elif name == "iteration_norm_gains" or p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=0.02)
        # after every other weight, so that a model with adapters starts where the same seed's model without them does
        for name, p in adapters.items():
            nn.init.zeros_(p) if name.endswith("_b") else nn.init.normal_(p, std=0.02)
        if self.routers is not None:  # last: the other weights are the same seed's model's without routers
            nn.init.normal_(self.routers, std=0.02)

    def routing(self, schedule: Sequence[int] | None) -> Routing | None:
        """How this model's forward pass of `schedule` (None: the plain one) routes now (training or evaluation
        mode); None without routers."""
        if self.routers is None:
            return None
        routed = routed_positions(self.cfg, list(range(self.cfg.n_layers)) if schedule is None else schedule)
        positions = frozenset(s for s, r in enumerate(routed) if r)
        counts = None if self.training else self.route_counts
        return Routing(self.cfg.capacity, self.training, positions, self.hold_routers, counts=counts)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def compile_layers(self) -> None:
        """Run the layers compiled (model_layer through torch.compile and device.compile_backend): any schedule
        reuses the graphs."""
        self.layer_fn = torch.compile(model_layer, backend=compile_backend())

    def member_params(self) -> dict[str, torch.Tensor]:
        """The parameters outside the layers, as members_hidden reads them: a member axis of one (views)."""
        named = {"embed.weight": self.embed.weight, "norm.weight": self.norm.weight}
        if self.pos_embed is not None:
            named["pos_embed.weight"] = self.pos_embed.weight
        return {name: p[None] for name, p in (named | dict(self.named_parameters(recurse=False))).items()}

    def layer_weights(self, s: int, position: Position) -> tuple[torch.Tensor | None, ...]:
        """members_hidden's LayerWeights: the weights of the layer that runs schedule position s."""
        from ilr_search.training.schedule import branch_pass

        layer, repeat = position.layers[0], position.repeats[0]
        passes = branch_pass(self.cfg.parts[layer], repeat) if self.cfg.parts else (repeat, repeat)
        return cast(DecoderLayer, self.layers[layer]).weights(*passes)

    def hidden(
        self,
        idx: torch.Tensor,
        schedule: Sequence[int] | None = None,
        scales: Sequence[PositionScale] | None = None,
        start: int = 0,
        state: torch.Tensor | None = None,
        states: list[torch.Tensor] | None = None,
        routing: Routing | None = None,
    ) -> torch.Tensor:
        """members_hidden of this one model: final normalised hidden states (B, T, d_model) for token ids (B, T),
        running the layers in `schedule` order, each position's residual branches times its factor in `scales`
        (branch_scales of the model's config where not given; a 0-dim tensor is a factor too: learned.py's gates);
        `start`, `state` and `states` as there, without the member axis; `routing` (self.routing(schedule) where not
        given) where the model has routers."""
        schedule = list(range(self.cfg.n_layers)) if schedule is None else list(schedule)
        positions = schedule_positions(self.cfg, [schedule], None if scales is None else [scales])
        # uncompiled, RoPE by rotate_pairs; compiled (compile_layers), apply_rope's real arithmetic, which dynamo fuses
        tables = position_tables(self.cfg, idx.shape[1], idx.device, rotation=self.layer_fn is decoder_layer)
        kept: list[torch.Tensor] | None = None if states is None else []
        args = (start, None if state is None else state[None], kept)
        params = self.member_params()
        routing = self.routing(schedule) if routing is None else routing
        h = members_hidden(
            self.cfg, idx[None], params, self.layer_weights, positions, tables, self.layer_fn, *args, routing
        )
        if states is not None and kept is not None:
            states.extend(x[0] for x in kept)
        return h[0]

    def parameter_lr_scales(self, schedule: Sequence[int]) -> dict[str, float]:
        """repeat_scale "lr": {parameter name: 1 / r} for every parameter of a layer that runs r > 1 times in
        `schedule`; empty for the other settings (every parameter trains at the schedule's lr)."""
        if self.cfg.repeat_scale != "lr":
            return {}
        runs = Counter(schedule)
        return {
            f"layers.{layer}.{name}": 1.0 / r
            for layer, r in sorted(runs.items())
            if r > 1
            for name, _ in self.layers[layer].named_parameters()
        }

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's (vocab, d_model) matrix: the embedding's where tied."""
        return self.embed.weight if self.lm_head is None else self.lm_head

    def forward(self, idx: torch.Tensor, schedule: Sequence[int] | None = None) -> torch.Tensor:
        """Logits (B, T, vocab); training uses `loss`, which never materialises them."""
        return F.linear(self.hidden(idx, schedule), self.head_weight)

    def loss(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor,
        schedule: Sequence[int] | None = None,
        compute_dtype: torch.dtype | None = None,
        reduction: str = "mean",
        compiled: bool = False,
        ignore_index: int | None = None,
    ) -> torch.Tensor:
        """Cross-entropy of next-token `targets` (B, T), through the fused, chunked head (see loss.py); targets
        equal to `ignore_index` count for nothing. A routed model in training with reduction "mean" adds
        ROUTER_AUX_WEIGHT times the mean of its routers' auxiliary losses (Routing.aux)."""
        routing = self.routing(schedule)
        loss = linear_cross_entropy(
            self.hidden(idx, schedule, routing=routing),
            self.head_weight,
            targets,
            compute_dtype,
            reduction,
            compiled,
            ignore_index,
        )
        if routing is not None and routing.aux and reduction == "mean":
            loss = loss + ROUTER_AUX_WEIGHT * torch.stack(routing.aux).mean()
        return loss

    def save(self, folder: str | Path, schedule: Sequence[int], description: dict[str, Any] | None = None) -> None:
        """The model in `folder`, as `train --save` writes it: `model.safetensors` (the weights) and `config.json`
        (the model config, the schedule it runs, and what `description` adds: map, knobs, training settings,
        result). `load` reads it back; `export-model --model` re-exports it."""
        from safetensors.torch import save_model

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_model(self, str(folder / WEIGHTS_FILE))
        config = {"format": SAVED_FORMAT, "model": dataclasses.asdict(self.cfg), "schedule": list(schedule)}
        (folder / CONFIG_FILE).write_text(json.dumps(config | (description or {}), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, folder: str | Path, device: str | torch.device = "cpu") -> tuple[ILRTransformer, list[int]]:
        """The model `save` wrote in `folder`, with its weights, in eval mode, and the schedule it runs."""
        from safetensors.torch import load_model

        saved = read_saved(folder)
        model = cls(saved.model)
        load_model(model, str(Path(folder) / WEIGHTS_FILE), device=str(device))
        return model.to(device).eval(), saved.schedule


SAVED_FORMAT = "ilr-search trained model, version 1"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class SavedModel:
    """What a saved model's config.json holds: the model config and schedule, and the settings it trained with."""

    model: ModelConfig
    schedule: list[int]
    train: TrainConfig | None
    data: DataConfig | None


def read_saved(folder: str | Path) -> SavedModel:
    """The config.json of a model `ILRTransformer.save` wrote; a folder without one is a UserInputError."""
    path = Path(folder) / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserInputError(
            f"{str(folder)!r} holds no {CONFIG_FILE}; save a model with ilr-search train --save"
        ) from None
    train = config.get("train")
    train_cfg = TrainConfig(**(train | {"eval_fractions": tuple(train["eval_fractions"])})) if train else None
    data = DataConfig(**config["data"]) if config.get("data") else None
    return SavedModel(ModelConfig(**config["model"]), list(config["schedule"]), train_cfg, data)


def repeat_indices(schedule: Sequence[int]) -> list[int]:
    """For each entry of a schedule, how many times its layer ran before: [0, 0, 1] -> [0, 1, 0]."""
    seen: dict[int, int] = {}
    indices = []
    for layer_index in schedule:
        indices.append(seen.get(layer_index, 0))
        seen[layer_index] = indices[-1] + 1
    return indices


def branch_passes(cfg: ModelConfig, schedule: Sequence[int]) -> list[tuple[int | None, int | None]]:
    """Per position of the schedule, each branch's (attention's, MLP's) pass index: how many times that branch of
    the layer ran before (None: it does not run here), by the layer's part (ModelConfig.parts,
    schedule.part_passes)."""
    from ilr_search.training.schedule import part_passes

    runs = Counter(schedule)
    parts = cfg.parts or ("",) * cfg.n_layers
    return [
        part_passes(parts[layer], runs[layer])[k] for layer, k in zip(schedule, repeat_indices(schedule), strict=True)
    ]


def routed_positions(cfg: ModelConfig, schedule: Sequence[int]) -> list[bool]:
    """Per position of the schedule, whether its routers choose the tokens that run it (capacity below 1): a position
    none of whose branches runs for the first time there. A repeat index >= 1 of a whole layer; of a layer repeating
    one branch (ModelConfig.parts), the other branch's single pass is a first one, so that position runs every
    token (the attention's last pass with the MLP in `3a`)."""
    if cfg.capacity == 1:
        return [False] * len(schedule)
    return [all(k is None or k >= 1 for k in passes) for passes in branch_passes(cfg, schedule)]


def branch_scales(cfg: ModelConfig, schedule: Sequence[int]) -> list[BranchScale]:
    """Per position of the schedule, the factors on that pass's residual branches: 1 / r for every pass of a
    branch that runs r > 1 times under repeat_scale "residual", times `damping` for a pass after the branch's
    first; 0.0 for a branch that does not run (ModelConfig.parts); None (branches added as they are) where both
    factors are 1."""
    runs = Counter(schedule)
    parts = cfg.parts or ("",) * cfg.n_layers

    def factor(layer: int, repeat: int | None, branch_runs: int) -> float:
        if repeat is None:
            return 0.0
        scale = 1.0 / branch_runs if cfg.repeat_scale == "residual" and branch_runs > 1 else 1.0
        return scale * cfg.damping if repeat >= 1 else scale

    scales: list[BranchScale] = []
    for layer, (attn, mlp) in zip(schedule, branch_passes(cfg, schedule), strict=True):
        r = runs[layer]
        a = factor(layer, attn, 1 if parts[layer] == "m" else r)
        f = factor(layer, mlp, 1 if parts[layer] == "a" else r)
        scales.append((a, f) if a != f else None if a == 1.0 else a)
    return scales
