"""GGUF files (llama.cpp's format) as checkpoints. One job: a GGUF source to a transformers checkpoint folder.

A source names a GGUF file when it is a path ending in `.gguf`, or a folder without config.json that holds exactly
one `.gguf` file (a folder with config.json is a transformers folder). The file is converted once into a standard
checkpoint folder in the cache (`<cache>/gguf-<SHA-256 prefix>/`, beside the token cache), written atomically (a
temporary folder renamed), through transformers' own GGUF loader: the model from
`AutoModelForCausalLM.from_pretrained(..., gguf_file=...)`, its weights dequantized to float32 and written by the
family's own class, and the tokenizer from the same file (`AutoTokenizer.from_pretrained(..., gguf_file=...)`),
saved with its tokenizer.json. pretrained.py then reads that folder as any other.

The file is known by its SHA-256 (a study records it), which names its folder: a file converted before is found
by it, its header read back from the folder's INFO_FILE. A file not converted yet is read with the `gguf` package's
GGUFReader first, before anything is written: its general.architecture must be one SUPPORTED_ARCHITECTURES names,
and its tensors' types say whether it is quantized (any type but F32, F16 and BF16): a quantized file's dequantized
weights are the quantized model, not the one it was made from (dequantization_note).

Needs gguf, accelerate and transformers (the `gguf` extra), imported only here.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ilr_search.errors import CheckpointError, first_line
from ilr_search.folders import check_can_create

SUFFIX = ".gguf"
# general.architecture values whose models the in-package model runs (llama.cpp writes Mistral as llama)
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})  # tensor types that hold the weights as they were
INFO_FILE = "gguf.json"  # in a converted folder: the file it came from; written last, so its presence means complete
PACKAGES = ("gguf", "accelerate", "transformers")
INSTALL = "pip install 'ilr-search[gguf]'"


@dataclass(frozen=True)
class GGUFSource:
    """A GGUF file read as a checkpoint: the file, its SHA-256, its general.architecture, how many of its tensors
    have each type (most first), and the transformers checkpoint folder it is converted into."""

    file: Path
    sha256: str
    architecture: str
    tensor_types: tuple[tuple[str, int], ...]
    folder: Path

    @property
    def quantized_types(self) -> tuple[str, ...]:
        """The tensor types other than F32, F16 and BF16, most used first."""
        return tuple(kind for kind, _ in self.tensor_types if kind not in FLOAT_TYPES)


def gguf_file(source: str) -> Path | None:
    """The GGUF file `source` names (a path ending in .gguf, or a folder without config.json holding one .gguf
    file), or None where it names none: a transformers folder, hf:NAME, or a path that is neither (pretrained.py
    says what is wrong with it). A .gguf path that is no file, and a folder of several, are refused here."""
    if source.startswith("hf:"):
        return None
    path = Path(source).expanduser()
    if path.suffix.lower() == SUFFIX:
        if not path.is_file():
            raise CheckpointError(f"checkpoint {source}: no such GGUF file")
        return path
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(found) > 1:
        raise CheckpointError(
            f"checkpoint {source}: the folder holds {len(found)} GGUF files ({', '.join(p.name for p in found[:3])}"
            f"{', ...' if len(found) > 3 else ''}); give one as --init FOLDER/FILE.gguf"
        )
    return found[0] if found else None


def open_gguf(source: str) -> GGUFSource | None:
    """The GGUF file `source` names (gguf_file), converted into its checkpoint folder unless the cache has it
    already; None where `source` names no GGUF file. Read once per process while the file is unchanged."""
    file = gguf_file(source)
    if file is None:
        return None
    from ilr_search.data.tokens import cache_root

    stat = file.stat()
    return _open(file.resolve(), stat.st_size, stat.st_mtime_ns, stat.st_ino, cache_root(), source)


@functools.cache
def _open(file: Path, size: int, mtime_ns: int, inode: int, root: Path, source: str) -> GGUFSource:
    """open_gguf of a file in one state (its size, modification time and inode) with the cache in `root`. A file
    converted before is known by its digest alone: its header is read back from the folder's INFO_FILE."""
    digest = file_sha256(file)
    folder = root / f"gguf-{digest[:20]}"
    converted = read_converted(file, digest, folder)
    if converted is not None:
        return converted
    missing = [name for name in PACKAGES if not importable(name)]
    if missing:
        raise CheckpointError(f"checkpoint {source}: reading a GGUF file needs {' and '.join(missing)}; {INSTALL}")
    architecture, types = read_header(file, source)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"checkpoint {source}: GGUF architecture {architecture!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (SmolLM is llama)"
        )
    gguf = GGUFSource(file, digest, architecture, types, folder)
    convert(gguf, root, source)
    return gguf


def read_converted(file: Path, digest: str, folder: Path) -> GGUFSource | None:
    """`file` as its converted folder's INFO_FILE describes it, where the folder is complete and was converted from
    the file of `digest`."""
    try:
        info = json.loads((folder / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("sha256") != digest:
        return None
    return GGUFSource(file, digest, info["architecture"], tuple(info["tensor_types"].items()), folder)


def importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def read_header(file: Path, source: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    """A GGUF file's general.architecture and tensor types (with their counts, most first), from GGUFReader."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(file))
        field = reader.fields.get("general.architecture")
        if field is None:
            raise CheckpointError(f"checkpoint {source}: the GGUF file has no general.architecture")
        architecture = bytes(field.parts[field.data[0]]).decode("utf-8")
        types = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    except CheckpointError:
        raise
    except Exception as e:  # GGUFReader's checks of a truncated or foreign file: ValueError, struct and index errors
        raise CheckpointError(f"checkpoint {source}: not a readable GGUF file ({one_line(e)})") from None
    return architecture, tuple(types.most_common())


def file_sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def one_line(e: BaseException) -> str:
    """The exception's type and the first line of its message."""
    text = first_line(e, 160)
    return f"{type(e).__name__}: {text}" if text != type(e).__name__ else text


def convert(gguf: GGUFSource, root: Path, source: str) -> None:
    """Write the checkpoint folder of `gguf` (see the module docstring): built in a temporary folder under `root`,
    renamed into place whole; a process that renamed first wins, and its folder is kept."""
    check_can_create(
        root,
        f"the GGUF conversion cache {str(root)!r}",
        "set ILR_SEARCH_CACHE to a writable folder, or run in a writable folder",
    )
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        write_checkpoint(gguf.file, tmp, source)
        info = {"file": gguf.file.name, "sha256": gguf.sha256, "architecture": gguf.architecture}
        (tmp / INFO_FILE).write_text(json.dumps(info | {"tensor_types": dict(gguf.tensor_types)}, indent=1))
        try:
            os.rename(tmp, gguf.folder)  # atomic: a reader sees the whole folder or none of it
        except OSError:
            if read_converted(gguf.file, gguf.sha256, gguf.folder) is None:  # not another process that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_checkpoint(file: Path, out: Path, source: str) -> None:
    """The model and tokenizer transformers reads from `file`, saved in `out` as save_pretrained writes them. A
    GGUF-loaded model refuses save_pretrained (its quantizer is not serializable), so the weights go into the
    family's class built from the same config without it."""
    import torch
    import transformers

    folder, name = str(file.parent), str(file)  # a local file, never a download
    try:
        loaded, info = quietly(
            lambda: transformers.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, local_files_only=True, dtype=torch.float32, output_loading_info=True
            )
        )
        tokenizer = quietly(
            lambda: transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        )
    except Exception as e:  # transformers' own checks of the file: an architecture it cannot map, a bad tokenizer
        raise CheckpointError(f"checkpoint {source}: transformers cannot read the GGUF file ({one_line(e)})") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers would leave them at random
        raise CheckpointError(
            f"checkpoint {source}: the GGUF file has no tensor for {len(missing)} weight(s), e.g. {missing[0]}"
        )
    settings = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    config = type(loaded.config).from_dict(settings)
    with torch.device("meta"):
        model = type(loaded)(config)
    model.load_state_dict({k: t.to(torch.float32) for k, t in loaded.state_dict().items()}, strict=True, assign=True)
    model.tie_weights()
    quietly(lambda: model.save_pretrained(out))
    quietly(lambda: tokenizer.save_pretrained(out))
    if not (out / "tokenizer.json").is_file():
        raise CheckpointError(f"checkpoint {source}: the GGUF file's tokenizer has no tokenizer.json form")


def quietly(call: Any) -> Any:
    """call(), its progress bars (tqdm writes to the stderr of the moment) and transformers' warnings not shown."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return call()
    finally:
        transformers_logging.set_verbosity(verbosity)


def dequantization_note(gguf: GGUFSource) -> str | None:
    """The line a run says once about a quantized file (None for a file of float tensors only)."""
    kinds = gguf.quantized_types
    if not kinds:
        return None
    named = kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} and {kinds[-1]}"
    return (
        f"note: {gguf.file.name} holds {named} weights, dequantized to float32: this is the quantized model, "
        "not the original"
    )
