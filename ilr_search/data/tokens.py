"""The token cache: a corpus tokenized once into memory-mapped arrays under the cache folder, then read by
every run. Batches are drawn with common random numbers: the windows depend on (seed, step) only, never on the
model.

Prompt/answer rows (DataConfig.answer_column) are cached as a stream of prompt, answer and end-of-row tokens, with
a parallel uint8 answer mask (1 on answer tokens). Their windows' targets are IGNORE_INDEX where they are not an
answer's, so the loss is on the answers only. Their validation windows are one a row: each ends at its row's
answer, left-truncated to seq_len, and counts that row's answer alone."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from ilr_search.config import DataConfig, SpaceConfig
from ilr_search.data.corpora import Document, corpus_identity, split_documents
from ilr_search.data.tokenizers import Tokenizer, build_tokenizer, parse_tokenizer_spec
from ilr_search.errors import DataError
from ilr_search.folders import check_can_create

CACHE_FORMAT = 1
IGNORE_INDEX = -100  # a target that is not counted (not an answer token): linear_cross_entropy's ignore_index
ROW_END = "\n"  # the text that ends each prompt/answer row in the stream
WINDOW_ORDER_SEED = 20261202  # the fixed order in which the held-out windows are dealt into chunks (window_chunk)


def cache_root() -> Path:
    return Path(os.environ.get("ILR_SEARCH_CACHE", "studies/.cache"))


@dataclass
class TokenSplit:
    tokens: np.ndarray  # memory-mapped token ids
    token_bytes: np.ndarray | None  # UTF-8 bytes per token; None means one byte each (byte tokenizer)
    answer_mask: np.ndarray | None = None  # uint8, 1 on answer tokens; None: no answers (documents of text)
    _spans: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)

    def bytes_covered(self, starts: np.ndarray, length: int) -> int:
        """UTF-8 bytes of the tokens [s, s + length) summed over the windows starting at `starts`."""
        if self.token_bytes is None:
            return int(len(starts) * length)
        return int(sum(int(self.token_bytes[s : s + length].sum()) for s in starts))

    def bytes_between(self, begins: np.ndarray, ends: np.ndarray) -> int:
        """UTF-8 bytes of the tokens [b, e) summed over the pairs of `begins` and `ends`."""
        if self.token_bytes is None:
            return int((ends - begins).sum())
        return int(sum(int(self.token_bytes[b:e].sum()) for b, e in zip(begins, ends, strict=True)))

    def answer_spans(self) -> tuple[np.ndarray, np.ndarray]:
        """(begins, ends): each answer's tokens [begin, end), in stream order (rows end with a token outside the
        mask, so each run of the mask's ones is one row's answer)."""
        if self.answer_mask is None:
            raise ValueError("this split has no answer mask")
        if self._spans is None:
            edges = np.diff(np.concatenate(([0], np.asarray(self.answer_mask, dtype=np.int8), [0])))
            self._spans = (np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))
        return self._spans


@dataclass(frozen=True)
class Windows:
    """Windows of seq_len + 1 tokens starting at `starts`, each counting the targets at positions [begins, ends)
    of the split (documents of text: all its targets; prompt/answer rows: its row's answer)."""

    starts: np.ndarray
    begins: np.ndarray
    ends: np.ndarray


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

    @property
    def answers_only(self) -> bool:
        """Prompt/answer rows: the loss counts the answer tokens only (targets IGNORE_INDEX elsewhere)."""
        return self.train.answer_mask is not None

    @property
    def ignore_index(self) -> int | None:
        """The target value the loss must not count: IGNORE_INDEX for prompt/answer rows, None otherwise."""
        return IGNORE_INDEX if self.answers_only else None

    def train_batch(self, step: int, batch_size: int, seq_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Windows for one step: a function of (seed, step) only, so every map sees the same batches. With
        answers, targets that are not an answer's are IGNORE_INDEX."""
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, len(self.train) - seq_len, size=batch_size)
        x, y = self._windows(self.train.tokens, starts, seq_len)
        if self.train.answer_mask is not None:
            counted = self.train.answer_mask[starts[:, None] + 1 + np.arange(seq_len)].astype(bool)
            y = np.where(counted, y, IGNORE_INDEX)
        return x, y

    def val_starts(self, n_windows: int, seq_len: int) -> np.ndarray:
        """Fixed validation windows (the same for every run): evenly spaced, or with answers one each for evenly
        spaced rows (val_windows)."""
        return self.val_windows(n_windows, seq_len).starts

    def val_windows(self, n_windows: int, seq_len: int) -> Windows:
        """The fixed validation windows: evenly spaced over the split, counting every target; with answers, the
        windows of `n_windows` evenly spaced rows (answer_windows)."""
        if self.answers_only:
            rows = len(self.val.answer_spans()[0])
            return self.answer_windows(np.unique(np.linspace(0, rows - 1, num=n_windows).astype(np.int64)), seq_len)
        last = len(self.val) - seq_len - 1
        starts = np.unique(np.linspace(0, last, num=n_windows).astype(np.int64))
        return Windows(starts, starts + 1, starts + 1 + seq_len)

    def answer_windows(self, rows: np.ndarray, seq_len: int) -> Windows:
        """One window for each answer of the validation split numbered in `rows`: it ends at the answer's last
        token (it starts at the split's first where the text before is shorter), left-truncated to seq_len
        targets, and counts that answer's tokens alone."""
        answer_begins, answer_ends = self.val.answer_spans()
        ends = answer_ends[rows]
        starts = np.maximum(0, ends - 1 - seq_len)
        return Windows(starts, np.maximum(answer_begins[rows], starts + 1), ends)

    def val_batches(self, n_windows: int, seq_len: int, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self.window_batches(self.val_windows(n_windows, seq_len), seq_len, batch_size)

    def window_batches(
        self, windows: Windows, seq_len: int, batch_size: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The validation windows `windows`, `batch_size` at a time, as (inputs, targets); with answers, the
        targets each window does not count are IGNORE_INDEX."""
        for i in range(0, len(windows.starts), batch_size):
            part = slice(i, i + batch_size)
            x, y = self._windows(self.val.tokens, windows.starts[part], seq_len)
            if self.answers_only:
                positions = windows.starts[part, None] + 1 + np.arange(seq_len)
                counted = (positions >= windows.begins[part, None]) & (positions < windows.ends[part, None])
                y = np.where(counted, y, IGNORE_INDEX)
            yield x, y

    def window_chunks(self, n_windows: int, seq_len: int) -> int:
        """How many disjoint chunks of `n_windows` held-out windows the validation split holds (window_chunk)."""
        return self._chunk_units(seq_len) // n_windows

    def _chunk_units(self, seq_len: int) -> int:
        """What window_chunk deals into chunks: the disjoint windows of seq_len + 1 tokens, or the answer rows."""
        return len(self.val.answer_spans()[0]) if self.answers_only else len(self.val) // (seq_len + 1)

    def window_chunk(self, chunk: int, n_windows: int, seq_len: int) -> Windows:
        """Chunk `chunk` of the held-out windows, the frozen evaluation's unit of noise: the validation split cut
        into disjoint windows of seq_len + 1 tokens (with answers: its rows, each row's window as val_windows makes
        it), put in one fixed shuffled order (the same for every map and run), and dealt out `n_windows` a chunk.
        Chunks never share a counted token, so the losses of one map on two chunks are independent draws of the
        text, and two maps on one chunk saw the same text (paired)."""
        chunks = self.window_chunks(n_windows, seq_len)
        if not 0 <= chunk < chunks:
            raise DataError(
                f"the validation split of {self.meta['corpus']['corpus']} holds {chunks} chunk(s) of "
                f"{n_windows} disjoint windows of {seq_len + 1} tokens; chunk {chunk} was asked for: use "
                "more text, a larger val_fraction, fewer eval_windows or fewer --max-seeds"
            )
        order = np.random.default_rng(WINDOW_ORDER_SEED).permutation(self._chunk_units(seq_len))
        units = np.sort(order[chunk * n_windows : (chunk + 1) * n_windows]).astype(np.int64)
        if self.answers_only:
            return self.answer_windows(units, seq_len)
        starts = units * (seq_len + 1)
        return Windows(starts, starts + 1, starts + 1 + seq_len)

    def val_bytes(self, n_windows: int, seq_len: int) -> int:
        """UTF-8 bytes covered by the counted validation targets (tokens 1..seq_len of each window; with
        answers, the answers' tokens)."""
        if not self.answers_only:
            return self.val.bytes_covered(self.val_starts(n_windows, seq_len) + 1, seq_len)
        windows = self.val_windows(n_windows, seq_len)
        return self.val.bytes_between(windows.begins, windows.ends)

    @staticmethod
    def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        block = tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64)
        return block[:, :-1], block[:, 1:]


def counted_targets(targets: np.ndarray) -> int:
    """How many of `targets` the loss counts (those not IGNORE_INDEX)."""
    return int(np.count_nonzero(targets != IGNORE_INDEX))


def check_window(meta: dict[str, Any], seq_len: int) -> None:
    for name, split in (("training", "train"), ("validation", "val")):
        if meta["tokens"][split] < seq_len + 1:
            raise DataError(
                f"the {name} split of {meta['corpus']['corpus']} has {meta['tokens'][split]} tokens, fewer "
                f"than one window of {seq_len + 1}; use more text or a shorter --seq-len"
            )
        if "answers" in meta and not meta["answers"][split]:
            raise DataError(
                f"the {name} split of {meta['corpus']['corpus']} holds no answer tokens (column "
                f"{meta['answer_column']!r} is empty there); the answer loss needs answers in both splits"
            )


def cache_key(cfg: DataConfig, max_tokens: int) -> str:
    identity = {
        "format": CACHE_FORMAT,
        "corpus": corpus_identity(cfg),
        "tokenizer": cfg.tokenizer,
        "val_fraction": cfg.val_fraction,
        "max_train_tokens": max_tokens,
    }
    parsed = parse_tokenizer_spec(cfg.tokenizer)
    if parsed.kind == "file":  # a file's tokens are those of its content, not of its name or folder
        identity["tokenizer"] = "file"
        identity["tokenizer_sha256"] = hashlib.sha256(parsed.path.read_bytes()).hexdigest()
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def load_tokens(
    cfg: DataConfig, max_train_tokens: int | None = None, root: Path | None = None, seq_len: int | None = None
) -> TokenData:
    """Token arrays for a corpus and tokenizer: read from the cache, or tokenized once and cached atomically.

    `max_train_tokens` (0 or None: all) bounds how much of a streamed corpus is read; it is part of the key.
    With `seq_len`, a corpus too small for one window of each split is refused before anything is cached.
    """
    parse_tokenizer_spec(cfg.tokenizer)  # a bad spec fails before the corpus is read
    max_tokens = int(max_train_tokens or cfg.max_train_tokens or 0)
    root = Path(root) if root is not None else cache_root()
    final = root / f"tokens-{cache_key(cfg, max_tokens)}"
    if not (final / "meta.json").exists():
        check_can_create(
            root,
            f"the token cache {str(root)!r}",  # before the corpus is read
            "set ILR_SEARCH_CACHE to a writable folder, or run in a writable folder",
        )
        _build_cache(cfg, max_tokens, root, final, seq_len)
        built = True
    else:
        built = False
    meta = json.loads((final / "meta.json").read_text())
    if seq_len is not None:
        check_window(meta, seq_len)

    def split(name: str) -> TokenSplit:
        tb, mask = final / f"{name}_bytes.npy", final / f"{name}_answer_mask.npy"
        return TokenSplit(
            np.load(final / f"{name}.npy", mmap_mode="r"),
            np.load(tb, mmap_mode="r") if tb.exists() else None,
            np.load(mask, mmap_mode="r") if mask.exists() else None,
        )

    return TokenData(split("train"), split("val"), meta["vocab_size"], meta, final, built)


def _build_cache(cfg: DataConfig, max_tokens: int, root: Path, final: Path, seq_len: int | None) -> None:
    train_docs, val_docs = split_documents(cfg, max_tokens)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        tok = build_tokenizer(cfg.tokenizer, [document_text(d) for d in train_docs], tmp / "tokenizer.json")
        dtype = np.uint16 if tok.vocab_size <= 65536 else np.uint32
        counts, answers = {}, {}
        for name, docs in (("train", train_docs), ("val", val_docs)):
            ids, nbytes, mask = _encode_all(tok, docs, max_tokens if name == "train" else 0)
            np.save(tmp / f"{name}.npy", ids.astype(dtype))
            if nbytes is not None:
                np.save(tmp / f"{name}_bytes.npy", nbytes)
            if mask is not None:
                np.save(tmp / f"{name}_answer_mask.npy", mask)
                answers[name] = int(mask.sum())
            counts[name] = int(len(ids))
        meta = {
            "format": CACHE_FORMAT,
            "corpus": corpus_identity(cfg),
            "tokenizer": cfg.tokenizer,
            "vocab_size": tok.vocab_size,
            "tokens": counts,
            "documents": {"train": len(train_docs), "val": len(val_docs)},
        }
        if cfg.answer_column:
            meta |= {"answer_column": cfg.answer_column, "answers": answers}
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


def document_text(doc: Document) -> str:
    """A document's text as the stream holds it: a row's prompt, answer and ROW_END."""
    return doc.text if doc.answer is None else doc.text + doc.answer + ROW_END


def _encode_all(
    tok: Tokenizer, docs: list[Document], max_tokens: int
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The documents' token ids, bytes per token (None: one each) and, for rows, the answer mask (else None).
    A row is its prompt's tokens, its answer's and ROW_END's, each part tokenized alone so that the mask is exact."""
    rows = bool(docs) and docs[0].answer is not None
    row_end = tok.encode_batch([ROW_END])[0]
    ids: list[np.ndarray] = []
    nbytes: list[np.ndarray | None] = []  # one tokenizer: bytes for every part or for none
    masks: list[np.ndarray] = []
    total = 0
    for i in range(0, len(docs), 256):
        batch = docs[i : i + 256]
        if not rows:
            parts = [[encoded] for encoded in tok.encode_batch([d.text for d in batch])]
        else:
            encoded = tok.encode_batch([t for d in batch for t in (d.text, d.answer or "")])
            parts = [[encoded[2 * j], encoded[2 * j + 1], row_end] for j in range(len(batch))]
        for doc_parts in parts:
            for k, (part_ids, part_bytes) in enumerate(doc_parts):
                ids.append(part_ids)
                nbytes.append(part_bytes)
                if rows:
                    masks.append(np.full(len(part_ids), k == 1, dtype=np.uint8))
                total += len(part_ids)
        if max_tokens and total >= max_tokens:
            break
    if not ids:
        return np.zeros(0, np.uint32), None, np.zeros(0, np.uint8) if rows else None
    all_ids = np.concatenate(ids)
    all_bytes = None if nbytes[0] is None else np.concatenate(cast(list[np.ndarray], nbytes))
    all_mask = np.concatenate(masks) if rows else None
    if max_tokens:
        all_ids = all_ids[:max_tokens]
        all_bytes = None if all_bytes is None else all_bytes[:max_tokens]
        all_mask = None if all_mask is None else all_mask[:max_tokens]
    return all_ids, all_bytes, all_mask


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
