"""Task items: the rows a frozen study scores one at a time (`--objective answer|choice|exact` with `--data FILE`).

An item is a prompt and its answer; a multiple-choice item also has its choices, the answer naming the correct one
(its index, or its text). Items come from a local file (JSON lines, JSON, CSV or parquet, read with pandas) or a
`datasets` split already in the local cache (`hf:NAME[:CONFIG][@SPLIT]`, read offline). They are data: read as
values, never run.

Chunks. The race's replicate is a chunk of items, as a window chunk is for held-out text: the items are put in one
fixed shuffled order (the same for every map and run) and dealt out `n` a chunk. Chunk 0 is what the trials are
scored on (the choice), chunks 1, 2, ... what the race decides on; two maps scored on one chunk saw the same items
(paired by item), and chunks never share an item.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ilr_search.config import SpaceConfig
from ilr_search.errors import DataError, first_line

if TYPE_CHECKING:
    from ilr_search.data.tokenizers import Tokenizer

ITEM_ORDER_SEED = 20261203  # the fixed order in which items are dealt into chunks
ITEM_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


@dataclass(frozen=True)
class Item:
    """One item: its row in the source, its prompt and answer (for `choice`: the correct choice's index as
    text), and its choices (empty unless multiple-choice)."""

    row: int
    prompt: str
    answer: str
    choices: tuple[str, ...] = ()

    @property
    def correct(self) -> int:
        """The index of the correct choice (multiple-choice items only)."""
        return int(self.answer)


@dataclass(frozen=True)
class ItemSet:
    """The items of a source, in its row order, and what identifies them (the source and a SHA-256 of its items)."""

    source: str
    items: tuple[Item, ...]
    digest: str

    def __len__(self) -> int:
        return len(self.items)

    def chunks(self, n: int) -> int:
        """How many disjoint chunks of `n` items the set holds."""
        return len(self.items) // n if n > 0 else 0

    def chunk(self, chunk: int, n: int) -> tuple[int, ...]:
        """The rows of chunk `chunk` of `n` items (see the module docstring), in row order."""
        have = self.chunks(n)
        if not 0 <= chunk < have:
            raise DataError(
                f"{self.source} holds {len(self.items)} items: {have} chunk(s) of {n}; chunk {chunk} was asked "
                "for: use more items, fewer a chunk (eval_windows) or fewer chunks (--max-seeds)"
            )
        return deal(len(self.items), chunk, n)


def deal(count: int, chunk: int, n: int) -> tuple[int, ...]:
    """Chunk `chunk` of `n` of `count` units (items, documents) in the one fixed shuffled order, in unit order."""
    order = np.random.default_rng(ITEM_ORDER_SEED).permutation(count)
    return tuple(int(i) for i in np.sort(order[chunk * n : (chunk + 1) * n]))


@dataclass(frozen=True)
class ItemColumns:
    """Which columns hold an item's parts: the prompt, the answer (for `choice`: the correct choice, as its index
    or its text) and, for `choice`, the list of choices."""

    prompt: str = "prompt"
    answer: str = "answer"
    choices: str = ""


def load_items(source: str, columns: ItemColumns) -> ItemSet:
    """The items of `source` (a local file, or hf:NAME[:CONFIG][@SPLIT] from the datasets cache); one error line
    for a missing file, an unreadable one, a missing column, an empty set, or a correct choice that is not among
    its item's choices."""
    rows = _rows(source)
    if not rows:
        raise DataError(f"{source} holds no items")
    needed = [c for c in (columns.prompt, columns.answer, columns.choices) if c]
    missing = [c for c in needed if c not in rows[0]]
    if missing:
        raise DataError(
            f"{source} has no column {missing[0]!r}; its columns are {sorted(rows[0])} (set them with "
            "--text-column, --answer-column and --choices-column)"
        )
    items = tuple(_item(i, row, columns, source) for i, row in enumerate(rows))
    digest = hashlib.sha256(
        json.dumps([[it.prompt, it.answer, list(it.choices)] for it in items]).encode("utf-8")
    ).hexdigest()
    return ItemSet(source, items, digest)


def _rows(source: str) -> list[dict[str, Any]]:
    if source.startswith("hf:"):
        return _cached_split(source)
    path = Path(source).expanduser()
    if not path.is_file():
        raise DataError(f"item file {source!r} does not exist; give a .jsonl, .json, .csv or .parquet file")
    suffix = path.suffix.lower()
    if suffix not in ITEM_SUFFIXES:
        raise DataError(f"item file {source!r}: use .jsonl, .json, .csv or .parquet")
    import pandas as pd

    try:
        if suffix == ".parquet":
            frame = pd.read_parquet(path)
        elif suffix == ".csv":
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        else:
            frame = pd.read_json(path, lines=suffix == ".jsonl", dtype=False)
    except Exception as e:  # pandas raises many types for malformed files
        reason = first_line(e)
        raise DataError(f"cannot read item file {source!r}: {reason[:160]}") from None
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict(orient="records")]


def _cached_split(source: str) -> list[dict[str, Any]]:
    """hf:NAME[:CONFIG][@SPLIT] (split: test, else validation, else train) from the local datasets cache only."""
    import datasets

    spec, _, split = source[3:].partition("@")
    name, _, config = spec.partition(":")
    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()
    try:
        loaded = datasets.load_dataset(name, config or None, download_mode="reuse_cache_if_exists")
    except Exception as e:
        reason = first_line(e)
        raise DataError(
            f"cannot read {source} from the local datasets cache ({reason[:120]}): download it first "
            "(datasets.load_dataset with network access) or give a local file"
        ) from None
    split = split or next((s for s in ("test", "validation", "train") if s in loaded), "")
    if split not in loaded:
        raise DataError(f"{source}: no split {split!r}; it has {sorted(loaded)}")
    return [dict(row) for row in loaded[split]]


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _choices(value: Any, row: int, source: str) -> tuple[str, ...]:
    """A row's choices: a list (JSON lines, parquet, datasets), or a JSON list in a text cell (CSV)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or len(value) < 2:
        raise DataError(f"{source} row {row}: the choices must be a list of two or more texts")
    return tuple(_text(v) for v in value)


def _item(row: int, values: dict[str, Any], columns: ItemColumns, source: str) -> Item:
    prompt, answer = _text(values[columns.prompt]), values[columns.answer]
    if not columns.choices:
        return Item(row, prompt, _text(answer))
    choices = _choices(values[columns.choices], row, source)
    return Item(row, prompt, str(_correct_index(answer, choices, row, source)), choices)


def _correct_index(answer: Any, choices: Sequence[str], row: int, source: str) -> int:
    """The correct choice's index: the answer as an index, else as the text of one of the choices."""
    if isinstance(answer, (int, np.integer)) and not isinstance(answer, bool):
        index = int(answer)
    elif isinstance(answer, str) and answer.strip().lstrip("-").isdigit() and answer.strip() not in choices:
        index = int(answer.strip())
    elif _text(answer) in choices:
        index = list(choices).index(_text(answer))
    else:
        raise DataError(
            f"{source} row {row}: the answer {_text(answer)!r} is neither a choice's index nor one of its "
            f"{len(choices)} choices"
        )
    if not 0 <= index < len(choices):
        raise DataError(f"{source} row {row}: the answer index {index} is outside its {len(choices)} choices")
    return index


ItemKind = Literal["answer", "choice", "exact"]
ITEM_KINDS: tuple[ItemKind, ...] = ("answer", "choice", "exact")


@dataclass(frozen=True)
class Continuation:
    """A token sequence whose last `counted` tokens are scored given the ones before (a choice after its prompt):
    the model reads ids[:-1] and predicts ids[1:]."""

    ids: tuple[int, ...]
    counted: int


@dataclass(frozen=True)
class ItemTask:
    """Items and how they are scored, with the model's tokenizer: `answer` (the mean loss of the answer's tokens
    after the prompt, in nats), `choice` (the correct choice must have the highest summed log-likelihood of its
    tokens after the prompt: lm-eval's multiple-choice `acc`, not length-normalised) or `exact` (greedy decoding
    after the prompt up to `stop` or `max_new_tokens` tokens, compared with the answer after `normalise`). A score
    is a loss: for `choice` and `exact` 0 where the item is right, 1 where it is wrong."""

    kind: ItemKind
    items: ItemSet
    tokenizer: Tokenizer
    stop: str = "\n"
    max_new_tokens: int = 16

    def choice_sequences(self, row: int, seq_len: int) -> list[Continuation]:
        """Item `row`'s prompt followed by each of its choices, left-truncated to seq_len + 1 tokens."""
        item = self.items.items[row]
        return [self._pair(item.prompt, choice, seq_len) for choice in item.choices]

    def answer_sequence(self, row: int, seq_len: int) -> Continuation:
        """Item `row`'s prompt followed by its answer, left-truncated to seq_len + 1 tokens."""
        item = self.items.items[row]
        return self._pair(item.prompt, item.answer, seq_len)

    def prompt_ids(self, row: int, seq_len: int) -> tuple[int, ...]:
        """Item `row`'s prompt, leaving room for `max_new_tokens` within seq_len (left-truncated)."""
        ids = self.tokenizer.encode(self.items.items[row].prompt)
        return tuple(ids[-max(1, seq_len - self.max_new_tokens) :])

    def _pair(self, context: str, continuation: str, seq_len: int) -> Continuation:
        """The context and continuation as lm-eval encodes a pair: spaces that end the context begin the
        continuation, the pair is encoded whole, and the continuation's tokens are those after the context's."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tokenizer.encode(context + continuation)
        context_ids = self.tokenizer.encode(context)
        counted = len(whole) - len(context_ids) if whole[: len(context_ids)] == context_ids else None
        if counted is None or counted < 1:  # the tokens merge across the boundary: encode the two apart
            cont = self.tokenizer.encode(continuation)
            whole, counted = context_ids + cont, len(cont)
        if not context_ids and whole:  # nothing before the first scored token: it is not scored
            counted = min(counted, len(whole) - 1)
        return Continuation(tuple(whole[-(seq_len + 1) :]), min(counted, seq_len))

    def correct(self, row: int, text: str) -> bool:
        """Whether `text` (decoded up to the stop string) is item `row`'s answer, after `normalise`."""
        return normalise(text) == normalise(self.items.items[row].answer)


def normalise(text: str) -> str:
    """What `exact` compares: the text with its whitespace collapsed, its case folded and a trailing period
    dropped."""
    return " ".join(text.split()).casefold().rstrip(".").strip()


def load_task_items(space: SpaceConfig) -> ItemTask:
    """The task items of an `answer` (frozen), `choice` or `exact` study: its --data file's rows, and the model's
    tokenizer."""
    from ilr_search.data.tokenizers import build_tokenizer, parse_tokenizer_spec

    d, objective = space.data, space.search.objective
    if objective not in ITEM_KINDS or (objective == "answer" and space.train.steps != 0):
        raise ValueError(f"objective {objective!r} scores no task items of a file")
    if parse_tokenizer_spec(d.tokenizer).kind == "bpe":
        raise DataError(f"task items are tokenized by the model's own tokenizer, not a trained {d.tokenizer}")
    items = load_items(d.corpus, ItemColumns(d.text_column, d.answer_column, d.choices_column))
    tokenizer = build_tokenizer(d.tokenizer, [], Path("."))
    return ItemTask(objective, items, tokenizer, d.stop, d.max_new_tokens)
