"""The proxy trainer: trains schedules for a few hundred steps and reports validation loss, perplexity and bits
per byte at the evaluation steps.

train_members is the one training loop. It steps a MemberGroup: SingleModel (one ILRTransformer, every knob and
any init; train_proxy) or fused.FusedGroup (K stacked members; fused.train_fused, which refuses what it does not
implement in one place, fused.check_fusable)."""

from __future__ import annotations

import dataclasses
import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ilr_search.config import ModelConfig, TrainConfig
from ilr_search.data.tokens import TokenData, counted_targets
from ilr_search.errors import UserInputError
from ilr_search.interrupts import raise_if_interrupted
from ilr_search.records import EvalPoint, TrainLossPoint
from ilr_search.training.build import build_model
from ilr_search.training.device import autocast_for, resolve_compile, resolve_device, resolve_dtype
from ilr_search.training.model import ILRTransformer

if TYPE_CHECKING:
    from ilr_search.training.frozen import EvalData

Tensor = torch.Tensor


@dataclass
class TrainResult:
    schedule: list[int]
    params: int
    steps: int  # steps actually run
    tokens: int
    val_loss: float
    val_ppl: float
    val_bpb: float
    train_seconds: float
    tokens_per_second: float
    status: str  # ok | diverged | stopped (by the on_eval callback, e.g. pruning)
    curve: list[EvalPoint] = field(default_factory=list)
    train_curve: list[TrainLossPoint] = field(default_factory=list)  # from the resumed step on, where resumed
    reason: str = ""
    data_seconds: float = 0.0
    eval_seconds: float = 0.0
    device: str = "cpu"
    dtype: str = "fp32"
    resumed_from_step: int = 0
    batch_digest: int = 0  # CRC32 over every training batch seen: equal digests, equal data (common random numbers)
    # a frozen run's score of each unit of its chunk (window or item, frozen.ChunkScores), in unit order
    scores: tuple[float, ...] = ()
    # capacity below 1, at the last evaluation: the fraction of tokens that took each routed pass ("LAYER:REPEAT",
    # e.g. "0:1" for layer 0's second pass) and the realised forward FLOPs over the plain model's (routed_result)
    route_fractions: dict[str, float] | None = None
    realised_flops_ratio: float | None = None

    def curve_dicts(self) -> list[dict[str, Any]]:
        return [{"step": p.step, "tokens": p.tokens, "val_loss": p.val_loss} for p in self.curve]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr, then to cfg.min_lr_frac * cfg.lr at the last step: by a cosine over the rest of
    the run ("cosine"), or held constant to cfg.cooldown_start and then decayed by 1 - sqrt ("wsd", warmup-stable-decay,
    Hägele et al. 2024, who found the 1 - sqrt cooldown better than a linear one of the same length)."""
    warmup = cfg.warmup_length
    if step <= warmup:
        return cfg.lr * step / warmup
    floor = cfg.min_lr_frac * cfg.lr
    if cfg.lr_schedule == "wsd":
        start = cfg.cooldown_start
        if step <= start:
            return cfg.lr
        return floor + (cfg.lr - floor) * (1 - math.sqrt((step - start) / (cfg.steps - start)))
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> None:
    """Every param group's lr for `step`: lr_at, times the group's lr_scale where it has one."""
    lr = lr_at(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr


def weight_decays(name: str, p: torch.Tensor) -> bool:
    """Matrices decay; norm gains (also the per-repeat ones) and knob gates do not (the model has no biases)."""
    return p.dim() >= 2 and "norm" not in name


def build_optimizer(
    model: ILRTransformer, cfg: TrainConfig, device: torch.device, schedule: Sequence[int] | None = None
) -> torch.optim.AdamW:
    """The model's AdamW; with repeat_scale "lr" and a `schedule`, the parameters of its repeated layers go into
    groups of their own at a fraction of the lr (ILRTransformer.parameter_lr_scales). A pretrained model with
    adapters trains them alone (cfg.retrofit "adapters"), and its routers where it has them: every other weight is
    frozen."""
    lr_scales = model.parameter_lr_scales(schedule) if schedule is not None else {}
    named = list(model.named_parameters())
    if model.cfg.init and model.cfg.adapter_rank and cfg.retrofit == "adapters":  # the pretrained weights kept
        for name, p in named:
            p.requires_grad_(".adapters." in name or name == "routers")
        named = [(name, p) for name, p in named if p.requires_grad]
    decay = [p for name, p in named if weight_decays(name, p) and name not in lr_scales]
    no_decay = [p for name, p in named if not weight_decays(name, p) and name not in lr_scales]
    scaled = [
        (
            scale,
            [p for name, p in named if lr_scales.get(name) == scale and weight_decays(name, p)],
            [p for name, p in named if lr_scales.get(name) == scale and not weight_decays(name, p)],
        )
        for scale in sorted(set(lr_scales.values()), reverse=True)
    ]
    return adamw(decay, no_decay, cfg, device, scaled)


def adamw(
    decay: Sequence[torch.Tensor],
    no_decay: Sequence[torch.Tensor],
    cfg: TrainConfig,
    device: torch.device,
    lr_scaled: Sequence[tuple[float, Sequence[torch.Tensor], Sequence[torch.Tensor]]] = (),
) -> torch.optim.AdamW:
    """The proxies' AdamW: `decay` with cfg.weight_decay, `no_decay` without; fused where the device has it.
    `lr_scaled`: (lr_scale, decay, no_decay) for parameters that train at lr_scale times the lr (set_lr)."""
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    for lr_scale, scaled_decay, scaled_no_decay in lr_scaled:
        groups += [
            {"params": params, "weight_decay": wd, "lr_scale": lr_scale}
            for params, wd in ((scaled_decay, cfg.weight_decay), (scaled_no_decay, 0.0))
            if params
        ]
    try:
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=device.type in ("cuda", "cpu"))
    except (RuntimeError, TypeError):  # fused AdamW is not available for this device
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))


@torch.no_grad()
def evaluate(
    model: ILRTransformer,
    schedule: Sequence[int],
    data: TokenData,
    cfg: TrainConfig,
    device: torch.device,
    compute_dtype: torch.dtype,
    compiled: bool = False,
) -> tuple[float, float, float]:
    """(val_loss, val_ppl, val_bpb) over the fixed validation windows' counted targets (with answers, the answer
    tokens); one host sync at the end. A routed model's realised counts (ILRTransformer.route_counts) are this
    evaluation's."""
    model.eval()
    model.route_counts.clear()
    seq_len = model.cfg.seq_len
    total_nats, total_tokens = torch.zeros((), dtype=torch.float64, device=device), 0
    for x_np, y_np in data.val_batches(cfg.eval_windows, seq_len, cfg.batch_size):
        total_tokens += counted_targets(y_np)
        x, y = torch.from_numpy(x_np).to(device), torch.from_numpy(y_np).to(device)
        with autocast_for(device, compute_dtype):
            total_nats += model.loss(
                x, y, schedule, compute_dtype, reduction="sum", compiled=compiled, ignore_index=data.ignore_index
            )
    model.train()
    return validation_metrics(total_nats.item(), total_tokens, data, cfg, seq_len)


def validation_metrics(
    nats: float, total_tokens: int, data: TokenData, cfg: TrainConfig, seq_len: int
) -> tuple[float, float, float]:
    """(val_loss, val_ppl, val_bpb) from the nats summed over the validation windows' `total_tokens` counted
    targets (none counted: nan, never a division by zero)."""
    if not total_tokens:
        return math.nan, math.nan, math.nan
    val_loss = nats / total_tokens
    val_bpb = nats / math.log(2) / data.val_bytes(cfg.eval_windows, seq_len)
    return val_loss, math.exp(min(val_loss, 700.0)), val_bpb


OnEval = Callable[[EvalPoint], bool]  # return True to stop the run (pruning)
OnStep = Callable[[int, int, float], None]  # (step, total steps, training loss)

# Training losses stay on the device and are read every SYNC_EVERY steps, at evaluations and at checkpoints:
# one host sync per window instead of one per step. A diverged run is caught at the next read, and it ends
# there, its divergence step exact; the few optimizer steps taken after it are discarded with the run.
SYNC_EVERY = 16


def host_values(t: torch.Tensor) -> list[Any]:
    """A device tensor's values in Python: one copy to the host (a sync on CUDA), visible to dispatch on any
    device (the sync-counting test sees it on CPU too); nested lists for a tensor of more than one dimension."""
    return t.to("cpu", copy=True).tolist()


@dataclass(eq=False)
class Member:
    """One run of a training group: its schedule, data seed, callbacks and checkpoints, and what it has done so
    far (`start_step` and `curve` come from the checkpoint it resumes from)."""

    schedule: list[int]
    seed: int
    on_eval: OnEval | None = None
    on_step: OnStep | None = None
    checkpoint_path: Path | None = None
    stable_checkpoint: Path | None = None  # wsd: where the state at cooldown_start is saved
    start_step: int = 0
    curve: list[EvalPoint] = field(default_factory=list)
    train_curve: list[TrainLossPoint] = field(default_factory=list)  # window means of the training loss
    digest: int = 0
    data_seconds: float = 0.0
    eval_seconds: float = 0.0
    status: str = "ok"
    reason: str = ""
    end_step: int = 0
    seconds: float = 0.0

    def result(self, params: int, tokens_per_step: int, device: torch.device, dtype: str) -> TrainResult:
        """The run's result from where it ended: end_step is its last step, or the step at which it diverged
        (whose optimizer step does not count)."""
        diverged = self.status == "diverged"
        steps_run = self.end_step - 1 if diverged else self.end_step
        last = self.curve[-1] if self.curve and not diverged else EvalPoint(0, 0, math.nan, math.nan, math.nan)
        trained_tokens = (steps_run - self.start_step) * tokens_per_step
        return TrainResult(
            schedule=self.schedule,
            params=params,
            steps=steps_run,
            tokens=steps_run * tokens_per_step,
            val_loss=last.val_loss,
            val_ppl=last.val_ppl,
            val_bpb=last.val_bpb,
            train_seconds=self.seconds,
            tokens_per_second=trained_tokens / self.seconds if self.seconds > 0 else 0.0,
            status=self.status,
            curve=self.curve,
            train_curve=list(self.train_curve),
            reason=self.reason,
            data_seconds=self.data_seconds,
            eval_seconds=self.eval_seconds,
            device=str(device),
            dtype=dtype,
            resumed_from_step=self.start_step,
            batch_digest=self.digest,
        )


class MemberGroup(Protocol):
    """The models train_members steps together: one (SingleModel, below) or K stacked (fused.FusedGroup)."""

    members: list[Member]  # the members still training, in the group's order
    compute_dtype: torch.dtype

    @property
    def optimizer(self) -> torch.optim.Optimizer: ...

    def losses(
        self, tokens: torch.Tensor, targets: torch.Tensor, reduction: str, ignore_index: int | None
    ) -> torch.Tensor:
        """Each member's loss (members,) on its tokens and targets (members, B, T)."""
        ...

    def clip_gradients(self) -> None: ...

    def evaluate(self, data: TokenData) -> list[tuple[float, float, float]]:
        """(val_loss, val_ppl, val_bpb) per member over the fixed validation windows."""
        ...

    def keep(self, kept: list[Member]) -> None:
        """Go on with `kept` alone (the others diverged or stopped)."""
        ...

    def save(self, member: Member, path: Path, step: int) -> None:
        """The member's checkpoint (checkpoint.py's format, its model and AdamW alone) at `path`."""
        ...


class SingleModel:
    """A group of one: the ILRTransformer itself, with its own AdamW; every knob and any `init` train here."""

    def __init__(
        self,
        model: ILRTransformer,
        member: Member,
        optimizer: torch.optim.Optimizer,
        cfg: TrainConfig,
        device: torch.device,
        compute_dtype: torch.dtype,
        compiled: bool,
    ) -> None:
        self.model, self.members, self.optimizer, self.cfg, self.device = model, [member], optimizer, cfg, device
        self.compute_dtype, self.compiled = compute_dtype, compiled

    def losses(
        self, tokens: torch.Tensor, targets: torch.Tensor, reduction: str, ignore_index: int | None
    ) -> torch.Tensor:
        (member,) = self.members
        loss = self.model.loss(
            tokens[0], targets[0], member.schedule, self.compute_dtype, reduction, self.compiled, ignore_index
        )
        return loss.unsqueeze(0)

    def clip_gradients(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)

    def evaluate(self, data: TokenData) -> list[tuple[float, float, float]]:
        (member,) = self.members
        return [evaluate(self.model, member.schedule, data, self.cfg, self.device, self.compute_dtype, self.compiled)]

    def keep(self, kept: list[Member]) -> None:
        self.members = kept

    def save(self, member: Member, path: Path, step: int) -> None:
        from ilr_search.training.checkpoint import save_checkpoint

        save_checkpoint(path, self.model, self.optimizer, step, member.curve)


def train_members(group: MemberGroup, model_cfg: ModelConfig, data: TokenData, cfg: TrainConfig) -> None:
    """The training loop, for a group of any size whose members all start at one step: each member trains on the
    batches of data.train_batch with its own seed, is evaluated at cfg.eval_steps, leaves the group when it
    diverges or its on_eval stops it (the others go on), and checkpoints on its own. Each member ends with its
    status, reason, end_step (its last step, or the one it diverged at) and seconds set."""
    device = resolve_device(cfg.device)
    tokens_per_step = cfg.batch_size * cfg.grad_accum * model_cfg.seq_len
    eval_steps = set(cfg.eval_steps)
    diverged_above = divergence_threshold(model_cfg.vocab_size)
    start_step = group.members[0].start_step
    stable_step = cfg.cooldown_start if cfg.lr_schedule == "wsd" else None
    unread: list[torch.Tensor] = []  # (members,) training losses of the steps since the last host read
    t0 = time.perf_counter()

    def leave(m: Member, status: str, reason: str, step: int) -> None:
        m.status, m.reason, m.end_step, m.seconds = status, reason, step, time.perf_counter() - t0

    step = start_step
    for step in range(start_step + 1, cfg.steps + 1):
        active = group.members
        set_lr(group.optimizer, step, cfg)
        step_loss = torch.zeros(len(active), dtype=torch.float32, device=device)
        for micro in range(cfg.grad_accum):
            xs, ys = [], []
            for m in active:
                td = time.perf_counter()
                x_np, y_np = data.train_batch(
                    (step - 1) * cfg.grad_accum + micro, cfg.batch_size, model_cfg.seq_len, m.seed
                )
                m.digest = zlib.crc32(np.ascontiguousarray(x_np), m.digest)  # type: ignore[arg-type]  # an ndarray is a buffer (numpy's stubs say so from Python 3.12)
                xs.append(x_np)
                ys.append(y_np)
                m.data_seconds += time.perf_counter() - td
            x = torch.from_numpy(np.stack(xs)).to(device, non_blocking=True)
            y = torch.from_numpy(np.stack(ys)).to(device, non_blocking=True)
            with autocast_for(device, group.compute_dtype):
                losses = group.losses(x, y, "mean", data.ignore_index)
            (losses.sum() / cfg.grad_accum).backward()  # each member's loss reaches only its own parameters
            step_loss += losses.detach() / cfg.grad_accum
        group.clip_gradients()
        group.optimizer.step()
        group.optimizer.zero_grad(set_to_none=True)
        unread.append(step_loss)
        checkpoint_due = (
            bool(cfg.checkpoint_every)
            and step % cfg.checkpoint_every == 0
            and step < cfg.steps
            and any(m.checkpoint_path is not None for m in active)
        )
        stable_due = step == stable_step and any(m.stable_checkpoint is not None for m in active)
        if step % SYNC_EVERY == 0 or step in eval_steps or checkpoint_due or stable_due or step == cfg.steps:
            raise_if_interrupted()
            first = step - len(unread) + 1
            window = host_values(torch.stack(unread))  # the window's one host sync: (steps, members)
            unread.clear()
            for k, m in enumerate(active):
                for s, row in enumerate(window, start=first):
                    value = row[k]
                    if not math.isfinite(value) or value > diverged_above:
                        leave(m, "diverged", training_divergence(value, s, model_cfg.vocab_size), s)
                        break
                    if m.on_step is not None:
                        m.on_step(s, cfg.steps, value)
                else:
                    m.train_curve.append(
                        TrainLossPoint(step, step * tokens_per_step, sum(row[k] for row in window) / len(window))
                    )
            if any(m.status != "ok" for m in active):
                group.keep([m for m in active if m.status == "ok"])
        if step in eval_steps and group.members:
            te = time.perf_counter()
            metrics = group.evaluate(data)
            eval_time = time.perf_counter() - te
            for m, (val_loss, val_ppl, val_bpb) in zip(group.members, metrics, strict=True):
                m.eval_seconds += eval_time
                if not math.isfinite(val_loss) or val_loss > diverged_above:
                    leave(m, "diverged", validation_divergence(val_loss, step), step)
                    continue
                point = EvalPoint(step, step * tokens_per_step, val_loss, val_ppl, val_bpb)
                m.curve.append(point)
                if m.on_eval is not None and m.on_eval(point):
                    leave(m, "stopped", f"stopped at step {step} by the evaluation callback", step)
            if any(m.status != "ok" for m in group.members):
                group.keep([m for m in group.members if m.status == "ok"])
        for m in group.members:
            if checkpoint_due and m.checkpoint_path is not None:
                group.save(m, m.checkpoint_path, step)
            if stable_due and m.stable_checkpoint is not None:
                group.save(m, m.stable_checkpoint, step)
        if not group.members:
            break
    for m in group.members:  # ran to the end
        leave(m, "ok", "", step)


def train_proxy(
    model_cfg: ModelConfig,
    schedule: Sequence[int],
    data: EvalData,
    cfg: TrainConfig,
    on_eval: OnEval | None = None,
    on_step: OnStep | None = None,
    checkpoint_path: Path | None = None,
    on_trained: Callable[[ILRTransformer], None] | None = None,
    start_from: Path | None = None,
    stable_checkpoint: Path | None = None,
) -> TrainResult:
    """Train `schedule` for cfg.steps steps (train_members with a group of one); never raises for a diverging
    run (status `diverged`). `on_trained` receives the trained model at the end (`train --save` keeps it).

    WSD continuation (cfg.lr_schedule "wsd"): `stable_checkpoint` is where the run saves its state at
    cooldown_start, before its cooldown; `start_from` is such a checkpoint of a shorter run of the same map, seed
    and warmup, which this run continues instead of starting from scratch (read, never written; a trial
    checkpoint at `checkpoint_path`, being later, is preferred). The steps up to the checkpoint saw the same
    learning rates and batches as this run's own would have, so the result is the straight run's."""
    from ilr_search.training.checkpoint import continue_checkpoint, load_checkpoint

    if cfg.steps == 0:  # frozen: no step, one evaluation of chunk cfg.seed (frozen.py)
        if model_cfg.capacity < 1:
            raise UserInputError(
                "capacity routes tokens by routers that a frozen run (0 training steps) would leave untrained; "
                "train the map (--train-steps N) or run it without capacity"
            )
        result = frozen_result(model_cfg, list(schedule), data, cfg, on_eval)
        if on_trained is not None:
            on_trained(build_model(model_cfg, cfg.seed).to(resolve_device(cfg.device)))
        return result
    assert isinstance(data, TokenData)  # task items are scored frozen only (space.check_search_objective)
    data.check_window(model_cfg.seq_len)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    model = build_model(model_cfg, cfg.seed).to(device)
    compiled = resolve_compile(cfg.compile, device)
    if compiled:
        model.compile_layers()
    optimizer = build_optimizer(model, cfg, device, schedule)
    member = Member(
        list(schedule),
        cfg.seed,
        on_eval,
        on_step,
        checkpoint_path,
        stable_checkpoint if cfg.lr_schedule == "wsd" else None,
    )
    if checkpoint_path is not None and checkpoint_path.exists():
        member.start_step, member.curve = load_checkpoint(checkpoint_path, model, optimizer)
    elif start_from is not None:
        member.start_step, member.curve = continue_checkpoint(start_from, model, optimizer, cfg.lr, cfg.cooldown_start)
    compute_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    model.train()
    train_members(SingleModel(model, member, optimizer, cfg, device, compute_dtype, compiled), model_cfg, data, cfg)
    if on_trained is not None:
        on_trained(model)
    result = member.result(model.num_params(), cfg.batch_size * cfg.grad_accum * model_cfg.seq_len, device, dtype)
    return routed_result(result, model) if model.routers is not None else result


def routed_result(result: TrainResult, model: ILRTransformer) -> TrainResult:
    """`result` with what a routed model's last evaluation ran (model.route_counts): the realised fraction of each
    routed pass and the realised FLOPs ratio (flops.forward_flops_per_token with the counts' factors)."""
    from ilr_search.training.flops import baseline_flops_per_token, forward_flops_per_token

    counts, cfg = model.route_counts, model.cfg
    if not counts.seen:
        return result
    realised = forward_flops_per_token(cfg, result.schedule, counts.factors(cfg.seq_len))
    return dataclasses.replace(
        result,
        route_fractions={f"{layer}:{repeat}": f for (layer, repeat), f in counts.fractions().items()},
        realised_flops_ratio=realised / baseline_flops_per_token(cfg),
    )


def frozen_result(
    model_cfg: ModelConfig, schedule: list[int], data: EvalData, cfg: TrainConfig, on_eval: OnEval | None
) -> TrainResult:
    """The result of a run of no step: the checkpoint running `schedule`, scored on chunk cfg.seed (frozen.py);
    diverged where its loss is not finite."""
    from ilr_search.training.device import frozen_dtype
    from ilr_search.training.flops import map_param_count
    from ilr_search.training.frozen import evaluate_frozen

    scores = evaluate_frozen(model_cfg, schedule, data, cfg, on_eval)
    point = scores.point
    finite = math.isfinite(point.val_loss)
    device = resolve_device(cfg.device)
    return TrainResult(
        schedule=schedule,
        params=map_param_count(model_cfg, schedule),
        steps=0,
        tokens=scores.tokens,
        val_loss=point.val_loss,
        val_ppl=point.val_ppl,
        val_bpb=point.val_bpb,
        train_seconds=scores.seconds,
        tokens_per_second=scores.tokens / scores.seconds if scores.seconds > 0 else 0.0,
        status="ok" if finite else "diverged",
        curve=[point] if finite else [],
        reason="" if finite else f"validation loss became {point.val_loss:.4g} on chunk {cfg.seed}",
        eval_seconds=scores.seconds,
        device=str(device),
        dtype=frozen_dtype(cfg.dtype, device),
        scores=scores.scores,
    )


def divergence_threshold(vocab_size: int) -> float:
    """Diverged: a non-finite loss, or one more than twice a uniform guess's (ln V): training cannot recover."""
    return 2 * math.log(vocab_size) + 1


def training_divergence(value: float, step: int, vocab_size: int) -> str:
    return f"training loss became {value:.4g} at step {step} (a uniform guess scores {math.log(vocab_size):.3g})"


def validation_divergence(val_loss: float, step: int) -> str:
    return f"validation loss became {val_loss:.4g} at step {step}"
