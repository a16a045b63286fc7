"""The token cache: a corpus tokenized once into memory-mapped arrays under the cache folder, then read by
every run. Batches are drawn with common random numbers: the windows depend on (seed, step) only, never on the
model."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ilr_search.config import DataConfig, SpaceConfig
from ilr_search.data.corpora import corpus_identity, split_documents
from ilr_search.data.tokenizers import Tokenizer, build_tokenizer, parse_tokenizer_spec
from ilr_search.errors import DataError
from ilr_search.folders import check_can_create


CACHE_FORMAT = 1
WINDOW_ORDER_SEED = 20261202  # the fixed order in which the held-out windows are dealt into chunks (window_chunk)


def cache_root() -> Path:
    return Path(os.environ.get("ILR_SEARCH_CACHE", "studies/.cache"))


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

    def window_chunks(self, n_windows: int, seq_len: int) -> int:
        """How many disjoint chunks of `n_windows` held-out windows the validation split holds (window_chunk)."""
        return (len(self.val) // (seq_len + 1)) // n_windows

    def window_chunk(self, chunk: int, n_windows: int, seq_len: int) -> np.ndarray:
        """The starts of chunk `chunk` of the held-out windows, the frozen evaluation's unit of noise: the validation
        split cut into disjoint windows of seq_len + 1 tokens, put in one fixed shuffled order (the same for every
        map and run), and dealt out `n_windows` a chunk. Chunks never share a token, so the losses of one map on two
        chunks are independent draws of the text, and two maps on one chunk saw the same text (paired)."""
        chunks = self.window_chunks(n_windows, seq_len)
        if not 0 <= chunk < chunks:
            raise DataError(f"the validation split of {self.meta['corpus']['corpus']} holds {chunks} chunk(s) of "
                            f"{n_windows} disjoint windows of {seq_len + 1} tokens; chunk {chunk} was asked for: use "
                            "more text, a larger val_fraction, fewer eval_windows or fewer --max-seeds")
        total = len(self.val) // (seq_len + 1)
        order = np.random.default_rng(WINDOW_ORDER_SEED).permutation(total)
        return np.sort(order[chunk * n_windows:(chunk + 1) * n_windows]).astype(np.int64) * (seq_len + 1)

    def window_batches(self, starts: np.ndarray, seq_len: int, batch_size: int
                       ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The windows starting at `starts`, `batch_size` at a time, as (inputs, targets)."""
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
    parsed = parse_tokenizer_spec(cfg.tokenizer)
    if parsed.kind == "file":  # a file's tokens are those of its content, not of its name
        identity["tokenizer_sha256"] = hashlib.sha256(parsed.path.read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def load_tokens(cfg: DataConfig, max_train_tokens: int | None = None, root: Path | None = None,
                seq_len: int | None = None) -> TokenData:
    """Token arrays for a corpus and tokenizer: read from the cache, or tokenized once and cached atomically.

    `max_train_tokens` (0 or None: all) bounds how much of a streamed corpus is read; it is part of the key.
    With `seq_len`, a corpus too small for one window of each split is refused before anything is cached.
    """
    parse_tokenizer_spec(cfg.tokenizer)  # a bad spec fails before the corpus is read
    max_tokens = int(max_train_tokens or cfg.max_train_tokens or 0)
    root = Path(root) if root is not None else cache_root()
    final = root / f"tokens-{cache_key(cfg, max_tokens)}"
    if not (final / "meta.json").exists():
        check_can_create(root, f"the token cache {str(root)!r}",  # before the corpus is read
                         "set ILR_SEARCH_CACHE to a writable folder, or run in a writable folder")
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


def _build_cache(cfg: DataConfig, max_tokens: int, root: Path, final: Path, seq_len: int | None) -> None:
    train_texts, val_texts = split_documents(cfg, max_tokens)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        tok = build_tokenizer(cfg.tokenizer, train_texts, tmp / "tokenizer.json")
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


PROBE_TOKENS = 1 << 16  # random tokens per split of a timing probe's data


def random_tokens(vocab_size: int, seq_len: int, seed: int = 0) -> TokenData:
    """In-memory random token ids (nothing is read or cached): for timing only."""
    rng = np.random.default_rng(seed)
    n = max(PROBE_TOKENS, 4 * (seq_len + 1))
    splits = [TokenSplit(rng.integers(0, vocab_size, size=n, dtype=np.int64), None) for _ in range(2)]
    meta = {"tokens": {"train": n, "val": n}, "corpus": {"corpus": "random tokens (probe)"}, "vocab_size": vocab_size}
    return TokenData(splits[0], splits[1], vocab_size, meta, Path("."), built=False)
