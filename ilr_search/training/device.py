"""Where and in what precision a proxy trains: the device, the dtype and whether layers are compiled, each
resolved by a rule from the settings (torch is imported only when one is resolved)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ilr_search.config import Dtype

if TYPE_CHECKING:
    import torch


def resolve_device(device: str) -> torch.device:
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device == "cuda" and not torch.cuda.is_available():
        from ilr_search.errors import UserInputError

        raise UserInputError("--device cuda was asked for but no CUDA device is visible; use --device auto or cpu")
    return torch.device(device)


def resolve_dtype(dtype: Dtype, device: torch.device) -> Dtype:
    """`auto` by a rule, never by a timing (the same command must give the same study and the same result):
    bf16 autocast on CUDA with bf16 support, fp32 everywhere else. On a CPU with AVX512-BF16/AMX, bf16 can be
    faster at widths of 128 and more (benchmarks/throughput.py); ask for it with --dtype bf16."""
    if dtype != "auto":
        return dtype
    if device.type == "cuda":
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "fp32"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16)."""
    import torch

    capabilities = getattr(torch.cpu, "get_capabilities", None)
    if capabilities is not None:
        found = capabilities()
        return bool(found.get("avx512_bf16") or found.get("amx_bf16"))
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def frozen_dtype(dtype: Dtype, device: torch.device) -> Dtype:
    """A frozen evaluation's dtype: `auto` is bf16 where the device computes it natively (CUDA with bf16, a CPU with
    AVX512-BF16 or AMX), else fp32; an explicit fp32 or bf16 is kept. Its weights are stored in it (frozen.py), not
    autocast per operation; benchmarks/frozen_speed.py measures what it changes."""
    if dtype == "auto" and device.type == "cpu":
        return "bf16" if cpu_has_bf16() else "fp32"
    return resolve_dtype(dtype, device)


def resolve_compile(compile_layers: bool | None, device: torch.device) -> bool:
    """None (auto): compile on CUDA, where it pays back within a proxy run; not on CPU, where it does not."""
    return device.type == "cuda" if compile_layers is None else compile_layers


COMPILE_BACKEND_ENV = "ILR_SEARCH_COMPILE_BACKEND"


def compile_backend() -> str:
    """The torch.compile backend of every compiled piece (decoder layers, loss head, fused layer): torch's
    default "inductor" unless ILR_SEARCH_COMPILE_BACKEND names another (tests use "aot_eager", which traces
    forward and backward through AOTAutograd without generating code)."""
    return os.environ.get(COMPILE_BACKEND_ENV, "") or "inductor"


_compiled: dict[tuple[Callable[..., Any], str], Callable[..., Any]] = {}


def compiled_once(fn: Callable[..., Any], recompile_limit: int = 0) -> Callable[..., Any]:
    """`fn` through torch.compile with static shapes and compile_backend(), once per process and backend: every
    caller shares its graphs. `recompile_limit` raises dynamo's cache entries per code object to at least that
    many (past the limit dynamo runs `fn` uncompiled, silently)."""
    key = (fn, compile_backend())
    if key not in _compiled:
        import torch

        if recompile_limit:
            import torch._dynamo

            config = torch._dynamo.config
            config.recompile_limit = max(config.recompile_limit, recompile_limit)
        _compiled[key] = torch.compile(fn, dynamic=False, backend=key[1])
    return _compiled[key]


def autocast_for(device: torch.device, compute_dtype: torch.dtype) -> Any:
    """bf16 autocast for the layers when training in bf16 (weights and optimizer stay fp32)."""
    from contextlib import nullcontext

    import torch

    if compute_dtype == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()
