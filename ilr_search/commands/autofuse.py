"""`run --fuse auto`: how many maps a fused group trains at once (K) and, on a CPU, how the cores are
used (one group with every core's thread, or one group per core as worker processes of one thread each), chosen
from memory and from a short measured probe; and the memory check of a K asked for.

The probe trains the study's model (the all-ones map, K copies, on random tokens: nothing is read, cached or
stored) for a few fused steps at each K of PROBE_KS and each layout, and keeps the one with the most tokens/s
in total; a smaller K within PROBE_TOLERANCE of the best is preferred (fewer trials in flight: the sampler sees
more results before it proposes). A K the memory cannot hold is never probed or chosen.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import os
import queue
import time
from dataclasses import dataclass
from typing import Any, Literal

from ilr_search.commands.layout import process_threads, trial_lanes, usable_cores
from ilr_search.config import SIZE_MAXIMA, Dtype, ModelConfig, SpaceConfig
from ilr_search.errors import UserInputError
from ilr_search.search.plan import StudyPlan
from ilr_search.training.device import resolve_device

GIB = 1 << 30
CUDA_CONTEXT_BYTES = GIB  # per process: the CUDA context, cuBLAS/cuDNN workspaces, compiled kernels
PROBE_KS = (1, 2, 4, 8)
PROBE_STEPS = 6  # timed fused steps per K and layout, after one untimed step
PROBE_TOLERANCE = 0.05  # a smaller K within 5% of the best layout's tokens/s is chosen instead
PROBE_SECONDS = 10.0  # a K whose probe (its untimed step included) takes longer is left out


@dataclass(frozen=True)
class Layout:
    """How a run trains: `groups` worker processes (1: the run's own process), each training up to `fuse` maps
    at once in one fused group with `threads` torch threads (None: torch's default, or on CUDA not set) in each
    of its `lanes` (training/jobs.py)."""

    groups: int
    fuse: int
    threads: int | None = None
    lanes: int = 1


@dataclass(frozen=True)
class ProbedLayout:
    layout: Layout
    tokens_per_second: float  # all groups together


@dataclass(frozen=True)
class FuseChoice:
    layout: Layout
    reason: str  # one line: what was chosen and why


def parse_fuse(text: str | int) -> int | Literal["auto"]:
    """`--fuse 4` or `--fuse auto` (also a space's `fuse`): a positive number of maps, or "auto"."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text) if not isinstance(text, bool) else 0
    except (TypeError, ValueError):
        value = 0
    if not 1 <= value <= SIZE_MAXIMA["search", "fuse"] or str(text).strip() not in (str(value), f"+{value}"):
        raise UserInputError(
            f"--fuse must be a positive number of maps trained at once (1: one at a time), at most "
            f"{SIZE_MAXIMA['search', 'fuse']:,}, or auto, got {text!r}"
        )
    return value


def proxy_memory_bytes(model: ModelConfig, layer_runs: int, batch_size: int, bf16: bool) -> int:
    """An upper estimate of one proxy's device memory: fp32 weights, gradients and AdamW moments (16 bytes a
    parameter), activations kept for backward (about 24 values per token and width per layer run in the
    compute dtype, SwiGLU's 4x hidden included; flash attention keeps no T x T matrix), and one chunk of
    fp32 logits with its gradient (loss.py). A fused group of K holds about K of these."""
    from ilr_search.training.flops import param_count
    from ilr_search.training.loss import LOGITS_PER_CHUNK

    value_bytes = 2 if bf16 else 4
    tokens = batch_size * model.seq_len
    activations = layer_runs * tokens * model.d_model * (24 + 3 * model.mlp_ratio) * value_bytes
    logits = 3 * min(LOGITS_PER_CHUNK, tokens * model.vocab_size) * 4
    return int(16 * param_count(model) + activations + logits + tokens * model.d_model * 8)


def available_memory(device: str) -> tuple[int, int, str]:
    """(available bytes, total bytes, what they are) on the run's device: free GPU memory on CUDA, else the
    RAM the kernel reports available (MemAvailable: free plus what it can reclaim)."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(dev)
        return free, total, "GPU memory"
    if dev.type == "cpu":
        try:
            info = dict(line.split(":", 1) for line in open("/proc/meminfo", encoding="ascii"))
            return int(info["MemAvailable"].split()[0]) * 1024, int(info["MemTotal"].split()[0]) * 1024, "RAM"
        except (OSError, KeyError, ValueError):
            pass
    pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return pages * page, pages * page, "RAM"


def memory_per_group_member(plan: StudyPlan) -> int:
    """Memory one map of a fused group needs at the costliest schedule the budget allows."""
    return proxy_memory_bytes(
        plan.model, plan.budget.max_layer_runs(plan.model), plan.space.train.batch_size, plan.dtype != "fp32"
    )


def process_overhead_bytes(plan: StudyPlan) -> int:
    """Memory each process needs beside its maps: the CUDA context on a GPU (nothing counted on a CPU)."""
    return CUDA_CONTEXT_BYTES if resolve_device(plan.space.train.device).type == "cuda" else 0


def max_fitting_fuse(plan: StudyPlan, groups: int) -> int:
    """The largest K such that `groups` fused groups of K maps fit in the available memory (0: not even one)."""
    free, _, _ = available_memory(plan.space.train.device)
    per_group = max(0, free // max(1, groups) - process_overhead_bytes(plan))
    return int(per_group // memory_per_group_member(plan))


def check_memory(plan: StudyPlan, groups: int, fuse: int) -> None:
    """`groups` processes of `fuse` maps each must fit in the device's available memory, or one clear error."""
    fit = max_fitting_fuse(plan, groups)
    if fuse <= fit:
        return
    free, total, what = available_memory(plan.space.train.device)
    one = memory_per_group_member(plan)
    context = process_overhead_bytes(plan)
    need = groups * (fuse * one + context)
    asked = (f"--workers {groups} " if groups > 1 else "") + f"--fuse {fuse}"
    if fit >= 1:
        advice = f"use --fuse {fit} or less"
    else:
        fit_groups = max(g for g in range(groups + 1) if g == 0 or max_fitting_fuse(plan, g) >= fuse)
        advice = f"use --workers {fit_groups} or less" if fit_groups >= 1 else "use a smaller --batch-size or model"
    raise UserInputError(
        f"{asked} needs about {need / GIB:.1f} GiB of {what} ({one / GIB:.2f} GiB per map of "
        f"{plan.budget.max_layer_runs(plan.model)} layer runs at batch {plan.space.train.batch_size}"
        + (", plus the CUDA context per process" if context else "")
        + f"), but {free / GIB:.1f} of "
        f"{total / GIB:.1f} GiB are available; {advice}"
    )


def probe_fused(space: SpaceConfig, model: ModelConfig, dtype: Dtype, k: int, steps: int = PROBE_STEPS) -> float:
    """Seconds of `steps` fused steps of K copies of the all-ones map (after one untimed step), on random tokens,
    in this process with its present torch threads."""
    from ilr_search.data.tokens import random_tokens
    from ilr_search.training.fused import train_fused

    data = random_tokens(model.vocab_size, model.seq_len)
    base = dataclasses.replace(
        space.train, dtype=dtype, compile=False, eval_fractions=(1.0,), eval_windows=1, checkpoint_every=0
    )
    schedules = [list(range(model.n_layers))] * k
    train_fused(model, schedules, data, dataclasses.replace(base, steps=1))
    start = time.perf_counter()
    results = train_fused(model, schedules, data, dataclasses.replace(base, steps=steps))
    elapsed = time.perf_counter() - start
    return max(1e-9, elapsed - max(r.eval_seconds for r in results))


def _probe_process(
    space: SpaceConfig,
    model: ModelConfig,
    dtype: Dtype,
    ks: tuple[int, ...],
    threads: int | None,
    start: Any,
    stop: Any,
    results: Any,
) -> None:
    """One probe process: each K starts when every process and the parent are at the barrier; it ends when the
    parent says the sweep is done."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    for k in ks:
        start.wait()
        if stop.is_set():
            return
        results.put((k, probe_fused(space, model, dtype, k)))


def probe_layout(
    space: SpaceConfig, model: ModelConfig, dtype: Dtype, ks: tuple[int, ...], groups: int, threads: int | None
) -> tuple[dict[int, float], int | None]:
    """Tokens/s (by K), and the K that ran out of time if one did, all groups together, of `groups` processes
    (spawned, as the workers are) each training a fused group of K maps at the same time, for K in `ks` ascending
    (the slowest group's time counts for all). The sweep stops at the first K no faster than the one before by
    PROBE_TOLERANCE (fusion stopped paying), and at a K whose probe is not done within PROBE_SECONDS (that K is left
    out: slower than the others measured)."""
    ctx = mp.get_context("spawn")
    start, stop, results = ctx.Barrier(groups + 1), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_probe_process,
            args=(space, model, dtype, ks, threads, start, stop, results),
            name=f"ilr-search fuse probe {g}",
        )
        for g in range(groups)
    ]
    for p in procs:
        p.start()
    tokens = space.train.batch_size * model.seq_len * PROBE_STEPS
    speeds: dict[int, float] = {}
    too_slow = None
    try:
        for k in ks:
            start.wait()
            if stop.is_set():
                break
            deadline = time.perf_counter() + PROBE_SECONDS
            try:
                seconds = max(results.get(timeout=max(0.0, deadline - time.perf_counter()))[1] for _ in range(groups))
            except queue.Empty:
                for p in procs:  # still training: this K is slower than PROBE_SECONDS allows
                    p.terminate()
                too_slow = k
                break
            previous = speeds[max(speeds)] if speeds else None
            speeds[k] = groups * k * tokens / seconds
            if previous is not None and speeds[k] <= (1 + PROBE_TOLERANCE) * previous:
                stop.set()  # the processes see it at the next barrier
    finally:
        for p in procs:
            p.join()
    return speeds, too_slow


def choose_fuse(plan: StudyPlan, workers: int | None, n_trials: int) -> FuseChoice:
    """`--fuse auto`: the layout with the most probed tokens/s among those memory allows, K at most the trials a
    group gets (`n_trials` over the groups). `workers` given: that many groups, K chosen; else on a CPU with C
    cores one group of C threads against C groups of one thread, measured."""
    from ilr_search.training.fused import FusionUnsupported, check_fusable

    space, model = plan.space, plan.model
    device = resolve_device(space.train.device)
    cores = usable_cores()

    def threads_for(groups: int) -> int | None:  # on a CPU the usable cores shared out; elsewhere not set
        return process_threads(space, groups)

    try:
        check_fusable(model)
    except FusionUnsupported as e:
        return FuseChoice(Layout(workers or 1, 1, threads_for(workers or 1)), f"fuse auto: K = 1 ({e})")
    if workers is not None:
        options = [workers]
    elif device.type == "cpu" and cores > 1:
        options = [1, cores]
    else:
        options = [1]
    probed: list[ProbedLayout] = []
    slow: list[str] = []  # the layouts and K whose probe ran out of time
    for groups in options:
        threads = threads_for(groups)
        cap = min(max_fitting_fuse(plan, groups), max(1, math.ceil(n_trials / groups)))
        ks = tuple(k for k in PROBE_KS if k <= cap) or ((1,) if cap >= 1 else ())
        if not ks:
            continue
        speeds, too_slow = probe_layout(space, model, plan.dtype, ks, groups, threads)
        if too_slow is not None:
            slow.append(f"{describe(Layout(groups, too_slow, threads))} not done in {PROBE_SECONDS:.0f} s")
        probed += [ProbedLayout(Layout(groups, k, threads), speed) for k, speed in speeds.items()]
    if not probed:
        return FuseChoice(
            Layout(workers or 1, 1, threads_for(workers or 1)),
            f"fuse auto: K = 1 (no probe done in {PROBE_SECONDS:.0f} s: " + "; ".join(slow) + ")",
        )
    best = max(p.tokens_per_second for p in probed)
    chosen = min(
        (p for p in probed if p.tokens_per_second >= (1 - PROBE_TOLERANCE) * best),
        key=lambda p: (p.layout.fuse, p.layout.groups),
    )
    unfused = next((p for p in probed if p.layout.fuse == 1 and p.layout.groups == 1), None)
    others = "; ".join([f"{describe(p.layout)} {p.tokens_per_second:,.0f}" for p in probed if p is not chosen] + slow)
    reason = (
        f"fuse auto: {describe(chosen.layout)}, {chosen.tokens_per_second:,.0f} tokens/s in a "
        f"{PROBE_STEPS}-step probe"
        + (
            f" ({chosen.tokens_per_second / unfused.tokens_per_second:.2f}x {describe(unfused.layout)})"
            if unfused is not None and unfused is not chosen
            else ""
        )
        + (f"; probed {others}" if others else "")
    )
    return FuseChoice(chosen.layout, reason)


def describe(layout: Layout) -> str:
    where = f"{layout.groups} workers" if layout.groups > 1 else "1 process"
    where += f" x {layout.lanes} lanes" if layout.lanes > 1 else ""
    threads = f" x {layout.threads} thread{'s' if layout.threads != 1 else ''}" if layout.threads else ""
    return f"{where}{threads}, K = {layout.fuse}"


def resolve_layout(plan: StudyPlan, fuse: int | str, workers: int | None, n_trials: int) -> FuseChoice:
    """The run's layout from `--fuse` (a number or auto) and `--workers` (None: not given): a K asked for is
    checked against memory; auto is chosen by choose_fuse. On a CPU the processes share the usable cores out
    (layout.process_threads), or a run of one process trains in one-thread lanes (layout.trial_lanes)."""
    if fuse == "auto":
        choice = choose_fuse(plan, workers, n_trials)
        check_memory(plan, choice.layout.groups, choice.layout.fuse)
        return choice
    groups = workers or 1
    check_memory(plan, groups, int(fuse))
    lanes = trial_lanes(plan.space, groups, int(fuse))
    threads = process_threads(plan.space, groups * lanes)
    return FuseChoice(Layout(groups, int(fuse), threads, lanes), "")
