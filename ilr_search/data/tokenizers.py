"""Tokenizers: bytes, byte-level BPE trained on the corpus (bpe:N), pretrained ones (hf:NAME) and a
tokenizer.json file (file:PATH, a checkpoint's); each gives token ids and, per token, the UTF-8 bytes of text it
covers (for bits per byte)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ilr_search.config import ModelConfig, SpaceConfig
from ilr_search.errors import DataError


class Tokenizer:
    """Turns text into token ids and, per token, the number of UTF-8 bytes of text it covers."""

    spec: str
    vocab_size: int

    def encode_batch(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """One text's token ids."""
        return [int(i) for i in self.encode_batch([text])[0][0]]

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    spec, vocab_size = "byte", 256

    def encode_batch(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        return [(np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.uint16), None) for t in texts]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A `tokenizers` tokenizer: trained BPE (bpe:N), a pretrained one (hf:NAME) or a file's (file:PATH)."""

    def __init__(self, spec: str, tokenizer: Any) -> None:
        self.spec, self._tok = spec, tokenizer
        self.vocab_size = tokenizer.get_vocab_size()

    def encode_batch(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        out: list[tuple[np.ndarray, np.ndarray | None]] = []
        for text, enc in zip(texts, self._tok.encode_batch(texts, add_special_tokens=False), strict=True):
            ids = np.asarray(enc.ids, dtype=np.uint32)
            out.append((ids, _bytes_per_token(text, enc.offsets)))
        return out

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=False))


def _bytes_per_token(text: str, offsets: list[tuple[int, int]]) -> np.ndarray:
    """UTF-8 bytes each token adds: the text up to its end offset, minus what earlier tokens covered."""
    codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    char_bytes = 1 + (codepoints >= 0x80) + (codepoints >= 0x800) + (codepoints >= 0x10000)
    cumulative = np.concatenate([[0], np.cumsum(char_bytes)])
    ends = (
        np.maximum.accumulate(np.asarray([e for _, e in offsets], dtype=np.int64)) if offsets else np.zeros(0, np.int64)
    )
    covered = cumulative[ends]
    return np.diff(covered, prepend=0).astype(np.uint16)


def model_config(space: SpaceConfig, vocab_size: int | None = None) -> ModelConfig:
    """The space's model with its vocabulary: the tokenizer spec's size (bpe:N gives N even where the corpus
    ran out of merges first), so that `flops`, `train`, `run` and `audit` build the same model. A model that
    starts from a checkpoint (`init`) keeps the checkpoint's vocabulary (its tokenizer may use fewer ids)."""
    if not vocab_size:
        vocab_size = space.model.vocab_size if space.model.init else tokenizer_vocab_size(space.data.tokenizer)
    return dataclasses.replace(space.model, vocab_size=vocab_size, max_reuse=space.search.max_reuse)


def check_vocab(cfg: ModelConfig, data_vocab: int) -> None:
    if data_vocab > cfg.vocab_size:
        raise DataError(f"the tokenizer has {data_vocab} ids, more than the model's vocabulary {cfg.vocab_size}")


@dataclass(frozen=True)
class TokenizerSpec:
    """A parsed `--tokenizer`: byte, bpe:N (trained on the corpus), hf:NAME (pretrained) or file:PATH (a
    tokenizer.json)."""

    spec: str
    kind: Literal["byte", "bpe", "hf", "file"]
    bpe_size: int = 0  # N of bpe:N

    @property
    def path(self) -> Path:
        """file:PATH's path."""
        return Path(self.spec[5:])


def parse_tokenizer_spec(spec: str) -> TokenizerSpec:
    if spec == "byte":
        return TokenizerSpec(spec, "byte")
    if spec.startswith("hf:"):
        return TokenizerSpec(spec, "hf")
    if spec.startswith("file:"):
        parsed = TokenizerSpec(spec, "file")
        if not parsed.path.is_file():
            raise DataError(f"tokenizer {spec!r}: no such file; file:PATH names a tokenizer.json")
        return parsed
    if spec.startswith("bpe:"):
        try:
            size = int(spec[4:])
        except ValueError:
            raise DataError(f"tokenizer {spec!r}: N in bpe:N must be an integer, e.g. bpe:1024") from None
        if not 257 <= size <= 1_000_000:
            raise DataError(
                f"tokenizer {spec!r}: N must be 257 to 1,000,000 (above the byte alphabet of 256), e.g. bpe:1024"
            )
        return TokenizerSpec(spec, "bpe", size)
    raise DataError(f"unknown tokenizer {spec!r}; use byte, bpe:N (e.g. bpe:1024), hf:NAME or file:PATH")


def tokenizer_vocab_size(spec: str) -> int:
    """The vocabulary size a tokenizer spec gives, without training or loading data where possible."""
    parsed = parse_tokenizer_spec(spec)
    if parsed.kind == "byte":
        return ByteTokenizer.vocab_size
    if parsed.kind == "bpe":
        return parsed.bpe_size
    if parsed.kind == "file":
        return load_tokenizer_file(parsed).vocab_size
    return load_pretrained_tokenizer(spec).vocab_size


def build_tokenizer(spec: str, train_texts: list[str], path: Path) -> Tokenizer:
    """The tokenizer a spec names; bpe:N is trained on `train_texts` and saved to `path`."""
    parsed = parse_tokenizer_spec(spec)
    if parsed.kind == "byte":
        return ByteTokenizer()
    if parsed.kind == "bpe":
        return train_bpe(parsed, train_texts, path)
    if parsed.kind == "file":
        return load_tokenizer_file(parsed)
    return load_pretrained_tokenizer(spec)


def load_tokenizer_file(parsed: TokenizerSpec) -> HFTokenizer:
    """file:PATH's tokenizer.json."""
    from tokenizers import Tokenizer as RustTokenizer

    try:
        return HFTokenizer(parsed.spec, RustTokenizer.from_file(str(parsed.path)))
    except Exception as e:
        raise DataError(f"tokenizer {parsed.spec}: not a tokenizer.json ({type(e).__name__})") from None


def load_pretrained_tokenizer(spec: str) -> HFTokenizer:
    from tokenizers import Tokenizer as RustTokenizer

    try:
        return HFTokenizer(spec, RustTokenizer.from_pretrained(spec[3:]))
    except Exception as e:
        raise DataError(
            f"cannot load tokenizer {spec} ({type(e).__name__}); it needs network access or a copy "
            "in the HF cache; use --tokenizer byte or bpe:N offline"
        ) from None


def train_bpe(spec: TokenizerSpec, texts: Iterable[str], path: Path) -> HFTokenizer:
    """Train a byte-level BPE tokenizer of vocabulary N on the training split; saved to `path`."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.bpe_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return HFTokenizer(spec.spec, tok)


def byte_level_symbols() -> list[str]:
    """The printable character byte-level BPE writes for each byte value 0..255 (GPT-2's table: printable
    Latin-1 bytes stand for themselves, the others for the characters from U+0100 on, in order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def byte_tokenizer_model() -> Any:
    """ByteTokenizer as a `tokenizers` Tokenizer, for tools that read tokenizer.json (transformers' AutoTokenizer):
    each byte of the UTF-8 text is one token whose id is the byte's value, as ByteTokenizer encodes it (byte-level
    symbols, a BPE model with no merges, no pre-tokenizing regex and no prefix space)."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {symbol: b for b, symbol in enumerate(byte_level_symbols())}
    tok = RustTokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok
