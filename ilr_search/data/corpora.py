"""Corpora: the stdlib's sources and docs, local files and folders, and hub datasets, each read as documents
(a key and a text; with an answer column, rows of a prompt and an answer); the key decides the train/validation
split, deterministically, so a row's prompt and answer are always on the same side."""

from __future__ import annotations

import sys
import sysconfig
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from ilr_search.config import DataConfig
from ilr_search.errors import DataError

LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_STDLIB_SKIP = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class Document:
    """One unit of the split: a text, or (answer not None) a prompt/answer row whose text is the prompt."""

    key: str
    text: str
    answer: str | None = None

    @property
    def size(self) -> int:
        """Characters of text (prompt and answer), the split's measure of how much was read."""
        return len(self.text) + len(self.answer or "")


def is_validation(key: str, val_fraction: float) -> bool:
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
    topics: dict[str, str] = {}
    try:
        from pydoc_data import topics as pydoc_topics

        topics = pydoc_topics.topics
    except ImportError:  # pragma: no cover - some distributions strip pydoc_data
        pass
    docs += [(f"pydoc:{name}", text) for name, text in sorted(topics.items())]
    return docs


def _local_files(path: Path) -> list[Path]:
    if not path.exists():
        raise DataError(
            f"data path {str(path)!r} does not exist; give a file or folder of .txt/.jsonl/.parquet/.csv, "
            "`stdlib`, or hf:NAME"
        )
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOCAL_BUILDERS)
    )
    if not files:
        raise DataError(f"no .txt/.jsonl/.json/.parquet/.csv files under {str(path)!r}")
    unsupported = [f for f in files if f.suffix not in LOCAL_BUILDERS]
    if unsupported:
        raise DataError(
            f"{str(unsupported[0])!r} has an unsupported extension; use .txt, .jsonl, .json, .parquet or .csv"
        )
    return files


def local_documents(path: Path, text_column: str, answer_column: str = "") -> Iterator[Document]:
    """Documents of a local file or folder, read through datasets' builders (text, json, parquet, csv); with
    `answer_column`, one prompt/answer row a document (a .txt file has no columns: refused)."""
    import datasets

    files = _local_files(path)
    if all(f.stat().st_size == 0 for f in files):
        raise DataError(f"{str(path)!r} holds no text (empty file); give a non-empty file or folder")
    quiet_datasets()
    for builder in sorted({LOCAL_BUILDERS[f.suffix] for f in files}):
        group = [str(f) for f in files if LOCAL_BUILDERS[f.suffix] == builder]
        kwargs: dict[str, Any] = {"keep_linebreaks": True} if builder == "text" else {}
        try:
            ds = datasets.load_dataset(builder, data_files=group, split="train", **kwargs)
        except Exception as e:  # datasets raises many types for unreadable files
            raise DataError(f"cannot read {group[0]!r} with the {builder} builder: {str(e).splitlines()[0]}") from None
        column = "text" if builder == "text" else text_column
        if answer_column and builder == "text":
            raise DataError(
                f"{group[0]!r} is text without columns; --answer-column needs rows of a prompt and an "
                "answer column (.jsonl, .parquet or .csv)"
            )
        if len(ds) and column not in ds.column_names:
            raise DataError(f"{group[0]!r} has no column {column!r}; pick one of {ds.column_names} with --text-column")
        if answer_column:
            if len(ds) and answer_column not in ds.column_names:
                raise DataError(
                    f"{group[0]!r} has no column {answer_column!r}; pick one of {ds.column_names} with --answer-column"
                )
            for i, row in enumerate(ds):
                yield Document(f"{builder}:{i}", str(row[column] or ""), str(row[answer_column] or ""))
            continue
        # Text files are read line by line: group 64 lines into one document so the split keeps context.
        lines_per_doc = 64 if builder == "text" else 1
        buffer: list[str] = []
        for i, row in enumerate(ds):
            buffer.append(str(row[column] or ""))
            if len(buffer) == lines_per_doc:
                yield Document(f"{builder}:{i // lines_per_doc}", "".join(buffer) if builder == "text" else buffer[0])
                buffer = []
        if buffer:
            yield Document(f"{builder}:end", "".join(buffer))


def quiet_datasets() -> None:
    """Progress bars and logs of `datasets` would break the one-line error and --json contracts."""
    import datasets

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()


def hub_documents(spec: str, text_column: str, answer_column: str = "") -> Iterator[Document]:
    """Stream documents of hf:NAME[:CONFIG] from the hub (with `answer_column`, prompt/answer rows); only as many
    are read as the caller consumes."""
    import datasets

    quiet_datasets()

    name, _, config = spec[3:].partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split="train", streaming=True)
        for i, row in enumerate(ds):
            for column, flag in ((text_column, "--text-column"), (answer_column, "--answer-column")):
                if column and column not in row:
                    raise DataError(f"{spec} has no column {column!r}; pick one of {sorted(row)} with {flag}")
            answer = str(row[answer_column] or "") if answer_column else None
            yield Document(f"hf:{i}", str(row[text_column] or ""), answer)
    except DataError:
        raise
    except Exception as e:
        raise DataError(
            f"cannot load {spec} from the hub ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "it needs network access or a copy in the HF cache; use --data stdlib or a local path offline"
        ) from None


class _Corpus(TypedDict):
    corpus: str


class CorpusIdentity(_Corpus, total=False):
    """The corpus a token cache holds (its key's and its meta.json's "corpus"): the embedded corpus by the
    Python that ships it, a hub dataset by name, local files by path, size and modification time."""

    python: str
    root: str
    text_column: str
    files: list[tuple[str, int, int]]
    answer_column: str


def corpus_identity(cfg: DataConfig) -> CorpusIdentity:
    """What the cache key depends on: the corpus itself, not just its name."""
    if cfg.corpus == "stdlib":
        return {"corpus": "stdlib", "python": sys.version.split()[0], "root": sysconfig.get_path("stdlib")}
    identity: CorpusIdentity
    if cfg.corpus.startswith("hf:"):
        identity = {"corpus": cfg.corpus, "text_column": cfg.text_column}
    else:
        identity = {
            "corpus": str(Path(cfg.corpus).resolve()),
            "text_column": cfg.text_column,
            "files": [(str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in _local_files(Path(cfg.corpus))],
        }
    if cfg.answer_column:  # only where there is one: the keys of the caches of plain text stay what they were
        identity["answer_column"] = cfg.answer_column
    return identity


def documents(cfg: DataConfig) -> Iterator[Document]:
    if cfg.corpus == "stdlib":
        if cfg.answer_column:
            raise DataError(
                f"the embedded corpus (stdlib) has no rows, so no answer column {cfg.answer_column!r}; "
                "give --data a .jsonl/.parquet/.csv file or hf:NAME of prompt/answer rows"
            )
        return iter(Document(key, text) for key, text in stdlib_documents())
    if cfg.corpus.startswith("hf:"):
        return hub_documents(cfg.corpus, cfg.text_column, cfg.answer_column)
    return local_documents(Path(cfg.corpus), cfg.text_column, cfg.answer_column)


def split_documents(cfg: DataConfig, max_tokens: int) -> tuple[list[Document], list[Document]]:
    """The corpus's documents, split by key into training and validation (a small corpus whose keys put none
    in validation holds out its last documents; a single text is cut in two, but never a row)."""
    train: list[Document] = []
    val: list[Document] = []
    approx_train_bytes = 0
    for doc in documents(cfg):
        if not doc.text and not doc.answer:
            continue
        (val if is_validation(doc.key, cfg.val_fraction) else train).append(doc)
        if not is_validation(doc.key, cfg.val_fraction):
            approx_train_bytes += doc.size
        # Streamed corpora stop early: ~4 bytes a token is generous for BPE, exact for bytes is 1.
        if max_tokens and approx_train_bytes >= 4 * max_tokens and val:
            break
    if not train and not val:
        raise DataError(f"corpus {cfg.corpus!r} holds no text; give a non-empty file or folder")
    if not val:  # small corpora: the split by key found nothing; hold out the last ~5% of documents
        n_val = max(1, int(len(train) * cfg.val_fraction))
        if len(train) <= n_val:
            if train[-1].answer is not None:
                raise DataError(
                    f"corpus {cfg.corpus!r} holds {len(train)} row(s); the answer loss needs rows for both "
                    "training and validation"
                )
            # one document: split its text instead, so there is still something to validate on
            doc = train.pop()
            cut = int(len(doc.text) * (1 - cfg.val_fraction))
            train, val = [Document(doc.key, doc.text[:cut])], [Document(doc.key, doc.text[cut:])]
        else:
            train, val = train[:-n_val], train[-n_val:]
    return train, val
