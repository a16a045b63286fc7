"""Writing a standard transformers checkpoint from a command (training/pretrained.py does the conversion): the
family a model is written as, the folder it goes to, the tokenizer that goes with it, every check before anything
is written, and the write itself, into a temporary folder renamed into place. `train --save --format hf`
(recipe.py) and `export-model` (export.py) share them.

The tokenizer written beside the weights is what tokenized the model's data: the imported checkpoint's files, the
bpe:N tokenizer.json the run trained, file:PATH's, hf:NAME's, or the byte tokenizer. A native save keeps a copy
of it (save_tokenizer), so that its model can be exported later without the token cache.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ilr_search.config import DataConfig, ModelConfig
from ilr_search.errors import UserInputError
from ilr_search.folders import check_can_create
from ilr_search.training.pretrained import (
    TOKENIZER_FILES,
    CheckpointError,
    check_exportable,
    check_schedule,
    export_checkpoint,
    export_tokenizer,
    hf_config,
    open_checkpoint,
    resolve_source,
)

if TYPE_CHECKING:
    from ilr_search.training.model import ILRTransformer

SAVE_FORMATS = {"native": "safetensors and the model's config JSON", "hf": "a standard transformers checkpoint"}
DEFAULT_FAMILY = "llama"


def check_format(given: str, formats: Mapping[str, str]) -> str:
    """`--format given`, one of `formats` (a format -> what it writes); else refused, saying what each writes."""
    if given not in formats:
        uses = " or ".join(f"{name} ({what})" for name, what in formats.items())
        raise UserInputError(f"unknown --format {given!r}; use {uses}")
    return given


def default_family(cfg: ModelConfig) -> str:
    """The family a model is written as: its imported checkpoint's where that checkpoint is still readable, else
    the family its architecture needs (qwen3 for q/k norms, qwen2 for q/k/v biases), else llama."""
    if cfg.init:
        try:
            return open_checkpoint(cfg.init, seq_len=1).family
        except CheckpointError:
            pass
    return "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else DEFAULT_FAMILY


def check_out_dir(out: Path, flag: str = "--out") -> Path:
    """A folder a checkpoint can be written to: absent or empty, and writable where it would be made."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserInputError(f"{flag} {str(out)!r} is a file; give a new or empty folder")
    if out.is_dir() and any(out.iterdir()):
        raise UserInputError(f"{flag} {str(out)!r} is a folder that is not empty; give a new or empty folder")
    check_can_create(
        out.parent if not out.exists() else out, f"the checkpoint {str(out)!r}", "give a folder you can write"
    )
    return out


def data_tokenizer(cfg: ModelConfig, data: DataConfig, tokens_dir: Path | None) -> Path | None:
    """What tokenized a model's data, as export_checkpoint takes it: the imported checkpoint's folder, the
    tokenizer.json of bpe:N (in the token cache folder `tokens_dir`), file:PATH's or hf:NAME's; None for bytes."""
    from ilr_search.data.tokenizers import parse_tokenizer_spec

    if cfg.init:
        return resolve_source(cfg.init)
    parsed = parse_tokenizer_spec(data.tokenizer)
    if parsed.kind == "byte":
        return None
    if parsed.kind == "file":
        return Path(parsed.path)
    if parsed.kind == "bpe":
        if tokens_dir is None or not (Path(tokens_dir) / "tokenizer.json").is_file():
            raise CheckpointError(f"the {data.tokenizer} tokenizer's tokenizer.json is not in the token cache")
        return Path(tokens_dir) / "tokenizer.json"
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(data.tokenizer[3:], "tokenizer.json"))
    except Exception as e:
        raise CheckpointError(f"cannot read the tokenizer.json of {data.tokenizer} ({type(e).__name__})") from None


def save_tokenizer(folder: Path, tokenizer: Path | None) -> None:
    """A native save's copy of its tokenizer (nothing for bytes): a checkpoint folder's tokenizer files, or a
    tokenizer.json."""
    if tokenizer is None:
        return
    if tokenizer.is_dir():
        for name in TOKENIZER_FILES:
            if (tokenizer / name).is_file():
                shutil.copyfile(tokenizer / name, folder / name)
    else:
        shutil.copyfile(tokenizer, folder / "tokenizer.json")


def check_checkpoint(cfg: ModelConfig, schedule: Sequence[int], family: str, tokenizer: Path | None) -> None:
    """What export_checkpoint would refuse, refused before any work or any folder is made: among them a routed map
    (capacity below 1 with a routed pass), whose passes run the tokens its routers choose."""
    from ilr_search.training.model import routed_positions

    if any(routed_positions(cfg, schedule)):
        raise UserInputError(
            f"a routed model (capacity={cfg.capacity:g}) is not a standard checkpoint: its repeated passes run the "
            "tokens its routers choose; train --save DIR keeps it natively"
        )
    check_exportable(cfg, family)
    check_schedule(cfg, schedule)
    export_tokenizer(cfg, tokenizer)
    hf_config(cfg, family, len(schedule))


def write_checkpoint(
    model: ILRTransformer, schedule: Sequence[int], out: Path, family: str, tokenizer: Path | None
) -> Path:
    """export_checkpoint into a temporary folder beside `out`, renamed to `out` when complete (an empty `out`
    is replaced); nothing is left behind on failure."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # save_pretrained's bar: noise in a command's output
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.writing-{os.getpid()}"
    try:
        export_checkpoint(model, schedule, tmp, family, tokenizer)
        if out.is_dir():
            out.rmdir()  # empty (check_out_dir)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
