"""Corpora, tokenizers and the token cache.

A corpus is read through HF `datasets` into train and validation documents, tokenized once into
memory-mapped arrays under the cache folder, and then read by every run. Batches are drawn with
common random numbers: the windows depend on (seed, step) only, never on the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import shutil
import sysconfig
import zlib

from .config import DataConfig, ModelConfig, SpaceConfig
from .errors import UserInputError


CACHE_FORMAT = 1
LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_STDLIB_SKIP = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


class DataError(UserInputError):
    """A corpus or tokenizer that cannot be used."""


def cache_root() -> Path:
    return Path(os.environ.get("ILR_SEARCH_CACHE", "studies/.cache"))


# ----------------------------------------------------------------------------------------------------
# Corpora: each yields (document key, text); the key decides the split, deterministically.

def _is_validation(key: str, val_fraction: float) -> bool:
    return zlib.crc32(key.encode("utf-8")) % 10_000 < val_fraction * 10_000


def stdlib_documents() -> list[tuple[str, str]]:
    """The running interpreter's standard library sources (tests excluded) and its pydoc topic texts."""
    root = Path(sysconfig.get_path("stdlib"))
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _STDLIB_SKIP.intersection(rel.parts):
            continue
        try:
            docs.append((rel.as_posix(), path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover - some distributions strip pydoc_data
        topics = {}
    docs += [(f"pydoc:{name}", text) for name, text in sorted(topics.items())]
    return docs


def _local_files(path: Path) -> list[Path]:
    if not path.exists():
        raise DataError(f"data path {str(path)!r} does not exist; give a file or folder of .txt/.jsonl/.parquet/.csv, "
                        "`stdlib`, or hf:NAME")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOCAL_BUILDERS)
    if not files:
        raise DataError(f"no .txt/.jsonl/.json/.parquet/.csv files under {str(path)!r}")
    unsupported = [f for f in files if f.suffix not in LOCAL_BUILDERS]
    if unsupported:
        raise DataError(f"{str(unsupported[0])!r} has an unsupported extension; use .txt, .jsonl, .json, .parquet or .csv")
    return files


def local_documents(path: Path, text_column: str) -> Iterator[tuple[str, str]]:
    """Documents of a local file or folder, read through datasets' builders (text, json, parquet, csv)."""
    import datasets

    files = _local_files(path)
    if all(f.stat().st_size == 0 for f in files):
        raise DataError(f"{str(path)!r} holds no text (empty file); give a non-empty file or folder")
    _quiet_datasets()
    for builder in sorted({LOCAL_BUILDERS[f.suffix] for f in files}):
        group = [str(f) for f in files if LOCAL_BUILDERS[f.suffix] == builder]
        kwargs: dict[str, Any] = {"keep_linebreaks": True} if builder == "text" else {}
        try:
            ds = datasets.load_dataset(builder, data_files=group, split="train", **kwargs)
        except Exception as e:  # datasets raises many types for unreadable files
            raise DataError(f"cannot read {group[0]!r} with the {builder} builder: {str(e).splitlines()[0]}") from None
        column = "text" if builder == "text" else text_column
        if len(ds) and column not in ds.column_names:
            raise DataError(f"{group[0]!r} has no column {column!r}; pick one of {ds.column_names} with --text-column")
        # Text files are read line by line: group 64 lines into one document so the split keeps context.
        lines_per_doc = 64 if builder == "text" else 1
        buffer: list[str] = []
        for i, row in enumerate(ds):
            buffer.append(str(row[column] or ""))
            if len(buffer) == lines_per_doc:
                yield f"{builder}:{i // lines_per_doc}", "".join(buffer) if builder == "text" else buffer[0]
                buffer = []
        if buffer:
            yield f"{builder}:end", "".join(buffer)


def _quiet_datasets() -> None:
    """Progress bars and logs of `datasets` would break the one-line error and --json contracts."""
    import datasets

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()


def hub_documents(spec: str, text_column: str) -> Iterator[tuple[str, str]]:
    """Stream documents of hf:NAME[:CONFIG] from the hub; only as many are read as the caller consumes."""
    import datasets

    _quiet_datasets()

    name, _, config = spec[3:].partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split="train", streaming=True)
        for i, row in enumerate(ds):
            if text_column not in row:
                raise DataError(f"{spec} has no column {text_column!r}; pick one of {sorted(row)} with --text-column")
            yield f"hf:{i}", str(row[text_column] or "")
    except DataError:
        raise
    except Exception as e:
        raise DataError(f"cannot load {spec} from the hub ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                        "it needs network access or a copy in the HF cache; use --data stdlib or a local path offline") from None


def corpus_identity(cfg: DataConfig) -> dict[str, Any]:
    """What the cache key depends on: the corpus itself, not just its name."""
    if cfg.corpus == "stdlib":
        return {"corpus": "stdlib", "python": sys.version.split()[0], "root": sysconfig.get_path("stdlib")}
    if cfg.corpus.startswith("hf:"):
        return {"corpus": cfg.corpus, "text_column": cfg.text_column}
    files = _local_files(Path(cfg.corpus))
    return {"corpus": str(Path(cfg.corpus).resolve()), "text_column": cfg.text_column,
            "files": [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files]}


def documents(cfg: DataConfig) -> Iterator[tuple[str, str]]:
    if cfg.corpus == "stdlib":
        return iter(stdlib_documents())
    if cfg.corpus.startswith("hf:"):
        return hub_documents(cfg.corpus, cfg.text_column)
    return local_documents(Path(cfg.corpus), cfg.text_column)


# ----------------------------------------------------------------------------------------------------
# Tokenizers

class Tokenizer:
    """Turns text into token ids and, per token, the number of UTF-8 bytes of text it covers."""

    spec: str
    vocab_size: int

    def encode_batch(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    spec, vocab_size = "byte", 256

    def encode_batch(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        return [(np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.uint16), None) for t in texts]


class HFTokenizer(Tokenizer):
    """A `tokenizers` tokenizer: trained BPE (bpe:N) or a pretrained one (hf:NAME)."""

    def __init__(self, spec: str, tokenizer: Any) -> None:
        self.spec, self._tok = spec, tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    def encode_batch(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        out = []
        for text, enc in zip(texts, self._tok.encode_batch(texts, add_special_tokens=False)):
            ids = np.asarray(enc.ids, dtype=np.uint32)
            out.append((ids, _bytes_per_token(text, enc.offsets)))
        return out


def _bytes_per_token(text: str, offsets: list[tuple[int, int]]) -> np.ndarray:
    """UTF-8 bytes each token adds: the text up to its end offset, minus what earlier tokens covered."""
    codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    char_bytes = 1 + (codepoints >= 0x80) + (codepoints >= 0x800) + (codepoints >= 0x10000)
    cumulative = np.concatenate([[0], np.cumsum(char_bytes)])
    ends = np.maximum.accumulate(np.asarray([e for _, e in offsets], dtype=np.int64)) if offsets else np.zeros(0, np.int64)
    covered = cumulative[ends]
    return np.diff(covered, prepend=0).astype(np.uint16)


def model_config(space: SpaceConfig, vocab_size: int | None = None) -> ModelConfig:
    """The space's model with its vocabulary: the tokenizer spec's size (bpe:N gives N even where the corpus
    ran out of merges first), so that `flops`, `train`, `run` and `audit` build the same model."""
    return dataclasses.replace(space.model, vocab_size=vocab_size or tokenizer_vocab_size(space.data.tokenizer),
                               max_reuse=space.search.max_reuse)


def check_vocab(cfg: ModelConfig, data_vocab: int) -> None:
    if data_vocab > cfg.vocab_size:
        raise DataError(f"the tokenizer has {data_vocab} ids, more than the model's vocabulary {cfg.vocab_size}")


def tokenizer_vocab_size(spec: str) -> int:
    """The vocabulary size a tokenizer spec gives, without training or loading data where possible."""
    if spec == "byte":
        return 256
    if spec.startswith("bpe:"):
        return _bpe_size(spec)
    if spec.startswith("hf:"):
        return load_pretrained_tokenizer(spec).vocab_size
    raise _unknown_tokenizer(spec)


def _unknown_tokenizer(spec: str) -> DataError:
    return DataError(f"unknown tokenizer {spec!r}; use byte, bpe:N (e.g. bpe:1024) or hf:NAME")


def _bpe_size(spec: str) -> int:
    try:
        size = int(spec[4:])
    except ValueError:
        raise DataError(f"tokenizer {spec!r}: N in bpe:N must be an integer, e.g. bpe:1024") from None
    if not 257 <= size <= 1_000_000:
        raise DataError(f"tokenizer {spec!r}: N must be above 256 (the byte alphabet), e.g. bpe:1024")
    return size


def load_pretrained_tokenizer(spec: str) -> HFTokenizer:
    from tokenizers import Tokenizer as RustTokenizer

    try:
        return HFTokenizer(spec, RustTokenizer.from_pretrained(spec[3:]))
    except Exception as e:
        raise DataError(f"cannot load tokenizer {spec} ({type(e).__name__}); it needs network access or a copy "
                        "in the HF cache; use --tokenizer byte or bpe:N offline") from None


def train_bpe(spec: str, texts: Iterable[str], path: Path) -> HFTokenizer:
    """Train a byte-level BPE tokenizer of vocabulary N on the training split; saved to `path`."""
    from tokenizers import Tokenizer as RustTokenizer, decoders, models, pre_tokenizers, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=_bpe_size(spec), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return HFTokenizer(spec, tok)


# ----------------------------------------------------------------------------------------------------
# The token cache

@dataclass
class TokenSplit:
    tokens: np.ndarray  # memory-mapped token ids
    token_bytes: np.ndarray | None  # UTF-8 bytes per token; None means one byte each (byte tokenizer)

    def __len__(self) -> int:
        return len(self.tokens)

    def bytes_covered(self, starts: np.ndarray, length: int) -> int:
        """UTF-8 bytes of the tokens [s, s + length) summed over the windows starting at `starts`."""
        if self.token_bytes is None:
            return int(len(starts) * length)
        return int(sum(int(self.token_bytes[s:s + length].sum()) for s in starts))


@dataclass
class TokenData:
    train: TokenSplit
    val: TokenSplit
    vocab_size: int
    meta: dict[str, Any]
    path: Path
    built: bool  # True when this call tokenized the corpus; False when it was read from the cache

    def check_window(self, seq_len: int) -> None:
        check_window(self.meta, seq_len)

    def train_batch(self, step: int, batch_size: int, seq_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Windows for one step: a function of (seed, step) only, so every map sees the same batches."""
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, len(self.train) - seq_len, size=batch_size)
        return self._windows(self.train.tokens, starts, seq_len)

    def val_starts(self, n_windows: int, seq_len: int) -> np.ndarray:
        """Fixed, evenly spaced validation windows (the same for every run)."""
        last = len(self.val) - seq_len - 1
        return np.unique(np.linspace(0, last, num=n_windows).astype(np.int64))

    def val_batches(self, n_windows: int, seq_len: int, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        starts = self.val_starts(n_windows, seq_len)
        for i in range(0, len(starts), batch_size):
            yield self._windows(self.val.tokens, starts[i:i + batch_size], seq_len)

    def val_bytes(self, n_windows: int, seq_len: int) -> int:
        """UTF-8 bytes covered by the validation targets (tokens 1..seq_len of each window)."""
        return self.val.bytes_covered(self.val_starts(n_windows, seq_len) + 1, seq_len)

    @staticmethod
    def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        block = tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64)
        return block[:, :-1], block[:, 1:]


def check_window(meta: dict[str, Any], seq_len: int) -> None:
    for name, split in (("training", "train"), ("validation", "val")):
        if meta["tokens"][split] < seq_len + 1:
            raise DataError(f"the {name} split of {meta['corpus']['corpus']} has {meta['tokens'][split]} tokens, fewer "
                            f"than one window of {seq_len + 1}; use more text or a shorter --seq-len")


def cache_key(cfg: DataConfig, max_tokens: int) -> str:
    identity = {"format": CACHE_FORMAT, "corpus": corpus_identity(cfg), "tokenizer": cfg.tokenizer,
                "val_fraction": cfg.val_fraction, "max_train_tokens": max_tokens}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def load_tokens(cfg: DataConfig, max_train_tokens: int | None = None, root: Path | None = None,
                seq_len: int | None = None) -> TokenData:
    """Token arrays for a corpus and tokenizer: read from the cache, or tokenized once and cached atomically.

    `max_train_tokens` (0 or None: all) bounds how much of a streamed corpus is read; it is part of the key.
    With `seq_len`, a corpus too small for one window of each split is refused before anything is cached.
    """
    _check_tokenizer_spec(cfg.tokenizer)
    max_tokens = int(max_train_tokens or cfg.max_train_tokens or 0)
    root = Path(root) if root is not None else cache_root()
    final = root / f"tokens-{cache_key(cfg, max_tokens)}"
    if not (final / "meta.json").exists():
        _build_cache(cfg, max_tokens, root, final, seq_len)
        built = True
    else:
        built = False
    meta = json.loads((final / "meta.json").read_text())
    if seq_len is not None:
        check_window(meta, seq_len)

    def split(name: str) -> TokenSplit:
        tb = final / f"{name}_bytes.npy"
        return TokenSplit(np.load(final / f"{name}.npy", mmap_mode="r"), np.load(tb, mmap_mode="r") if tb.exists() else None)

    return TokenData(split("train"), split("val"), meta["vocab_size"], meta, final, built)


def _check_tokenizer_spec(spec: str) -> None:
    if spec == "byte" or spec.startswith("hf:"):
        return
    if spec.startswith("bpe:"):
        _bpe_size(spec)
        return
    raise _unknown_tokenizer(spec)


def _split_documents(cfg: DataConfig, max_tokens: int) -> tuple[list[str], list[str]]:
    train, val = [], []
    approx_train_bytes = 0
    for key, text in documents(cfg):
        if not text:
            continue
        (val if _is_validation(key, cfg.val_fraction) else train).append(text)
        if not _is_validation(key, cfg.val_fraction):
            approx_train_bytes += len(text)
        # Streamed corpora stop early: ~4 bytes a token is generous for BPE, exact for bytes is 1.
        if max_tokens and approx_train_bytes >= 4 * max_tokens and val:
            break
    if not train and not val:
        raise DataError(f"corpus {cfg.corpus!r} holds no text; give a non-empty file or folder")
    if not val:  # small corpora: the split by key found nothing; hold out the last ~5% of documents
        n_val = max(1, int(len(train) * cfg.val_fraction))
        if len(train) <= n_val:
            # one document: split its text instead, so there is still something to validate on
            text = train.pop()
            cut = int(len(text) * (1 - cfg.val_fraction))
            train, val = [text[:cut]], [text[cut:]]
        else:
            train, val = train[:-n_val], train[-n_val:]
    return train, val


def _build_cache(cfg: DataConfig, max_tokens: int, root: Path, final: Path, seq_len: int | None) -> None:
    train_texts, val_texts = _split_documents(cfg, max_tokens)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        if cfg.tokenizer == "byte":
            tok: Tokenizer = ByteTokenizer()
        elif cfg.tokenizer.startswith("bpe:"):
            tok = train_bpe(cfg.tokenizer, train_texts, tmp / "tokenizer.json")
        else:
            tok = load_pretrained_tokenizer(cfg.tokenizer)
        dtype = np.uint16 if tok.vocab_size <= 65536 else np.uint32
        counts = {}
        for name, texts in (("train", train_texts), ("val", val_texts)):
            ids, nbytes = _encode_all(tok, texts, max_tokens if name == "train" else 0)
            np.save(tmp / f"{name}.npy", ids.astype(dtype))
            if nbytes is not None:
                np.save(tmp / f"{name}_bytes.npy", nbytes)
            counts[name] = int(len(ids))
        meta = {"format": CACHE_FORMAT, "corpus": corpus_identity(cfg), "tokenizer": cfg.tokenizer,
                "vocab_size": tok.vocab_size, "tokens": counts,
                "documents": {"train": len(train_texts), "val": len(val_texts)}}
        if seq_len is not None:
            check_window(meta, seq_len)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, final)  # atomic: a reader sees the whole cache entry or none of it
        except OSError:
            if not (final / "meta.json").exists():  # not another process that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _encode_all(tok: Tokenizer, texts: list[str], max_tokens: int) -> tuple[np.ndarray, np.ndarray | None]:
    ids, nbytes, total = [], [], 0
    for i in range(0, len(texts), 256):
        for doc_ids, doc_bytes in tok.encode_batch(texts[i:i + 256]):
            ids.append(doc_ids)
            nbytes.append(doc_bytes)
            total += len(doc_ids)
        if max_tokens and total >= max_tokens:
            break
    if not ids:
        return np.zeros(0, np.uint32), None
    all_ids = np.concatenate(ids)
    all_bytes = None if nbytes[0] is None else np.concatenate(nbytes)
    if max_tokens:
        all_ids = all_ids[:max_tokens]
        all_bytes = None if all_bytes is None else all_bytes[:max_tokens]
    return all_ids, all_bytes


def load_space_tokens(space: SpaceConfig) -> TokenData:
    """The tokens a space's runs read. A streamed hub corpus is read only as far as the runs need: as many
    training tokens as one proxy trains on (its cap, if the space sets one, wins); local corpora are read whole."""
    needed = space.data.max_train_tokens
    if not needed and space.data.corpus.startswith("hf:"):
        needed = space.train.tokens(space.model.seq_len)
    return load_tokens(space.data, max_train_tokens=needed, seq_len=space.model.seq_len)
