"""Task items scored by lm-evaluation-harness in process (the `eval` extra): one job, a model running a schedule
scored document by document on an lm-eval task, with no files written.

- check_task finds a task in lm-eval's registry, or in a local folder of task YAML files (`--tasks-path`), loads
  its data and says what an item's score is (TaskInfo), or refuses in one line what cannot be scored per item;
- lm_eval_scores scores chosen documents of it: the model unrolled in memory (pretrained.unrolled_hf_model) and
  wrapped in lm-eval's HFLM with the checkpoint's tokenizer, through lm_eval.simple_evaluate with its per-sample
  log (log_samples) and only those documents (`samples`), no output path, request cache or write-out.

An item's score is the task's first metric that lm-eval averages over items (its aggregation is `mean`), taken
from the first filter's samples: acc for a multiple-choice task (1 when the choice with the highest summed
log-likelihood of `target_delimiter + choice` given the context is the target, not divided by the choice's
length; acc_norm divides by its length in characters), exact_match for a generation task. Documents are
numbered as lm-eval numbers them: their order in the split it evaluates (test, else validation).

The scores are deterministic: no sampled generation (refused), and simple_evaluate is asked not to reseed the
process's global random generators (other threads may be building models from them). A task with few-shot
examples draws them from lm-eval's sampler, seeded afresh in each call and drawn in document order: the same
doc_ids give the same prompts (candidates scored on the same chunk see the same prompts), but a document's
prompt can depend on the other documents scored with it.

A local task folder is data, not code: its YAML files (and those they include, outside lm-eval's own tasks) may
not name Python (`!function`) nor metrics that lm-eval would fetch from the hub (`hf_evaluate`, or a name lm-eval
does not register). Its Jinja templates (doc_to_text, ...) are rendered by lm-eval and not checked here.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ilr_search.errors import UserInputError, first_line
from ilr_search.training.pretrained import CheckpointError, unrolled_hf_model

if TYPE_CHECKING:
    from ilr_search.training.model import BranchScale, ILRTransformer

INSTALL = "pip install 'ilr-search[eval]'"
# lm-eval's output types whose items each get a number averaged into the task's score.
PER_ITEM_OUTPUT_TYPES = ("multiple_choice", "loglikelihood", "generate_until")
# The metrics lm-eval scores 0 or 1 per item (multiple choice and single-answer loglikelihood, generation matches).
BINARY_METRICS = frozenset({"acc", "acc_norm", "acc_bytes", "acc_mutual_info", "exact_match"})
# What HFLM logs at WARNING each time it wraps a model object (that it ignores its loading arguments): expected
# here, where every candidate is such an object, so dropped.
HFLM_OBJECT_WARNINGS = (
    "`pretrained` model kwarg is not of type `str`",
    "Passed an already-initialized model through `pretrained`",
)


class TaskError(UserInputError):
    """An lm-eval task that cannot be found, loaded, or scored per item."""


@dataclass(frozen=True)
class TaskInfo:
    """A task as lm-eval evaluates it: its name, the number of documents in the split it evaluates, the metric
    that is an item's score, whether that score is 0 or 1, and whether higher is better."""

    name: str
    n_docs: int
    metric: str
    binary: bool
    higher_is_better: bool


@dataclass(frozen=True)
class TaskScores:
    """The scores of documents of a task: scores[i] is document doc_ids[i]'s value of `metric`."""

    task: str
    metric: str
    binary: bool
    higher_is_better: bool
    doc_ids: tuple[int, ...]
    scores: tuple[float, ...]


def lm_eval_module() -> Any:
    """lm_eval with its HFLM model class (which needs transformers and accelerate), or one line saying how to
    install them."""
    try:
        import lm_eval
        import lm_eval.models.huggingface  # noqa: F401  # HFLM
    except ImportError:
        raise TaskError(f"lm-eval tasks need lm-eval; {INSTALL}") from None
    return lm_eval


@contextlib.contextmanager
def stderr_dropped() -> Iterator[None]:
    """The process's standard error (file descriptor 2, where subprocesses and C code write too) sent to the null
    device for the duration: what lm-eval prints there is not the command's to show. Errors still raise."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def check_task(task: str, tasks_path: Path | None) -> TaskInfo:
    """The lm-eval task `task`: from lm-eval's registry, or with `tasks_path` from that folder of task YAML files;
    its data loaded (from the datasets cache or a local file). Raises TaskError (one line) for a task that is
    unknown, a group, not loadable (offline and not cached, a missing data file), or not scorable per item."""
    return load_task(task, tasks_path)[0]


@dataclass(frozen=True)
class LmEvalTask:
    """An lm-eval task a frozen study scores (`--objective lm-eval:TASK`): the task (its 0/1 metric per document),
    its local task folder, and the checkpoint's tokenizer folder and transformers family that its candidates are
    unrolled into. Its documents are dealt into chunks as items are (data/items.deal)."""

    info: TaskInfo
    tasks_path: Path | None
    tokenizer_dir: Path
    family: str

    def chunks(self, n: int) -> int:
        return self.info.n_docs // n if n > 0 else 0

    def chunk(self, chunk: int, n: int) -> tuple[int, ...]:
        from ilr_search.data.items import deal

        if not 0 <= chunk < self.chunks(n):
            raise TaskError(
                f"lm-eval task {self.info.name} has {self.info.n_docs} documents: {self.chunks(n)} chunk(s) of {n}; "
                f"chunk {chunk} was asked for: use fewer a chunk (eval_windows) or fewer chunks (--max-seeds)"
            )
        return deal(self.info.n_docs, chunk, n)


def lm_eval_task(task: str, tasks_path: str, init: str) -> LmEvalTask:
    """The LmEvalTask of `--objective lm-eval:TASK` on the checkpoint `init`; one error line for a task whose
    metric is not 0 or 1 per document (the race's paired test of items)."""
    from ilr_search.training.pretrained import open_checkpoint, resolve_source

    path = Path(tasks_path) if tasks_path else None
    info = check_task(task, path)
    if not info.binary:
        raise TaskError(
            f"lm-eval task {info.name} scores each document by {info.metric}, not 0 or 1; --objective lm-eval "
            "races tasks scored right or wrong per document (acc, exact_match)"
        )
    return LmEvalTask(info, path, resolve_source(init), open_checkpoint(init, seq_len=1).family)


def lm_eval_scores(
    model: ILRTransformer,
    schedule: Sequence[int],
    tokenizer_dir: Path,
    family: str,
    task: str,
    tasks_path: Path | None,
    doc_ids: Sequence[int],
    batch_size: int = 8,
    scales: Sequence[BranchScale] | None = None,
) -> TaskScores:
    """The scores of documents `doc_ids` (a repeated id gets its document's score again) of `task` for `model`
    running `schedule` (each position's branches times `scales`, model.branch_scales of the model's config where not
    given), written as transformers' `family` in memory, with the tokenizer that AutoTokenizer reads from
    `tokenizer_dir` (the checkpoint's folder), on the model's device."""
    lm_eval = lm_eval_module()
    tasks_path = None if tasks_path is None else Path(tasks_path)
    info, task_obj = load_task(task, tasks_path)
    ids = tuple(int(i) for i in doc_ids)
    outside = [i for i in ids if not 0 <= i < info.n_docs]
    if outside:
        raise TaskError(f"lm-eval task {task}: no document {outside[0]}; it has documents 0..{info.n_docs - 1}")
    if not ids:  # lm-eval reads no samples as all the documents
        return TaskScores(info.name, info.metric, info.binary, info.higher_is_better, (), ())
    tokenizer = load_tokenizer(tokenizer_dir, model.cfg.vocab_size)
    if task_obj.OUTPUT_TYPE == "generate_until" and tokenizer.eos_token_id is None:  # HFLM stops generating on it
        raise TaskError(
            f"lm-eval task {task} generates text, which needs a tokenizer with an end-of-sequence token; "
            f"the tokenizer in {tokenizer_dir} has none"
        )
    hf_model: Any = unrolled_hf_model(model, schedule, family, scales)
    hf_model.to(model.embed.weight.device)
    quiet_hflm_logs()
    lm = quiet_lm_class()(
        pretrained=hf_model,
        tokenizer=tokenizer,
        batch_size=batch_size,
        # a tokenizer with neither BOS nor EOS (the byte tokenizer): id 0 stands for them before an empty context
        prefix_token_id=0 if tokenizer.bos_token_id is None and tokenizer.eos_token_id is None else None,
    )
    wanted = sorted(set(ids))  # lm-eval labels its samples by their position in this list, in document order
    with stderr_dropped():  # its request-building progress bar and `git describe`'s complaint outside a repository
        results = lm_eval.simple_evaluate(
            model=lm,
            tasks=[task_obj],
            task_manager=task_manager(tasks_path),
            samples={info.name: wanted},
            log_samples=True,
            bootstrap_iters=0,
            cache_requests=False,
            write_out=False,
            random_seed=None,
            numpy_random_seed=None,
            torch_random_seed=None,
        )
    samples = results["samples"][info.name]
    first_filter = samples[0]["filter"]
    by_doc = {int(s["doc_id"]): float(s[info.metric]) for s in samples if s["filter"] == first_filter}
    if sorted(by_doc) != wanted:  # never seen: lm-eval answers each document it is given
        raise RuntimeError(f"lm-eval scored documents {sorted(by_doc)[:5]}... of {task}, not {wanted[:5]}...")
    if info.binary and any(v not in (0.0, 1.0) for v in by_doc.values()):
        odd = next(i for i, v in by_doc.items() if v not in (0.0, 1.0))
        raise TaskError(f"lm-eval task {task}: its {info.metric} of document {odd} is {by_doc[odd]}, not 0 or 1")
    return TaskScores(info.name, info.metric, info.binary, info.higher_is_better, ids, tuple(by_doc[i] for i in ids))


def load_task(task: str, tasks_path: Path | None) -> tuple[TaskInfo, Any]:
    """check_task's TaskInfo, and the lm-eval Task it read (built afresh: a Task holds one evaluation's state)."""
    lm_eval_module()
    from ilr_search.data.corpora import quiet_datasets

    tasks_path = None if tasks_path is None else Path(tasks_path)
    if tasks_path is not None:
        check_task_files(tasks_path)
    manager = task_manager(tasks_path)
    where = f"the folder {tasks_path}" if tasks_path is not None else "lm-eval's registry"
    if task in manager.all_groups or task in manager.all_tags:
        raise TaskError(f"lm-eval {task} is a group of tasks in {where}; name one of its tasks")
    if task not in manager.all_subtasks:
        close = difflib.get_close_matches(task, manager.all_subtasks, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if tasks_path is not None and not manager.all_subtasks:
            hint = " (the folder has no task YAML files)"
        raise TaskError(f"unknown lm-eval task {task!r} in {where}{hint}")
    quiet_datasets()
    try:
        task_obj = manager.load([task])["tasks"][task]
    except ConnectionError as e:  # datasets' "Couldn't reach NAME on the Hub (OfflineModeIsEnabled)"
        raise TaskError(
            f"lm-eval task {task}: its data is not cached and cannot be downloaded here ({first_line(e)}); "
            "download it first (run the task once online), or give a local task (--tasks-path) with data_files"
        ) from None
    except Exception as e:
        raise TaskError(f"lm-eval task {task}: cannot load its data ({type(e).__name__}: {first_line(e)})") from None
    return task_info(task, task_obj), task_obj


def task_info(task: str, task_obj: Any) -> TaskInfo:
    """What an item's score is in a loaded task, or TaskError where it has none."""
    from lm_eval.api.registry import get_aggregation

    output_type = task_obj.OUTPUT_TYPE
    if output_type not in PER_ITEM_OUTPUT_TYPES:
        raise TaskError(
            f"lm-eval task {task}: its output type {output_type} cannot be scored per item "
            f"(scored: {', '.join(PER_ITEM_OUTPUT_TYPES)})"
        )
    aggregations = task_obj.aggregation()
    per_item = [name for name, fn in aggregations.items() if fn is get_aggregation("mean")]
    if not per_item:
        raise TaskError(
            f"lm-eval task {task}: none of its metrics ({', '.join(aggregations)}) is a mean over items, "
            "so it cannot be scored per item"
        )
    generation = getattr(task_obj.config, "generation_kwargs", None) or {}
    if output_type == "generate_until" and generation.get("do_sample"):
        raise TaskError(f"lm-eval task {task}: it samples its generations (do_sample), so its scores would not repeat")
    metric = per_item[0]
    return TaskInfo(
        name=task,
        n_docs=len(task_obj.eval_docs),
        metric=metric,
        binary=metric in BINARY_METRICS,
        higher_is_better=bool(task_obj.higher_is_better().get(metric, True)),
    )


@functools.cache
def task_manager(tasks_path: Path | None) -> Any:
    """lm-eval's TaskManager of the registry (indexed once per process), or of the folder `tasks_path` alone."""
    from lm_eval.tasks import TaskManager

    if tasks_path is None:
        return TaskManager()
    return TaskManager(include_path=str(tasks_path), include_defaults=False)


def check_task_files(tasks_path: Path) -> None:
    """Refuse (one line) a task folder that is missing, or whose YAML files, or those they include outside
    lm-eval's own tasks, are not plain data: Python named by `!function`, metrics fetched from the hub."""
    if not tasks_path.is_dir():
        raise TaskError(f"lm-eval tasks folder {tasks_path}: no such folder")
    own_tasks = (Path(lm_eval_module().__file__).parent / "tasks").resolve()
    pending = sorted(p for p in tasks_path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
    seen: set[Path] = set()
    while pending:
        path = pending.pop().resolve()
        if path in seen or own_tasks in path.parents:
            continue
        seen.add(path)
        for include in check_task_file(path):
            pending.append(include if include.is_absolute() else path.parent / include)


class TaskFileLoader(yaml.SafeLoader):
    """yaml.safe_load's loader that reads lm-eval's `!function` tag as a marker, so that it can be refused."""


TaskFileLoader.add_constructor("!function", lambda loader, node: FunctionTag(loader.construct_scalar(node)))


@dataclass(frozen=True)
class FunctionTag:
    qualname: object


def check_task_file(path: Path) -> list[Path]:
    """check_task_files for one YAML file; returns the files it includes."""
    import lm_eval.api.metrics  # noqa: F401  # registers lm-eval's own metrics
    from lm_eval.api.registry import METRIC_REGISTRY

    try:
        config = yaml.load(path.read_text(encoding="utf-8"), Loader=TaskFileLoader)  # noqa: S506  # safe + a marker
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TaskError(f"lm-eval task file {path}: cannot read it ({type(e).__name__}: {first_line(e)})") from None
    if not isinstance(config, dict):
        return []
    function = next((v for v in walk(config) if isinstance(v, FunctionTag)), None)
    if function is not None:
        raise TaskError(
            f"lm-eval task file {path}: it names Python (!function {function.qualname}); a local task must be "
            "data: fields, Jinja templates and lm-eval's own metrics and filters"
        )
    metrics = [
        entry
        for value in walk(config)
        if isinstance(value, dict) and isinstance(value.get("metric_list"), list)  # a task's, or a group's inline task
        for entry in value["metric_list"]
        if isinstance(entry, dict)
    ]
    for entry in metrics:
        name = entry.get("metric")
        if entry.get("hf_evaluate") or (isinstance(name, str) and name not in METRIC_REGISTRY):
            raise TaskError(
                f"lm-eval task file {path}: metric {name!r} is not one of lm-eval's own (it would be fetched "
                "from the hub through evaluate)"
            )
    includes = config.get("include")
    return [Path(i) for i in (includes if isinstance(includes, list) else [includes]) if isinstance(i, str)]


def walk(value: Any) -> Iterator[Any]:
    """Every value in a YAML document, containers and their contents."""
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v)


def load_tokenizer(tokenizer_dir: Path, vocab_size: int) -> Any:
    """The tokenizer AutoTokenizer reads from `tokenizer_dir`, or CheckpointError (one line)."""
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except Exception as e:
        raise CheckpointError(
            f"tokenizer {tokenizer_dir}: cannot load it ({type(e).__name__}: {first_line(e)})"
        ) from None
    if len(tokenizer) > vocab_size:
        raise CheckpointError(
            f"tokenizer {tokenizer_dir}: it has {len(tokenizer)} ids, more than the model's vocabulary {vocab_size}"
        )
    return tokenizer


@functools.cache
def quiet_lm_class() -> type:
    """lm-eval's HFLM without its progress bars (on stderr, where the command's own output goes)."""
    from lm_eval.models.huggingface import HFLM

    class QuietHFLM(HFLM):
        def loglikelihood(self, requests: Any, disable_tqdm: bool = True) -> Any:
            return super().loglikelihood(requests, disable_tqdm=True)

        def loglikelihood_rolling(self, requests: Any, disable_tqdm: bool = True) -> Any:
            return super().loglikelihood_rolling(requests, disable_tqdm=True)

        def generate_until(self, requests: Any, disable_tqdm: bool = True) -> Any:
            return super().generate_until(requests, disable_tqdm=True)

    return QuietHFLM


class DropHflmObjectWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(HFLM_OBJECT_WARNINGS)


@functools.cache
def quiet_hflm_logs() -> None:
    """Drop HFLM_OBJECT_WARNINGS from lm-eval's HFLM logger (once per process); its other records pass."""
    logging.getLogger("lm_eval.models.huggingface").addFilter(DropHflmObjectWarnings())
