"""`ilr-search judge`: is this map, block or mergekit config better than the model it was made from?

No search: the candidates (reuse maps, block maps, mergekit passthrough configs of the one model, with damping where
they scale o_proj/down_proj) are evaluated frozen on chunk 0 with the plain model, then raced against it on the
chunks after it, each tested both ways by the sequential test paired by window or item, until every comparison is
decided or the chunks run out. The study is a frozen study like any other (resumable, read by `trials`, `pareto`,
`studies`, `export-model`), stored with `[search] judge`, whose answer is a line a candidate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ilr_search.commands.run import RunOptions, run_request
from ilr_search.config import MAP_PARTS, SpaceConfig
from ilr_search.data.tokenizers import model_config
from ilr_search.errors import UserInputError
from ilr_search.options import JudgeOptions
from ilr_search.search.maps import PART_NAMES
from ilr_search.search.plan import safe_name
from ilr_search.search.run import RunRequest
from ilr_search.training.flops import flops_ratio, parse_budget
from ilr_search.training.mergekit import candidate_key, is_config_path
from ilr_search.training.schedule import Map

CHUNKS_AT_MOST = 16  # the chunks a judge evaluates at most (each costs an evaluation of every candidate)
CHUNKS_AT_LEAST = 4  # chunk 0 and three to test on: a sequential test's first look at two, one more after it
MIN_CHUNK = 8  # the fewest windows or items a chunk has where judge chooses its size


@dataclass(frozen=True)
class Candidate:
    """A candidate as given (`text`) and the study's map key of what it runs (`key`), with its FLOPs ratio."""

    text: str
    key: str
    flops_ratio: float

    def line(self, baseline: str) -> str:
        if self.key == baseline:
            return f"candidate {self.text} runs every layer once: it is the model itself, judged against nothing"
        reads = f" reads as {self.key}" if self.key != self.text else ""
        return f"candidate {self.text}{reads} ({self.flops_ratio:.3f}x the plain model's FLOPs)"


def judge_request(options: JudgeOptions) -> tuple[RunRequest, list[Candidate]]:
    """The frozen study `options` ask for, and the candidates it judges; bad input raises a UserInputError
    before anything is opened."""
    if not options.candidates:
        raise UserInputError(
            "judge needs at least one --candidate: a map (2,1,1,1), a block (block:16-27:2, with "
            "|damping=0.5), or a mergekit passthrough YAML"
        )
    base_request = run_request(
        RunOptions(
            space=options.space,
            space_keys=options.overrides(),
            budget="1x",
            objective=options.objective,
            train_steps=0,
            init=options.init,
        )
    )
    space = base_request.space
    model = model_config(space)
    candidates = [_candidate(text, model) for text in options.candidates]
    baseline = Map.baseline(model.n_layers).key
    keys = [k for k in dict.fromkeys(c.key for c in candidates) if k != baseline]  # the model itself: no trial
    costliest = max([1.0, *(c.flops_ratio for c in candidates)])
    budget = options.budget or f"{math.ceil(costliest * 1000) / 1000:.3f}x"  # the costliest candidate's, rounded up
    allowed = parse_budget(budget, model)
    over = [c for c in candidates if not allowed.allows(c.flops_ratio)]
    if over:
        raise UserInputError(
            f"{over[0].text} costs {over[0].flops_ratio:.3f}x the plain model's FLOPs, over --budget {budget}; "
            "a judge evaluates its candidates as given: raise --budget or leave it out"
        )
    maps = [Map.parse(k, model.n_layers) for k in keys]
    knobs = sorted({name for m in maps for name in m.knob_settings})
    damping = sorted({float(m.knob_settings.get("damping", 1.0)) for m in maps} | {1.0}, reverse=True)
    parts = sorted({PART_NAMES[p] for m in maps for p in m.parts} | {"both"}, key=list(MAP_PARTS).index)
    size, chunks = chunking(space, options.chunks, options.chunk_size)
    contenders = len(keys) + 1
    search = dataclasses.replace(
        space.search,
        judge=True,
        families=("ilr", "blocks"),
        max_reuse=max([space.search.max_reuse, *(max(m.counts) for m in maps)]),
        parts=tuple(parts),
        n_trials=contenders,
        enqueue=(baseline, *keys),
        enqueue_paper_maps=False,
        noise_seeds=0,
        knobs=tuple(knobs),
        damping_choices=tuple(damping),
        sampler="random",
        pruner="none",
        race_policy="adaptive",
        race_seeds=3,
        race_contenders=contenders,
        race_screen=contenders,
        max_seeds=chunks,
        equal_compute="off",
    )
    space = dataclasses.replace(space, search=search, train=dataclasses.replace(space.train, eval_windows=size))
    name = options.study or judge_study_name(space, keys)
    request = dataclasses.replace(
        base_request,
        space=space,
        budget=budget,
        study_name=name,
        storage=options.storage,
        sampler=None,
        pruner=None,
    )
    return request, candidates


def chunking(space: SpaceConfig, chunks: int | None, size: int | None) -> tuple[int, int]:
    """(units a chunk, chunks) of a judge: `chunks` (CHUNKS_AT_MOST where not given) of `size` units (the space's
    eval_windows where not given, fewer, at least MIN_CHUNK, where the data would otherwise make fewer chunks), as
    many chunks as the data holds where that is fewer; refused below CHUNKS_AT_LEAST."""
    from ilr_search.training.frozen import eval_chunks, load_space_data

    for flag, value in (("--chunks", chunks), ("--chunk-size", size)):
        if value is not None and value < 1:
            raise UserInputError(f"{flag} must be a positive number, got {value}")
    wanted = chunks or CHUNKS_AT_MOST
    if wanted < CHUNKS_AT_LEAST:
        raise UserInputError(
            f"--chunks must be at least {CHUNKS_AT_LEAST} (chunk 0 and three to test on), got {wanted}"
        )
    data = load_space_data(space)
    units = eval_chunks(data, 1, space.model.seq_len)
    if size is None:
        size = max(MIN_CHUNK, min(space.train.eval_windows, units // wanted))
    have = units // size - space.train.seed  # the chunks from the first (`--seed`, chunk 0 where not given) on
    if have < CHUNKS_AT_LEAST:
        raise UserInputError(
            f"the data holds {units} windows or items: {have} chunk(s) of {size}, and a judge needs "
            f"{CHUNKS_AT_LEAST} (chunk 0 and three to test on); give more items or a smaller --chunk-size"
        )
    return size, min(wanted, have)


def _candidate(text: str, model: Any) -> Candidate:
    key = candidate_key(text, model.n_layers)
    chosen = Map.parse(key, model.n_layers)
    knobs = chosen.knob_settings
    from ilr_search.knobs import with_knobs

    return Candidate(
        text if not is_config_path(text) else Path(text).name,
        key,
        flops_ratio(chosen.configure(with_knobs(model, knobs, 0)), chosen.schedule()),
    )


def judge_study_name(space: SpaceConfig, keys: Sequence[str]) -> str:
    """judge-MODEL-DIGEST: the model's name and a digest of the candidates, the objective and the items."""
    identity = {"candidates": sorted(keys), "objective": space.search.objective, "data": dataclasses.asdict(space.data)}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:8]
    model = Path(space.model.init[3:] if space.model.init.startswith("hf:") else space.model.init).name
    return f"judge-{safe_name(model)}-{digest}"
