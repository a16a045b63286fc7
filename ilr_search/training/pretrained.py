"""Pretrained checkpoints in transformers' format: Llama, Mistral, Qwen2 and Qwen3 (SmolLM is Llama). One job:
transformers' names and layouts to ILRTransformer's, and back.

- open_checkpoint reads a checkpoint's config.json (no weights) into a ModelConfig, or refuses what the model
  cannot run in one line;
- load_weights reads its safetensors into ILRTransformer's state_dict names (build_model in train.py loads them
  when ModelConfig.init names the checkpoint; initial_weights reads them once per process);
- unrolled_hf_model builds a model as transformers' model of its family in memory, its schedule unrolled (a layer
  that runs r times is r layers); export_checkpoint writes that model as a standard checkpoint that
  AutoModelForCausalLM loads with no custom code, with a tokenizer that AutoTokenizer loads.

The layouts differ in three places. transformers keeps q, k and v (and gate and up) as separate matrices; the
model concatenates them (attn.qkv, mlp.gate_up). And RoPE: transformers rotates each head's halves (i, i + h/2)
by frequency i, the model rotates its (even, odd) pairs (2i, 2i + 1); q and k rows (weights, biases and q/k norm
gains) are permuted within each head on import so that pair i holds what half-pair i held, and back on export.
The attention scores q.k are the same, since q and k are permuted alike; v and the output projection are not.

A GGUF file (or a folder holding one) is a checkpoint too: training/gguf.py converts it once into a folder of this
format in the cache, which resolve_source returns.

Reading a checkpoint needs json, safetensors and tokenizers (base dependencies); writing one needs transformers,
imported only there (the `hf` extra); a GGUF file needs the `gguf` extra.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ilr_search.config import ModelConfig
from ilr_search.errors import CheckpointError, first_line
from ilr_search.training.gguf import GGUFSource, open_gguf

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from ilr_search.training.model import BranchScale, ILRTransformer

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_TEXT = "llama, mistral, qwen2, qwen3 (SmolLM is llama)"
WEIGHTS_FILE, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
# What an imported checkpoint's tokenizer is made of, as AutoTokenizer reads it (those present are copied).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)
DEFAULT_SEQ_LEN = 2048  # the longest seq_len a checkpoint gets when none is asked for
# Parameters of the recurrence knobs, which a checkpoint lacks: they keep their initial values (the plain model).
KNOB_PARAMETERS = ("injection_gates", "iteration_embed", "iteration_norm_gains", "routers")
# The fields that fix a model's shape and numerics: a model loading a checkpoint must have the checkpoint's.
ARCHITECTURE_FIELDS = (
    "vocab_size",
    "n_layers",
    "d_model",
    "n_heads",
    "kv_heads",
    "head_size",
    "mlp_hidden",
    "pe",
    "norm_eps",
    "rope_base",
    "tie_embeddings",
    "qkv_bias",
    "qk_norm",
)


@dataclass(frozen=True)
class Checkpoint:
    """An opened checkpoint: where it came from (`source`: a folder, a GGUF file or hf:NAME), the folder it is in
    (a GGUF file's: its conversion in the cache), its transformers model_type, the ModelConfig it gives
    (init=source), its tokenizer.json where it has one, and the GGUF file it was converted from (None for a folder)."""

    source: str
    path: Path
    family: str
    config: ModelConfig
    tokenizer_file: Path | None
    gguf: GGUFSource | None = None


def open_checkpoint(source: str, seq_len: int | None = None) -> Checkpoint:
    """The checkpoint at `source`, a folder as save_pretrained writes it, a GGUF file (or a folder holding one) or
    hf:NAME (downloaded through huggingface_hub), from its config.json alone; the model's seq_len is `seq_len`, else
    the checkpoint's max_position_embeddings up to DEFAULT_SEQ_LEN. Raises CheckpointError (one line) for what the
    model cannot run."""
    gguf = open_gguf(source)
    path = gguf.folder if gguf is not None else resolve_source(source)
    if not path.is_dir():
        raise CheckpointError(
            f"checkpoint {source}: no such folder; give a folder as transformers' save_pretrained "
            "writes it (config.json, model.safetensors), a GGUF file or hf:NAME"
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"checkpoint {source}: the folder has no config.json (nor a .gguf file); give a folder as "
            "transformers' save_pretrained writes it (config.json, model.safetensors) or a GGUF file"
        )
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {source}: cannot read config.json ({type(e).__name__})") from None
    family = raw.get("model_type")
    if family not in SUPPORTED_FAMILIES:
        raise CheckpointError(
            f"checkpoint {source}: model_type {family!r} is not supported; supported: {SUPPORTED_TEXT}"
        )
    weight_files(path, source)  # refuses a folder without weights now, not when the weights are read
    config = model_config(raw, family, source, seq_len)
    tokenizer = path / "tokenizer.json"
    return Checkpoint(source, path, family, config, tokenizer if tokenizer.is_file() else None, gguf)


def resolve_source(source: str) -> Path:
    """The local folder of a checkpoint source: hf:NAME downloaded (or found in the cache), a GGUF file's (or a
    folder's one GGUF file's) conversion in the cache (training/gguf.py), else the path."""
    if source.startswith("hf:"):
        return hub_snapshot(source)
    gguf = open_gguf(source)
    return gguf.folder if gguf is not None else Path(source).expanduser()


@functools.cache
def hub_snapshot(source: str) -> Path:
    """The local folder of hf:NAME, downloaded through huggingface_hub or found in its cache."""
    name = source[3:]
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.jinja"])
        )
    except ImportError:
        raise CheckpointError(
            f"cannot fetch {source}: huggingface_hub is not installed; "
            "pip install 'ilr-search[hf]' or give a local folder"
        ) from None
    except Exception as e:
        reason = first_line(e)
        raise CheckpointError(
            f"cannot fetch {source}: {type(e).__name__}: {reason[:160]} (offline?); download it "
            "first or give a local folder"
        ) from None


def weight_files(path: Path, source: str) -> list[Path]:
    """The checkpoint's safetensors files: model.safetensors, or the shards its index names."""
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    if (path / WEIGHTS_INDEX).is_file():
        try:
            index = json.loads((path / WEIGHTS_INDEX).read_text(encoding="utf-8"))
            shards = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise CheckpointError(f"checkpoint {source}: cannot read {WEIGHTS_INDEX} ({type(e).__name__})") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise CheckpointError(f"checkpoint {source}: the shard {missing[0]} its index names is missing")
        return [path / s for s in shards]
    raise CheckpointError(
        f"checkpoint {source}: the folder has no weights ({WEIGHTS_FILE} or {WEIGHTS_INDEX}); "
        "only safetensors weights are read"
    )


def model_config(raw: dict[str, Any], family: str, source: str, seq_len: int | None) -> ModelConfig:
    """The ModelConfig of a supported family's config.json, or CheckpointError for what the model lacks."""

    def refuse(what: str) -> CheckpointError:
        return CheckpointError(
            f"checkpoint {source}: {what} is not supported (the model runs {SUPPORTED_TEXT} "
            "with SiLU MLPs, plain RoPE and full attention)"
        )

    def required(key: str) -> Any:
        if key not in raw:
            raise CheckpointError(f"checkpoint {source}: config.json has no {key}")
        return raw[key]

    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise refuse(f"hidden_act {activation!r}")
    if raw.get("mlp_bias"):
        raise refuse("mlp_bias")
    if family in ("llama", "qwen3") and raw.get("attention_bias"):
        raise refuse("attention_bias (a bias on o_proj)")
    rope_parameters = raw.get("rope_parameters") or {}
    rope_scaling = raw.get("rope_scaling") or {}
    rope_type = rope_parameters.get("rope_type", rope_scaling.get("rope_type", rope_scaling.get("type", "default")))
    if rope_type != "default":
        raise refuse(f"rope scaling {rope_type!r}")
    if rope_parameters.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise refuse("partial_rotary_factor")
    hidden, heads = int(required("hidden_size")), int(required("num_attention_heads"))
    intermediate = int(required("intermediate_size"))
    mlp_ratio = intermediate / hidden
    if int(round(mlp_ratio * hidden)) != intermediate:  # never seen; the model's width must be the checkpoint's
        raise CheckpointError(
            f"checkpoint {source}: intermediate_size {intermediate} is not a round ratio of hidden_size {hidden}"
        )
    head_dim = raw.get("head_dim")
    explicit_head = 0 if head_dim is None or (hidden % heads == 0 and head_dim == hidden // heads) else int(head_dim)
    kv_heads = int(raw.get("num_key_value_heads") or heads)
    max_positions = int(raw.get("max_position_embeddings", DEFAULT_SEQ_LEN))
    seq_len = seq_len or min(max_positions, DEFAULT_SEQ_LEN)
    window = raw.get("sliding_window") if family == "mistral" or raw.get("use_sliding_window") else None
    if window is not None and int(window) < seq_len:
        raise refuse(f"sliding_window {window} (shorter than seq_len {seq_len})")
    try:
        return ModelConfig(
            vocab_size=int(required("vocab_size")),
            n_layers=int(required("num_hidden_layers")),
            d_model=hidden,
            n_heads=heads,
            n_kv_heads=0 if kv_heads == heads else kv_heads,
            head_dim=explicit_head,
            seq_len=seq_len,
            mlp_ratio=mlp_ratio,
            pe="rope",
            norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_base=float(rope_parameters.get("rope_theta", raw.get("rope_theta", 10000.0))),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2",
            qk_norm=family == "qwen3",
            init=source,
        )
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {source}: {e}") from None


def halves_to_pairs(t: torch.Tensor, head_size: int) -> torch.Tensor:
    """Rows of q or k (grouped by head) in transformers' RoPE layout (halves) to the model's (pairs)."""
    return t.reshape(-1, 2, head_size // 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def pairs_to_halves(t: torch.Tensor, head_size: int) -> torch.Tensor:
    """halves_to_pairs' inverse."""
    return t.reshape(-1, head_size // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def load_weights(checkpoint: Checkpoint) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under ILRTransformer's state_dict names, in fp32 (see the module docstring)."""
    import torch
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(checkpoint.path, checkpoint.source):
        tensors.update(load_file(str(file)))
    read: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise CheckpointError(f"checkpoint {checkpoint.source}: the weights have no {name}")
        read.add(name)
        return tensors[name].to(torch.float32)

    cfg, hs = checkpoint.config, checkpoint.config.head_size
    weights = {"embed.weight": take("model.embed_tokens.weight"), "norm.weight": take("model.norm.weight")}
    if not cfg.tie_embeddings:
        weights["lm_head"] = take("lm_head.weight")
    for i in range(cfg.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        kinds = ("weight", "bias") if cfg.qkv_bias else ("weight",)
        for kind in kinds:
            q, k, v = (take(f"{hf}self_attn.{p}_proj.{kind}") for p in "qkv")
            weights[f"{ours}attn.qkv.{kind}"] = torch.cat((halves_to_pairs(q, hs), halves_to_pairs(k, hs), v))
        weights[f"{ours}attn.proj.weight"] = take(f"{hf}self_attn.o_proj.weight")
        if cfg.qk_norm:
            for p in "qk":
                weights[f"{ours}attn.{p}_norm.weight"] = halves_to_pairs(take(f"{hf}self_attn.{p}_norm.weight"), hs)
        weights[f"{ours}mlp.gate_up.weight"] = torch.cat(
            (take(f"{hf}mlp.gate_proj.weight"), take(f"{hf}mlp.up_proj.weight"))
        )
        weights[f"{ours}mlp.down.weight"] = take(f"{hf}mlp.down_proj.weight")
        weights[f"{ours}attn_norm.weight"] = take(f"{hf}input_layernorm.weight")
        weights[f"{ours}mlp_norm.weight"] = take(f"{hf}post_attention_layernorm.weight")
    # a tied checkpoint may still hold its head; rotary tables are buffers, recomputed
    left = sorted(n for n in set(tensors) - read if n != "lm_head.weight" and not n.endswith("rotary_emb.inv_freq"))
    if left:
        raise CheckpointError(
            f"checkpoint {checkpoint.source}: the weights hold {len(left)} tensor(s) the model has "
            f"no place for, e.g. {left[0]}"
        )
    return weights


def cached_weights(source: str) -> dict[str, torch.Tensor]:
    """load_weights of `source`, read once per process and checkpoint folder (a search builds many models from one
    checkpoint; the tensors are copied into each model, never changed; a GGUF file rewritten in place is another
    folder). The weights do not depend on seq_len."""
    return folder_weights(source, resolve_source(source))


@functools.cache
def folder_weights(source: str, folder: Path) -> dict[str, torch.Tensor]:
    return load_weights(open_checkpoint(source, seq_len=1))


def check_architecture(cfg: ModelConfig, checkpoint: Checkpoint) -> None:
    """A model that loads a checkpoint must have its architecture (the recurrence knobs and seq_len aside)."""
    differ = [
        f"{name} {getattr(cfg, name)} (the checkpoint's: {getattr(checkpoint.config, name)})"
        for name in ARCHITECTURE_FIELDS
        if getattr(cfg, name) != getattr(checkpoint.config, name)
    ]
    if differ:
        raise CheckpointError(
            f"the model differs from checkpoint {checkpoint.source} in {', '.join(differ)}; the "
            "checkpoint fixes the model's architecture"
        )


def load_initial_weights(model: ILRTransformer) -> None:
    """Load model.cfg.init's weights into `model` (its architecture checked against the checkpoint's); the
    recurrence knobs' parameters, which no checkpoint has, keep their initial values."""
    cfg = model.cfg
    check_architecture(cfg, open_checkpoint(cfg.init, cfg.seq_len))
    result = model.load_state_dict(cached_weights(cfg.init), strict=False)
    missing = [name for name in result.missing_keys if name not in KNOB_PARAMETERS and ".adapters." not in name]
    if missing or result.unexpected_keys:
        raise CheckpointError(
            f"checkpoint {cfg.init}: its weights do not fit the model (missing "
            f"{missing[:3]}, unexpected {result.unexpected_keys[:3]})"
        )


def transformers_module() -> Any:
    """transformers, or one clear error line where it is not installed."""
    try:
        import transformers
    except ImportError:
        raise CheckpointError(
            "writing a transformers checkpoint needs transformers; pip install 'ilr-search[hf]'"
        ) from None
    return transformers


FAMILY_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
}

# What each family's config must say for the model: full attention, no o_proj or MLP bias.
FAMILY_SETTINGS: dict[str, dict[str, Any]] = {
    "llama": {"attention_bias": False, "mlp_bias": False},
    "mistral": {"sliding_window": None},
    "qwen2": {"use_sliding_window": False},
    "qwen3": {"use_sliding_window": False, "attention_bias": False},
}


def check_exportable(cfg: ModelConfig, family: str) -> None:
    """Refuse (one line) a model that transformers' `family` cannot express."""
    if family not in SUPPORTED_FAMILIES:
        raise CheckpointError(f"cannot write family {family!r}; supported: {', '.join(SUPPORTED_FAMILIES)}")
    knobs = [  # (damping and repeat_scale are branch factors, written as scaled o_proj and down_proj copies)
        name
        for name, on in (
            ("injection", cfg.injection != "none"),
            ("iteration_encoding", cfg.iteration_encoding),
            ("iteration_norms", cfg.iteration_norms),
        )
        if on
    ]
    if knobs:
        raise CheckpointError(
            f"cannot write a {family} checkpoint of a model with the recurrence knob(s) "
            f"{', '.join(knobs)}: transformers' {family} has no such operation"
        )
    if cfg.pe != "rope":
        raise CheckpointError(
            f"cannot write a {family} checkpoint of a model with pe {cfg.pe!r}: transformers' {family} uses rope"
        )
    if cfg.qk_norm != (family == "qwen3"):
        raise CheckpointError(
            f"cannot write a {family} checkpoint of a model {'with' if cfg.qk_norm else 'without'} "
            "q/k norms: qwen3 has them, llama, mistral and qwen2 do not"
        )
    if cfg.qkv_bias and family != "qwen2":
        raise CheckpointError(f"cannot write a {family} checkpoint of a model with q/k/v biases: write it as qwen2")


def hf_config(cfg: ModelConfig, family: str, n_layers: int) -> Any:
    """transformers' config of `family` for a model of `cfg` with `n_layers` layers."""
    transformers = transformers_module()
    config_class = getattr(transformers, FAMILY_CLASSES[family][0])
    try:
        return config_class(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.d_model,
            intermediate_size=cfg.mlp_hidden,
            num_hidden_layers=n_layers,
            num_attention_heads=cfg.n_heads,
            num_key_value_heads=cfg.kv_heads,
            head_dim=cfg.head_size,
            max_position_embeddings=cfg.seq_len,
            rms_norm_eps=cfg.norm_eps,
            rope_theta=cfg.rope_base,
            tie_word_embeddings=cfg.tie_embeddings,
            hidden_act="silu",
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
            **FAMILY_SETTINGS[family],
        )
    except (TypeError, ValueError) as e:  # transformers' own checks of the config
        reason = first_line(e)
        raise CheckpointError(f"cannot write a {family} checkpoint of this model: {reason}") from None


def hf_state_dict(
    model: ILRTransformer, schedule: Sequence[int], family: str, scales: Sequence[BranchScale] | None = None
) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names, fp32 on the CPU, its schedule unrolled: position p of the
    schedule is transformers' layer p. A position whose branches are scaled (damping, repeat_scale "residual":
    `scales`, model.branch_scales of the model's config where not given) has its o_proj and down_proj scaled by
    that factor: the same residual additions; a branch that does not run (a one-branch pass) has its projection
    zero. A pass k >= 1 of a branch with adapters (ModelConfig.adapter_rank) has W + B_k A_k in its copy."""
    import torch

    from ilr_search.training.model import ADAPTED, branch_passes, branch_scales

    cfg, hs = model.cfg, model.cfg.head_size
    scales = branch_scales(cfg, schedule) if scales is None else scales
    ours = {name: t.detach().to("cpu", torch.float32) for name, t in model.state_dict().items()}
    passes = branch_passes(cfg, schedule)

    def weight(layer: int, name: str, matrix: str, k: int | None) -> torch.Tensor:  # W, with pass k's adapter merged
        w = ours[f"layers.{layer}.{name}.weight"]
        if not cfg.adapter_rank or not k:
            return w
        a, b = ours[f"layers.{layer}.adapters.{matrix}_a"][k - 1], ours[f"layers.{layer}.adapters.{matrix}_b"][k - 1]
        return w + b @ a

    q_dim, kv_dim = cfg.n_heads * hs, cfg.kv_heads * hs
    out = {
        "model.embed_tokens.weight": ours["embed.weight"],
        "model.norm.weight": ours["norm.weight"],
        "lm_head.weight": ours["embed.weight"] if cfg.tie_embeddings else ours["lm_head"],
    }
    for position, layer in enumerate(schedule):
        hf, src = f"model.layers.{position}.", f"layers.{layer}."
        factor = scales[position]
        attn_scale, mlp_scale = factor if isinstance(factor, tuple) else (factor or 1.0, factor or 1.0)
        attn_k, mlp_k = passes[position]
        kinds = ("weight", "bias") if cfg.qkv_bias or family == "qwen2" else ("weight",)
        for kind in kinds:
            qkv = (
                weight(layer, "attn.qkv", ADAPTED[0], attn_k) if kind == "weight" else ours.get(f"{src}attn.qkv.{kind}")
            )
            if qkv is None:  # qwen2 always has q/k/v biases: a model without them has zeros
                qkv = torch.zeros(q_dim + 2 * kv_dim)
            q, k, v = qkv.split((q_dim, kv_dim, kv_dim))
            out |= {
                f"{hf}self_attn.q_proj.{kind}": pairs_to_halves(q, hs),
                f"{hf}self_attn.k_proj.{kind}": pairs_to_halves(k, hs),
                f"{hf}self_attn.v_proj.{kind}": v,
            }
        out[f"{hf}self_attn.o_proj.weight"] = weight(layer, "attn.proj", ADAPTED[1], attn_k) * attn_scale
        if cfg.qk_norm:
            for p in "qk":
                out[f"{hf}self_attn.{p}_norm.weight"] = pairs_to_halves(ours[f"{src}attn.{p}_norm.weight"], hs)
        gate, up = weight(layer, "mlp.gate_up", ADAPTED[2], mlp_k).chunk(2)
        out |= {
            f"{hf}mlp.gate_proj.weight": gate,
            f"{hf}mlp.up_proj.weight": up,
            f"{hf}mlp.down_proj.weight": weight(layer, "mlp.down", ADAPTED[3], mlp_k) * mlp_scale,
            f"{hf}input_layernorm.weight": ours[f"{src}attn_norm.weight"],
            f"{hf}post_attention_layernorm.weight": ours[f"{src}mlp_norm.weight"],
        }
    return {name: t.contiguous().clone() for name, t in out.items()}


def check_schedule(cfg: ModelConfig, schedule: Sequence[int]) -> None:
    """Refuse (one line) a schedule that is empty or runs a layer the model does not have."""
    if not schedule or any(not 0 <= i < cfg.n_layers for i in schedule):
        raise CheckpointError(f"cannot write schedule {list(schedule)}: it must run layers 0..{cfg.n_layers - 1}")


def unrolled_hf_model(
    model: ILRTransformer, schedule: Sequence[int], family: str, scales: Sequence[BranchScale] | None = None
) -> PreTrainedModel:
    """`model` running `schedule` as transformers' model of `family` in memory, fp32 on the CPU, in eval mode: its
    schedule unrolled (num_hidden_layers = len(schedule); position p of the schedule is layer p). Raises
    CheckpointError (one line) for what the family cannot express."""
    import torch

    check_exportable(model.cfg, family)
    check_schedule(model.cfg, schedule)
    transformers = transformers_module()
    config = hf_config(model.cfg, family, len(schedule))
    with torch.device("cpu"):
        hf_model = getattr(transformers, FAMILY_CLASSES[family][1])(config).to(torch.float32)
    hf_model.load_state_dict(hf_state_dict(model, schedule, family, scales), strict=True)
    return hf_model.eval()


def export_checkpoint(
    model: ILRTransformer,
    schedule: Sequence[int],
    out_dir: Path,
    family: str = "llama",
    tokenizer_dir_or_file: Path | None = None,
) -> Path:
    """Write `model` running `schedule` as a standard transformers checkpoint of `family` in `out_dir` (created):
    config.json and model.safetensors of unrolled_hf_model, and a tokenizer: a folder's tokenizer files copied (an
    imported checkpoint's), a tokenizer.json file wrapped for AutoTokenizer (bpe:N's trained one), or None: the
    project's byte tokenizer. Returns out_dir."""
    tokenizer = export_tokenizer(model.cfg, tokenizer_dir_or_file)
    hf_model = unrolled_hf_model(model, schedule, family)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(out_dir)
    if isinstance(tokenizer, list):
        for file in tokenizer:
            shutil.copyfile(file, out_dir / file.name)
    else:
        transformers_module().PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(out_dir)
    return out_dir


def export_tokenizer(cfg: ModelConfig, tokenizer_dir_or_file: Path | None) -> Any:
    """What export_checkpoint writes as the tokenizer, checked before anything is written: a folder's tokenizer
    files (a list of paths), or a `tokenizers` Tokenizer (a tokenizer.json's, or the byte tokenizer's for None)."""
    from tokenizers import Tokenizer as RustTokenizer

    from ilr_search.data.tokenizers import byte_tokenizer_model

    if tokenizer_dir_or_file is None:
        tokenizer = byte_tokenizer_model()
    elif Path(tokenizer_dir_or_file).is_dir():
        found = [
            Path(tokenizer_dir_or_file) / name
            for name in TOKENIZER_FILES
            if (Path(tokenizer_dir_or_file) / name).is_file()
        ]
        if not found:
            raise CheckpointError(
                f"tokenizer {tokenizer_dir_or_file}: the folder has no tokenizer files "
                f"({', '.join(TOKENIZER_FILES[:2])}, ...)"
            )
        return found
    elif Path(tokenizer_dir_or_file).is_file():
        try:
            tokenizer = RustTokenizer.from_file(str(tokenizer_dir_or_file))
        except Exception as e:
            raise CheckpointError(
                f"tokenizer {tokenizer_dir_or_file}: not a tokenizer.json ({type(e).__name__})"
            ) from None
    else:
        raise CheckpointError(f"tokenizer {tokenizer_dir_or_file}: no such file or folder")
    if tokenizer.get_vocab_size() > cfg.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {tokenizer.get_vocab_size()} ids, more than the model's vocabulary {cfg.vocab_size}"
        )
    return tokenizer
