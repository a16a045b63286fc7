"""The fused trainer: K proxies of one architecture, each with its own schedule, trained in lockstep in one process.

All reuse maps (and block recurrence) of a search share their parameter shapes; only the order in which the
layers run differs. So the K members' parameters are stacked along a leading member axis, and one training step
runs all of them at once (HFTA, Wang et al., MLSys 2021):

- each layer's parameters are held flat, as two [K, n_layers, P] tensors (the matrices, which decay, and the
  norm gains, which do not); at each schedule position one `index_select` picks every member's layer;
- the linear layers are batched matmuls over the member axis, and one scaled_dot_product_attention call covers
  all K * batch sequences;
- members are kept sorted by schedule length, longest first, so the members still running at a schedule
  position are a prefix of the member axis: a shorter schedule passes its activations through unchanged at the
  extra positions and costs nothing there (prefix masking: benchmarks/fused.py measures it against masking
  with `torch.where`, which computes every member at every position);
- each member's loss goes through the fused, chunked LM head of loss.py, with its own head (its embedding where
  tied);
- gradients are clipped per member, and one AdamW steps the stacked tensors: AdamW is elementwise, so this is
  K AdamWs, one per member.

The group trains through train.train_members, the one training loop, which train_proxy runs with a group of one:
each member has the initial weights of `build_model(model_cfg, seed)`, the batches of `data.train_batch` with its
seed, its own evaluations, divergence (it leaves the group, the others go on), stop (its on_eval callback),
checkpoint (checkpoint.py's format, one file per member: a member can resume alone with `train_proxy`), and a
TrainResult of the same meaning.

check_fusable is the one place that refuses what the group does not implement. The forward pass is model.py's
(members_hidden, decoder_layer), so the recurrence knobs and the pretrained architectures' options train fused:
injection, iteration_encoding, iteration_norms, an untied head (their parameters stacked like the others),
repeat_scale "residual" and damping (a [member] factor on the branches at each schedule position), grouped-query
attention, an explicit head_dim, q/k/v biases and q/k norms (decoder_layer's); init_depth only changes the initial
weights, which come from build_model. repeat_scale "lr" is refused (its per-layer lrs would need per-row lrs in the
stacked tensors' one AdamW), and so is a checkpoint's weights (`init`): such a model trains one map at a time
(jobs.groups, `--fuse auto`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ilr_search.config import ModelConfig, TrainConfig
from ilr_search.data.tokens import TokenData, counted_targets
from ilr_search.errors import UserInputError
from ilr_search.training.checkpoint import load_checkpoint, save_checkpoint
from ilr_search.training.loss import linear_cross_entropy
from ilr_search.training.model import (
    LAYER_WEIGHTS,
    ILRTransformer,
    Position,
    compiled_layer,
    decoder_layer,
    members_hidden,
    position_tables,
    schedule_positions,
)
from ilr_search.training.train import (
    Member,
    OnEval,
    OnStep,
    TrainResult,
    adamw,
    autocast_for,
    build_model,
    build_optimizer,
    host_values,
    resolve_compile,
    resolve_device,
    resolve_dtype,
    set_lr,
    train_members,
    validation_metrics,
    weight_decays,
)

Tensor = torch.Tensor

LAYER_PARAM = re.compile(r"^layers\.(\d+)\.(.+)$")
LAYER_DECAY, LAYER_NO_DECAY = "layers.decay", "layers.no_decay"  # keys of the two flat per-layer tensors


class FusionUnsupported(UserInputError):
    """A model setting the fused trainer does not implement."""


def check_fusable(model_cfg: ModelConfig) -> None:
    """Refuse repeat_scale "lr" (per-layer learning rates), a checkpoint's weights (`init`), per-pass adapters
    (each member's pass picks its own adapter) and capacity below 1 (each member's routers choose its own tokens:
    model.routed_pass runs one member); every other knob and architecture option trains fused."""
    asked = (
        ("repeat_scale=lr", model_cfg.repeat_scale == "lr"),
        ("init", bool(model_cfg.init)),
        ("adapters", model_cfg.adapter_rank > 0),
        ("capacity", model_cfg.capacity < 1),
    )
    refused = [name for name, on in asked if on]
    if refused:
        raise FusionUnsupported(
            f"the fused trainer does not support {', '.join(refused)}; train these maps one at a time (--fuse 1)"
        )


@dataclass(frozen=True)
class LayerSlot:
    """Where one per-layer parameter lives in its flat [K, n_layers, P] tensor."""

    key: str  # LAYER_DECAY or LAYER_NO_DECAY
    offset: int
    shape: torch.Size

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class StackedLayout:
    """How a member's parameters (named as in ILRTransformer) map onto the stacked tensors, and back.

    Per-layer parameters `layers.{l}.{rest}` go, flattened, into LAYER_DECAY or LAYER_NO_DECAY at [k, l, slot];
    every other parameter `name` becomes a [K, *shape] tensor under its own name. The same maps serve any
    tensor shaped like the parameters (AdamW's moments)."""

    def __init__(self, template: ILRTransformer) -> None:
        self.n_layers = template.cfg.n_layers
        self.layer_slots: dict[str, LayerSlot] = {}
        self.top_names: list[str] = []
        self.decays: dict[str, bool] = {}  # stacked key -> whether AdamW decays it
        sizes = {LAYER_DECAY: 0, LAYER_NO_DECAY: 0}
        for name, p in template.named_parameters():
            match = LAYER_PARAM.match(name)
            if match is None:
                self.top_names.append(name)
                self.decays[name] = weight_decays(name, p)
            elif match.group(1) == "0":
                key = LAYER_DECAY if weight_decays(name, p) else LAYER_NO_DECAY
                self.layer_slots[match.group(2)] = LayerSlot(key, sizes[key], p.shape)
                sizes[key] += p.numel()
        self.layer_keys = [key for key in (LAYER_DECAY, LAYER_NO_DECAY) if sizes[key]]
        self.decays |= {LAYER_DECAY: True, LAYER_NO_DECAY: False}

    @property
    def keys(self) -> list[str]:
        return self.layer_keys + self.top_names

    def stack(self, members: Sequence[dict[str, Tensor]]) -> dict[str, Tensor]:
        """Member tensors by parameter name -> stacked tensors by key."""
        stacked = {name: torch.stack([m[name] for m in members]) for name in self.top_names}
        for key in self.layer_keys:
            rests = [rest for rest, slot in self.layer_slots.items() if slot.key == key]
            stacked[key] = torch.stack(
                [
                    torch.stack(
                        [
                            torch.cat([m[f"layers.{layer}.{rest}"].reshape(-1) for rest in rests])
                            for layer in range(self.n_layers)
                        ]
                    )
                    for m in members
                ]
            )
        return stacked

    def unstack(self, stacked: dict[str, Tensor], k: int) -> dict[str, Tensor]:
        """Stacked tensors by key -> member k's tensors by parameter name (views)."""
        member = {name: stacked[name][k] for name in self.top_names}
        for rest, slot in self.layer_slots.items():
            for layer in range(self.n_layers):
                member[f"layers.{layer}.{rest}"] = stacked[slot.key][
                    k, layer, slot.offset : slot.offset + slot.numel
                ].view(slot.shape)
        return member

    def layer_view(self, gathered: dict[str, Tensor], rest: str) -> Tensor:
        """One per-layer parameter, [m, *shape], out of gathered flat rows {key: [m, P]}."""
        slot = self.layer_slots[rest]
        rows = gathered[slot.key]
        return rows[:, slot.offset : slot.offset + slot.numel].view(rows.shape[0], *slot.shape)


@dataclass
class MemberState:
    """A member's weights and AdamW state by parameter name, as its run starts."""

    weights: dict[str, Tensor]
    moments: dict[str, dict[str, Tensor]]  # AdamW state name (exp_avg, exp_avg_sq) -> by parameter name
    optimizer_step: Tensor | None  # AdamW's step count (None before the first step)


def load_member(model_cfg: ModelConfig, cfg: TrainConfig, member: Member, device: torch.device) -> MemberState:
    """build_model's initial weights for the member's seed, or its checkpoint where one exists (which sets the
    member's start_step and curve)."""
    model = build_model(model_cfg, member.seed).to(device)
    path = member.checkpoint_path
    if path is None or not path.exists():
        return MemberState({n: p.detach() for n, p in model.named_parameters()}, {}, None)
    optimizer = build_optimizer(model, cfg, device)
    member.start_step, member.curve = load_checkpoint(path, model, optimizer)
    moments: dict[str, dict[str, Tensor]] = {}
    optimizer_step = None
    for name, p in model.named_parameters():
        for key, value in optimizer.state[p].items():
            if key == "step":
                optimizer_step = value
            else:
                moments.setdefault(key, {})[name] = value
    return MemberState({n: p.detach() for n, p in model.named_parameters()}, moments, optimizer_step)


class FusedGroup:
    """The stacked parameters of the members still training, their AdamW, and the fused forward pass."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        cfg: TrainConfig,
        members: list[Member],
        states: list[MemberState],
        device: torch.device,
        compute_dtype: torch.dtype,
        compiled: bool,
        length_masking: str = "prefix",
    ) -> None:
        """`states`: each member's starting weights and AdamW state (load_member), in `members` order."""
        self.model_cfg, self.cfg, self.device = model_cfg, cfg, device
        # compiled: the layers through compiled_layer, the head through loss.compiled_chunk_loss
        self.compute_dtype, self.compiled = compute_dtype, compiled
        self.length_masking = length_masking  # prefix (members sorted by length) or where (all at every position)
        self.template = ILRTransformer(model_cfg).to(device)  # shapes and names, and the checkpoint writer
        self.template_optimizer = build_optimizer(self.template, cfg, device)
        self.layout = StackedLayout(self.template)
        order = sorted(range(len(members)), key=lambda k: -len(members[k].schedule))
        self.members = [members[k] for k in order]
        sorted_states = [states[k] for k in order]
        stacked = self.layout.stack([state.weights for state in sorted_states])
        self.params = {key: torch.nn.Parameter(t.detach().clone()) for key, t in stacked.items()}
        self.optimizer = self._adamw()
        first = sorted_states[0]
        if first.optimizer_step is not None:  # resumed: the members' AdamW states, stacked
            for moment in first.moments:
                moments = self.layout.stack([state.moments[moment] for state in sorted_states])
                for key, p in self.params.items():
                    self.optimizer.state[p][moment] = moments[key].clone()
            for p in self.params.values():
                self.optimizer.state[p]["step"] = first.optimizer_step.clone()
        # uncompiled, RoPE as one complex rotation (multi-head fp32; else rotate_pairs); compiled, apply_rope's real
        # arithmetic, which the compiler fuses
        self.tables = position_tables(
            model_cfg, model_cfg.seq_len, device, rotation=not compiled, complex_rotation=not compiled
        )
        self.layer_fn = compiled_layer() if compiled else decoder_layer
        self._index_schedules()

    def _adamw(self) -> torch.optim.AdamW:
        decay = [p for key, p in self.params.items() if self.layout.decays[key]]
        no_decay = [p for key, p in self.params.items() if not self.layout.decays[key]]
        return adamw(decay, no_decay, self.cfg, self.device)

    def _index_schedules(self) -> None:
        """The members' schedule positions (model.schedule_positions) and their layer rows in the flat [K * L, P]
        view of the per-layer parameters."""
        L = self.model_cfg.n_layers
        schedules = [m.schedule for m in self.members]
        self.positions = schedule_positions(
            self.model_cfg, schedules, device=self.device, compiled=self.compiled, masking=self.length_masking
        )
        self.running = [len(position.layers) for position in self.positions]
        rows = [k * L + layer for position in self.positions for k, layer in enumerate(position.layers)]
        self.all_rows = torch.tensor(rows, dtype=torch.long, device=self.device)

    def keep(self, kept: list[Member]) -> None:
        """Drop the members not in `kept` (diverged or stopped): their rows leave every stacked tensor and AdamW.
        With none kept the group is over: it holds no members (and trains no further)."""
        if not kept:
            self.members = []
            return
        rows = torch.tensor([self.members.index(m) for m in kept], dtype=torch.long, device=self.device)
        old_params, old_optimizer = self.params, self.optimizer
        self.params = {key: torch.nn.Parameter(p.detach()[rows].clone()) for key, p in old_params.items()}
        self.optimizer = self._adamw()
        for key, p in self.params.items():
            for name, value in old_optimizer.state[old_params[key]].items():
                self.optimizer.state[p][name] = value[rows].clone() if value.dim() else value.clone()
        self.members = kept
        self._index_schedules()

    # --- the forward pass ---

    def hidden(self, tokens: Tensor) -> Tensor:
        """Final normalised hidden states (K, B, T, D) of every member for token ids (K, B, T): model.members_hidden
        over the stacked parameters."""
        K = len(self.members)
        # Every position's layer rows in one index_select per flat tensor, then split by position: backward is one
        # cat and one index_add into the parameter's gradient (a gather per position would zero-fill a
        # parameter-sized gradient at each position).
        per_position = {
            key: self.params[key]
            .view(K * self.model_cfg.n_layers, -1)
            .index_select(0, self.all_rows)
            .split(self.running)
            for key in self.layout.layer_keys
        }

        def layer(s: int, position: Position) -> tuple[Tensor | None, ...]:
            gathered = {key: rows[s] for key, rows in per_position.items()}
            slots = self.layout.layer_slots
            return tuple(self.layout.layer_view(gathered, rest) if rest in slots else None for rest in LAYER_WEIGHTS)

        args = (self.params, layer, self.positions, self.tables, self.layer_fn)
        return members_hidden(self.model_cfg, tokens, *args)

    def losses(self, tokens: Tensor, targets: Tensor, reduction: str, ignore_index: int | None = None) -> Tensor:
        """Each member's cross-entropy (K,), through the fused, chunked head with its own head matrix; targets equal
        to `ignore_index` count for nothing."""
        h = self.hidden(tokens)
        head = self.params.get("lm_head", self.params["embed.weight"])  # each member's head: its embedding where tied
        return torch.stack(
            [
                linear_cross_entropy(
                    h[k], head[k], targets[k], self.compute_dtype, reduction, self.compiled, ignore_index
                )
                for k in range(len(self.members))
            ]
        )

    # --- training ---

    def clip_gradients(self) -> None:
        """clip_grad_norm_ per member: each member's gradient norm over all its parameters, scaled to cfg.grad_clip."""
        K = len(self.members)
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        norms = torch.stack([g.reshape(K, -1).norm(dim=1) for g in grads]).norm(dim=0)  # (K,)
        coef = (self.cfg.grad_clip / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coef.view(K, *[1] * (g.dim() - 1)))

    @torch.no_grad()
    def evaluate(self, data: TokenData) -> list[tuple[float, float, float]]:
        """(val_loss, val_ppl, val_bpb) per member over the fixed validation windows; one host sync."""
        K, seq_len = len(self.members), self.model_cfg.seq_len
        total_nats = torch.zeros(K, dtype=torch.float64, device=self.device)
        total_tokens = 0
        for x_np, y_np in data.val_batches(self.cfg.eval_windows, seq_len, self.cfg.batch_size):
            total_tokens += counted_targets(y_np)
            x, y = torch.from_numpy(x_np).to(self.device), torch.from_numpy(y_np).to(self.device)
            with autocast_for(self.device, self.compute_dtype):
                total_nats += self.losses(x.expand(K, *x.shape), y.expand(K, *y.shape), "sum", data.ignore_index)
        return [validation_metrics(nats, total_tokens, data, self.cfg, seq_len) for nats in host_values(total_nats)]

    def save(self, member: Member, path: Path, step: int) -> None:
        """Member's checkpoint in checkpoint.py's format, as train_proxy writes it (its model and AdamW alone)."""
        k = self.members.index(member)
        weights = self.layout.unstack({key: p.detach() for key, p in self.params.items()}, k)
        stacked_state = {key: self.optimizer.state[p] for key, p in self.params.items()}
        moments = {
            name: self.layout.unstack({key: s[name] for key, s in stacked_state.items()}, k)
            for name in next(iter(stacked_state.values()))
            if name != "step"
        }
        optimizer_step = next(iter(stacked_state.values()))["step"]
        with torch.no_grad():
            for name, p in self.template.named_parameters():
                p.copy_(weights[name])
                self.template_optimizer.state[p] = {"step": optimizer_step.clone()} | {
                    moment: values[name].clone() for moment, values in moments.items()
                }
        set_lr(self.template_optimizer, step, self.cfg)
        save_checkpoint(path, self.template, self.template_optimizer, step, member.curve)


def train_fused(
    model_cfg: ModelConfig,
    schedules: Sequence[Sequence[int]],
    data: TokenData,
    cfg: TrainConfig,
    on_eval: Sequence[OnEval | None] | None = None,
    on_step: Sequence[OnStep | None] | None = None,
    checkpoint_paths: Sequence[Path | None] | None = None,
    seeds: Sequence[int] | None = None,
    length_masking: str = "prefix",
) -> list[TrainResult]:
    """Train each schedule as `train_proxy(model_cfg, schedule, data, replace(cfg, seed=seed), on_eval, on_step,
    checkpoint_path)` would, all in lockstep (train_members with a FusedGroup); one TrainResult per schedule, in
    order. Never raises for a diverging member. Members resuming from checkpoints of different steps train as
    separate fused groups."""
    K = len(schedules)
    if K == 0:
        return []
    check_fusable(model_cfg)
    if length_masking not in ("prefix", "where"):
        raise ValueError(f"length_masking must be prefix or where, got {length_masking!r}")
    on_eval = list(on_eval) if on_eval is not None else [None] * K
    on_step = list(on_step) if on_step is not None else [None] * K
    checkpoint_paths = list(checkpoint_paths) if checkpoint_paths is not None else [None] * K
    seeds = list(seeds) if seeds is not None else [cfg.seed] * K
    for name, values in (
        ("on_eval", on_eval),
        ("on_step", on_step),
        ("checkpoint_paths", checkpoint_paths),
        ("seeds", seeds),
    ):
        if len(values) != K:
            raise ValueError(f"{name} has {len(values)} entries for {K} schedules")
    data.check_window(model_cfg.seq_len)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    compute_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    compiled = resolve_compile(cfg.compile, device)
    members = [Member(list(schedules[k]), seeds[k], on_eval[k], on_step[k], checkpoint_paths[k]) for k in range(K)]
    states = [load_member(model_cfg, replace(cfg, seed=m.seed), m, device) for m in members]
    for start_step in sorted({m.start_step for m in members}):
        group = [k for k in range(K) if members[k].start_step == start_step]
        fused = FusedGroup(
            model_cfg,
            cfg,
            [members[k] for k in group],
            [states[k] for k in group],
            device,
            compute_dtype,
            compiled,
            length_masking,
        )
        for k in group:
            states[k] = MemberState({}, {}, None)  # the group's stacked copies are the live ones
        train_members(fused, model_cfg, data, cfg)
    params = fused.template.num_params()
    tokens_per_step = cfg.batch_size * cfg.grad_accum * model_cfg.seq_len
    return [m.result(params, tokens_per_step, device, dtype) for m in members]
