"""Frozen evaluation: a map applied to a pretrained model's weights as they are, trained for no step and only
scored. The noise of a frozen result is which text (or which items) was scored, not a seed: a run at seed s scores
chunk s, of held-out windows (TokenData.window_chunk) or of task items (ItemSet.chunk), so that the race's seeds
become disjoint chunks and its paired differences are paired by window or item (docs/race.md, "Frozen search").

A score is a loss, one a unit: a window's mean loss per counted token, an item's answer tokens' mean loss after
its prompt (`answer`), or 0 where the item is right and 1 where it is wrong (`choice`, `exact`: data/items.py).

One `FrozenEvaluator` a process serves every map of a study: the model is built once, its weights stored in the
evaluation dtype (bf16 where the device computes it natively: `frozen_dtype`), and per chunk the plain model's
residual stream after each layer is kept (within a memory bound), so that a map whose schedule begins as the plain
model's (a block I-J after layer J, an ILR map before its first repeated layer) starts there: its numbers are those
of the full forward pass exactly, since the same operations run on the same batches.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ilr_search.config import ModelConfig, SpaceConfig, TrainConfig, scored_by_item
from ilr_search.data.items import ItemTask, load_task_items
from ilr_search.data.tokens import IGNORE_INDEX, TokenData, counted_targets, load_space_tokens
from ilr_search.records import EvalPoint
from ilr_search.training.build import build_model
from ilr_search.training.device import frozen_dtype, resolve_device
from ilr_search.training.lm_eval_items import LmEvalTask, lm_eval_scores, lm_eval_task
from ilr_search.training.loss import HeadBuffers, linear_cross_entropy
from ilr_search.training.model import BranchScale, ILRTransformer, branch_scales

EvalData = TokenData | ItemTask | LmEvalTask  # what a run scores: held-out windows, task items, an lm-eval task
ScoredSequence = tuple[tuple[int, ...], int, tuple[int, ...] | None]  # a scored sequence: (ids, counted, picked tokens)
CACHE_SHARE = 0.25  # of the machine's memory (a GPU's, where the model is on one) the shared prefixes may hold


@dataclass(frozen=True)
class ChunkScores:
    """A map's scores on one chunk: `units` (window starts, or item rows) and one score each (a loss: see the
    module docstring), `binary` where each is 0 or 1; for windows, the targets each counts (`counts`), `nats`
    summed over all of them (`tokens`) and the UTF-8 `bytes` they cover (bytes 0 for items)."""

    chunk: int
    units: tuple[int, ...]
    scores: tuple[float, ...]
    binary: bool
    nats: float
    tokens: int
    bytes: int = 0
    seconds: float = 0.0
    counts: tuple[int, ...] = ()

    @property
    def val_loss(self) -> float:
        """The chunk's loss: nats per counted target for windows, the mean score for items (the error rate)."""
        if self.binary:
            return math.fsum(self.scores) / max(1, len(self.scores))
        return self.nats / max(1, self.tokens)

    @property
    def val_ppl(self) -> float:
        return math.exp(min(self.val_loss, 700.0))

    @property
    def val_bpb(self) -> float:
        return self.nats / math.log(2) / self.bytes if self.bytes else math.nan

    @property
    def point(self) -> EvalPoint:
        """The run's one evaluation point (step 0)."""
        return EvalPoint(0, 0, self.val_loss, self.val_ppl, self.val_bpb)


def cache_bound(device: torch.device) -> int:
    """The bytes the shared prefixes may hold: CACHE_SHARE of the device's memory."""
    if device.type == "cuda":
        return int(CACHE_SHARE * torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(CACHE_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 30


def shared_prefix(schedule: Sequence[int], scales: Sequence[BranchScale]) -> int:
    """How many of the schedule's first positions the plain model runs too: positions p with layer p, unscaled."""
    p = 0
    while p < len(schedule) and schedule[p] == p and scales[p] is None:
        p += 1
    return p


@dataclass(frozen=True)
class MapRun:
    """One evaluation: a schedule with its branch factors (model.branch_scales), the positions it shares with the
    plain model (`start`: shared_prefix, 0 where not shared), on chunk `chunk` of `n` units."""

    schedule: list[int]
    scales: list[BranchScale]
    start: int
    chunk: int
    n: int


@dataclass
class Batch:
    """One batch of a chunk: inputs (B, T), targets (B, T) with IGNORE_INDEX where not counted, and the plain
    model's residual stream after its first p layers at states[p] (states[0] unset: the layers start from the
    embedding), as far as it is kept."""

    x: torch.Tensor
    y: torch.Tensor
    states: list[torch.Tensor] = field(default_factory=list)
    # multiple choice: a row whose choices are one token each after one context is read once, its choices' tokens
    # scored at its last position: (position, tokens) for such a row, None for a row whose counted targets are in y
    picks: list[tuple[int, tuple[int, ...]] | None] = field(default_factory=list)


class FrozenEvaluator:
    """Scores maps of one pretrained model on chunks of `data` (see the module docstring). `model`: built with the
    checkpoint's weights, knobs off; its weights are cast to `dtype`."""

    def __init__(self, model: ILRTransformer, data: EvalData, dtype: str, batch_size: int, cache_bytes: int) -> None:
        self.dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        self.model = model.to(self.dtype).eval().requires_grad_(False)
        self.device = next(model.parameters()).device
        self.data, self.batch_size, self.cache_bytes = data, batch_size, cache_bytes
        self.cached_bytes = 0
        self._batches: dict[tuple[int, int], list[Batch]] = {}
        self._head = HeadBuffers()  # the head's logits, one row at a time (under self.lock)
        self.lock = threading.Lock()  # one evaluation at a time (lanes may share a process's evaluator)

    @property
    def n_layers(self) -> int:
        return self.model.cfg.n_layers

    @torch.no_grad()
    def evaluate(
        self, cfg: ModelConfig, schedule: Sequence[int], chunk: int, n: int, share: bool = True
    ) -> ChunkScores:
        """The scores of the model running `schedule` with `cfg`'s branch factors (damping, repeat_scale) on chunk
        `chunk` of `n` units; `share`: start from the plain model's kept states where the schedule allows."""
        with self.lock:
            t0 = time.perf_counter()
            schedule = list(schedule)
            scales = branch_scales(cfg, schedule)
            run = MapRun(schedule, scales, shared_prefix(schedule, scales) if share else 0, chunk, n)
            if isinstance(self.data, LmEvalTask):
                scores = self._lm_eval(self.data, run)
            elif isinstance(self.data, ItemTask):
                scores = self._items(self.data, run)
            else:
                scores = self._windows(self.data, run)
            return replace(scores, seconds=time.perf_counter() - t0)

    def _hidden(self, batch: Batch, run: MapRun) -> torch.Tensor:
        """The final hidden states of the run's schedule on `batch`, from the plain model's state after its shared
        prefix."""
        if run.start == 0:
            return self.model.hidden(batch.x, run.schedule, run.scales)
        state = self._plain_state(batch, run.start)
        return self.model.hidden(batch.x, run.schedule, run.scales, start=run.start, state=state)

    def _plain_state(self, batch: Batch, p: int) -> torch.Tensor:
        """The plain model's residual stream after its first p layers on `batch`: kept ones, the rest computed from
        the deepest kept one and kept while the bound allows."""
        plain = list(range(self.n_layers))
        have = len(batch.states) - 1  # states[0] is a placeholder: the layers start from the embedding
        if have >= p:
            return batch.states[p]
        new: list[torch.Tensor] = []
        from_state = batch.states[have] if have >= 1 else None
        stop = plain[:p]  # the first p positions: the rest of the schedule is not run
        self.model.hidden(batch.x, stop, [None] * p, start=max(0, have), state=from_state, states=new)
        if not batch.states:
            batch.states.append(torch.empty(0))
        for state in new:
            size = state.numel() * state.element_size()
            if self.cached_bytes + size > self.cache_bytes:
                return new[-1]  # past the bound: computed, not kept
            batch.states.append(state)
            self.cached_bytes += size
        return batch.states[p]

    def _chunk_batches(self, run: MapRun, make: Callable[[], list[Batch]]) -> list[Batch]:
        key = (run.chunk, run.n)
        if key not in self._batches:
            self._batches[key] = make()
        return self._batches[key]

    # --- held-out windows ---

    def _windows(self, data: TokenData, run: MapRun) -> ChunkScores:
        seq_len = self.model.cfg.seq_len
        windows = data.window_chunk(run.chunk, run.n, seq_len)

        def make() -> list[Batch]:
            return [
                Batch(torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device))
                for x, y in data.window_batches(windows, seq_len, self.batch_size)
            ]

        sums: list[torch.Tensor] = []
        counted: list[int] = []
        for batch in self._chunk_batches(run, make):
            counted += [counted_targets(row) for row in batch.y.cpu().numpy()]
            hidden = self._hidden(batch, run)
            sums += self._row_nats(hidden, batch.y, data.ignore_index)
        nats = torch.stack(sums).double().cpu().tolist()  # the chunk's one host sync
        return ChunkScores(
            run.chunk,
            tuple(int(s) for s in windows.starts),
            tuple(v / max(1, c) for v, c in zip(nats, counted, strict=True)),
            False,
            math.fsum(nats),
            sum(counted),
            data.val.bytes_between(windows.begins, windows.ends),
            counts=tuple(counted),
        )

    def _row_nats(self, hidden: torch.Tensor, y: torch.Tensor, ignore_index: int | None) -> list[torch.Tensor]:
        """Each row's summed loss over its counted targets (the head one row at a time, at its counted positions
        only: a row that counts few targets, an answer's or a choice's, makes only their logits)."""
        head = self.model.head_weight
        out = []
        for row in range(hidden.shape[0]):
            h, t = hidden[row], y[row]
            if ignore_index is not None:
                counted = t != ignore_index
                h, t = h[counted], t[counted]
            out.append(
                linear_cross_entropy(h, head, t, self.dtype, "sum", buffers=self._head)
                if len(t)
                else torch.zeros((), device=h.device)
            )
        return out

    # --- an lm-eval task ---

    def _lm_eval(self, task: LmEvalTask, run: MapRun) -> ChunkScores:
        """The documents of chunk `chunk` scored by lm-eval on the schedule unrolled into transformers' model
        (training/lm_eval_items.py); a score is a loss: 1 - the metric where higher is better."""
        docs = task.chunk(run.chunk, run.n)
        scored = lm_eval_scores(
            self.model,
            run.schedule,
            task.tokenizer_dir,
            task.family,
            task.info.name,
            task.tasks_path,
            docs,
            self.batch_size,
            run.scales,
        )
        losses = tuple(1.0 - v if scored.higher_is_better else float(v) for v in scored.scores)
        return ChunkScores(run.chunk, docs, losses, True, 0.0, 0)

    # --- task items ---

    def _items(self, task: ItemTask, run: MapRun) -> ChunkScores:
        rows = task.items.chunk(run.chunk, run.n)
        if task.kind == "answer":
            return self._answer(task, rows, run)
        if task.kind == "choice":
            wrong = self._choice(task, rows, run)
        else:
            wrong = self._exact(task, rows, run)
        scores = tuple(float(w) for w in wrong)
        return ChunkScores(run.chunk, rows, scores, True, 0.0, 0)

    def _sequence_batches(
        self, sequences: Sequence[tuple[tuple[int, ...], int, tuple[int, ...] | None]]
    ) -> list[Batch]:
        """Batches of (ids, counted, picked) sequences, right-padded: a sequence's last `counted` tokens are its
        targets, or with `picked` tokens none are, and those tokens are scored at its last position."""
        batches = []
        for b in range(0, len(sequences), self.batch_size):
            part = sequences[b : b + self.batch_size]
            width = max(len(ids) - 1 for ids, _, _ in part)
            x = np.zeros((len(part), width), dtype=np.int64)
            y = np.full((len(part), width), IGNORE_INDEX, dtype=np.int64)
            picks: list[tuple[int, tuple[int, ...]] | None] = []
            for r, (ids, counted, picked) in enumerate(part):
                row_ids = np.asarray(ids, dtype=np.int64)
                x[r, : len(row_ids) - 1] = row_ids[:-1]
                if picked is None:
                    y[r, len(row_ids) - 1 - counted : len(row_ids) - 1] = row_ids[len(row_ids) - counted :]
                picks.append(None if picked is None else (len(row_ids) - 2, picked))
            batches.append(Batch(torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device), picks=picks))
        return batches

    def _answer(self, task: ItemTask, rows: Sequence[int], run: MapRun) -> ChunkScores:
        """Per item, the mean loss of its answer's tokens after its prompt (nats a token)."""
        seq_len = self.model.cfg.seq_len
        sequences = [(c.ids, c.counted, None) for c in (task.answer_sequence(row, seq_len) for row in rows)]
        sums: list[torch.Tensor] = []
        for batch in self._chunk_batches(run, lambda: self._sequence_batches(sequences)):
            sums += self._row_nats(self._hidden(batch, run), batch.y, IGNORE_INDEX)
        nats = torch.stack(sums).double().cpu().tolist()  # the chunk's one host sync
        counts = tuple(counted for _, counted, _ in sequences)
        losses = tuple(v / max(1, c) for v, c in zip(nats, counts, strict=True))
        return ChunkScores(run.chunk, tuple(rows), losses, False, math.fsum(nats), sum(counts), counts=counts)

    def _choice(self, task: ItemTask, rows: Sequence[int], run: MapRun) -> list[bool]:
        """Per item, whether its correct choice lacks the highest summed log-likelihood (lm-eval's `acc`). An item
        whose choices are one token each after the same context is read once, its choices scored at its context's
        last position (the same log-likelihoods as one sequence a choice); the others one sequence a choice."""
        seq_len = self.model.cfg.seq_len
        owners: list[int] = []  # the item (its position in `rows`) of each sequence
        sequences: list[ScoredSequence] = []
        for i, row in enumerate(rows):
            choices = task.choice_sequences(row, seq_len)
            contexts = {c.ids[:-1] for c in choices}
            if all(c.counted == 1 for c in choices) and len(contexts) == 1 and len(choices[0].ids) > 1:
                owners.append(i)
                sequences.append((choices[0].ids, 1, tuple(c.ids[-1] for c in choices)))
                continue
            for c in choices:
                owners.append(i)
                sequences.append((c.ids, c.counted, None))

        values: list[list[float]] = []  # each sequence's losses: one a choice it scores
        head = self.model.head_weight
        for batch in self._chunk_batches(run, lambda: self._sequence_batches(sequences)):
            hidden = self._hidden(batch, run)
            nats = self._row_nats(hidden, batch.y, IGNORE_INDEX)
            for r, pick in enumerate(batch.picks):
                if pick is None:
                    values.append([float(nats[r])])
                    continue
                position, tokens = pick
                log_probs = torch.log_softmax(hidden[r, position].float() @ head.float().t(), dim=-1)
                values.append([-float(log_probs[t]) for t in tokens])
        scored: dict[int, list[float]] = {}
        for owner, losses in zip(owners, values, strict=True):
            scored.setdefault(owner, []).extend(losses)
        # the lowest loss is the highest log-likelihood; a tie goes to the first choice, as with argmax
        best = {i: min(range(len(v)), key=v.__getitem__) for i, v in scored.items()}
        return [best[i] != task.items.items[row].correct for i, row in enumerate(rows)]

    def _exact(self, task: ItemTask, rows: Sequence[int], run: MapRun) -> list[bool]:
        """Per item, whether greedy decoding after its prompt, up to the stop string, misses its answer."""
        seq_len = self.model.cfg.seq_len
        wrong = []
        for b in range(0, len(rows), self.batch_size):
            part = list(rows[b : b + self.batch_size])
            prompts = [list(task.prompt_ids(row, seq_len)) for row in part]
            generated: list[list[int]] = [[] for _ in part]
            done = [False] * len(part)
            for _ in range(task.max_new_tokens):
                live = [i for i in range(len(part)) if not done[i]]
                if not live:
                    break
                seqs = [prompts[i] + generated[i] for i in live]
                width = max(len(s) for s in seqs)
                x = torch.zeros((len(seqs), width), dtype=torch.long)
                for r, s in enumerate(seqs):
                    x[r, : len(s)] = torch.tensor(s)
                hidden = self.model.hidden(x.to(self.device), run.schedule, run.scales)
                last = hidden[torch.arange(len(seqs)), torch.tensor([len(s) - 1 for s in seqs])]
                nxt = (last.float() @ self.model.head_weight.float().t()).argmax(-1).tolist()
                for i, token in zip(live, nxt, strict=True):
                    generated[i].append(int(token))
                    text = task.tokenizer.decode(generated[i])
                    if task.stop and task.stop in text or len(prompts[i]) + len(generated[i]) >= seq_len:
                        done[i] = True
            for i, row in enumerate(part):
                text = task.tokenizer.decode(generated[i])
                if task.stop:
                    text = text.split(task.stop, 1)[0]
                wrong.append(not task.correct(row, text))
        return wrong


_evaluators: dict[tuple[object, ...], FrozenEvaluator] = {}
_evaluators_lock = threading.Lock()


def frozen_evaluator(model_cfg: ModelConfig, data: EvalData, cfg: TrainConfig) -> FrozenEvaluator:
    """The process's evaluator of `model_cfg`'s checkpoint (its knobs off: damping, repeat_scale and the map's parts
    are factors of each evaluation; adapters untrained are zero, the plain repeat) on `data`, in cfg's device, dtype
    and batch size: built on first use."""
    device = resolve_device(cfg.device)
    dtype = frozen_dtype(cfg.dtype, device)
    plain = replace(model_cfg, damping=1.0, repeat_scale="off", parts=(), adapter_rank=0)
    key = (plain, id(data), str(device), dtype, cfg.batch_size)
    with _evaluators_lock:
        if key not in _evaluators:
            _evaluators.clear()  # one model a process: a new study's evaluator replaces the last one's
            model = build_model(plain, 0).to(device)
            _evaluators[key] = FrozenEvaluator(model, data, dtype, cfg.batch_size, cache_bound(device))
        return _evaluators[key]


def evaluate_frozen(
    model_cfg: ModelConfig,
    schedule: Sequence[int],
    data: EvalData,
    cfg: TrainConfig,
    on_eval: Callable[[EvalPoint], bool] | None = None,
) -> ChunkScores:
    """A run of no step: `model_cfg`'s checkpoint running `schedule` scored on chunk cfg.seed of cfg.eval_windows
    units (windows or items); `on_eval` sees its one evaluation point (step 0)."""
    scores = frozen_evaluator(model_cfg, data, cfg).evaluate(model_cfg, schedule, cfg.seed, cfg.eval_windows)
    if on_eval is not None:
        on_eval(scores.point)  # nothing to stop: the run is this one evaluation
    return scores


def chunk_scores(
    model_cfg: ModelConfig, schedule: Sequence[int], data: EvalData, cfg: TrainConfig, chunks: Sequence[int]
) -> list[ChunkScores]:
    """Each chunk's scores of `model_cfg`'s checkpoint running `schedule` (for reports and for checking the paired
    tests)."""
    evaluator = frozen_evaluator(model_cfg, data, cfg)
    return [evaluator.evaluate(model_cfg, schedule, c, cfg.eval_windows) for c in chunks]


def load_space_data(space: SpaceConfig) -> EvalData:
    """What a space's runs score: its task items (objective choice or exact, or answer frozen), its lm-eval task
    (lm-eval), else its corpus's tokens."""
    objective = space.search.objective
    if objective == "lm-eval":
        return lm_eval_task(space.data.task, space.data.tasks_path, space.model.init)
    if scored_by_item(objective, space.train.steps):
        return load_task_items(space)
    return load_space_tokens(space)


def eval_chunks(data: EvalData, n: int, seq_len: int) -> int:
    """How many disjoint chunks of `n` units (held-out windows, items, documents) `data` holds."""
    if isinstance(data, ItemTask):
        return data.items.chunks(n)
    if isinstance(data, LmEvalTask):
        return data.chunks(n)
    return data.window_chunks(n, seq_len)
