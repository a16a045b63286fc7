"""The public Python API under the CLI: each function returns the record whose to_json() its command prints with
--json."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ilr_search.config import KNOB_FIELD_DEFAULTS, ModelConfig, SpaceConfig
from ilr_search.data.tokenizers import check_vocab, model_config
from ilr_search.data.tokens import load_space_tokens
from ilr_search.errors import UserInputError
from ilr_search.knobs import format_knobs, knob_params, knobs_of, parse_knob_settings, with_knobs
from ilr_search.options import Overrides, TrainOptions
from ilr_search.space import load_space
from ilr_search.training.flops import FlopsCount, describe, map_param_count
from ilr_search.training.model import repeat_indices
from ilr_search.training.schedule import Map, resolve_schedule
from ilr_search.training.train import OnStep

if TYPE_CHECKING:
    from ilr_search.commands.recipe import TrainReport


def schedule_model(space: SpaceConfig, schedule: Sequence[int], knobs: str | None) -> ModelConfig:
    """The space's model for one schedule, with `--knobs` settings on (depth_init: the schedule's own depth)
    and the knobs' tables covering the schedule's repeats."""
    try:
        settings = parse_knob_settings(knobs or "")
    except ValueError as e:
        raise UserInputError(f"--knobs: {e}") from None
    cfg = model_config(space)
    cfg = dataclasses.replace(cfg, max_reuse=max([cfg.max_reuse] + [k + 1 for k in repeat_indices(schedule)]))
    try:
        return with_knobs(cfg, settings, init_depth=len(schedule))
    except ValueError as e:  # a setting the model cannot take (an adapter rank above d_model)
        raise UserInputError(f"--knobs: {e}") from None


def with_init(space: SpaceConfig, init: str | None) -> SpaceConfig:
    """`--init PATH|FILE.gguf|hf:NAME`: the space with the checkpoint's model (its architecture, and its weights to
    start from; the space's seq_len and recurrence knobs kept) and its data tokenized by the checkpoint's tokenizer."""
    if not init:
        return space
    from ilr_search.training.pretrained import CheckpointError, open_checkpoint

    checkpoint = open_checkpoint(init, space.model.seq_len)
    if checkpoint.tokenizer_file is None:
        raise CheckpointError(f"checkpoint {init}: the folder has no tokenizer.json, which tokenizes the data")
    knobs = {name: getattr(space.model, name) for name in KNOB_FIELD_DEFAULTS}
    return dataclasses.replace(
        space,
        model=dataclasses.replace(checkpoint.config, **knobs),
        data=dataclasses.replace(space.data, tokenizer=f"file:{checkpoint.tokenizer_file.resolve()}"),
    )


def init_note(init: str | None) -> str | None:
    """What a command given `--init` says once about its checkpoint: that a quantized GGUF file's weights are
    dequantized, the quantized model and not the original (None for any other checkpoint). A GGUF file is read,
    and converted the first time, here."""
    if not init:
        return None
    from ilr_search.training.gguf import dequantization_note, open_gguf

    gguf = open_gguf(init)
    return None if gguf is None else dequantization_note(gguf)


def train_command(
    options: TrainOptions, on_step: OnStep | None = None, on_choice: Callable[[str], None] | None = None
) -> TrainReport:
    """`ilr-search train` of options checked by TrainOptions.check: train_report, or with `from_study`
    recipe.train_from_study (`on_choice` is told why the study's map was chosen)."""
    if options.from_study is None:
        return train_report(
            options.space,
            options.overrides(),
            options.reuse_map,
            options.block,
            on_step=on_step,
            knobs=options.knobs,
            save=options.save,
            init=options.init,
            save_format=options.save_format,
        )
    from ilr_search.commands.recipe import train_from_study

    train = options.overrides().get("train", {})
    return train_from_study(
        options.from_study,
        options.storage,
        options.map_text,
        train.get("steps"),
        {name: train.get(name) for name in ("seed", "device", "dtype", "compile")},
        on_step,
        options.save,
        on_choice=on_choice,
        save_format=options.save_format,
    )


@dataclass(frozen=True)
class FlopsReport:
    """`ilr-search flops`: the schedule's compute, a block map's key (as a study stores it; None for a reuse map
    or block recurrence), the knob settings and the parameters each knob adds. to_json is `flops --json`."""

    count: FlopsCount
    map: str | None
    knobs: str
    knob_params: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        report = self.count.to_dict()
        if self.map is not None:
            report["map"] = self.map
        return report | {"knobs": self.knobs, "knob_params": dict(self.knob_params)}


def flops_report(
    space: str | Path | None = None,
    overrides: Overrides | None = None,
    reuse_map: str | Sequence[int] | None = None,
    block: int | None = None,
    knobs: str | None = None,
    init: str | None = None,
) -> FlopsReport:
    """`ilr-search flops`: FLOPs per token of a reuse map (or block recurrence) and its ratio to the plain model's;
    `params` counts the knobs' own parameters too (`knob_params` says how many each adds). `init`: the model of
    a checkpoint (with_init)."""
    m = map_model(space, overrides, reuse_map, block, knobs, init)
    count = describe(
        m.cfg, m.counts, m.schedule, m.space.train.tokens(m.cfg.seq_len), map_param_count(m.cfg, m.schedule), m.block
    )
    block_map = m.block_map.key if m.block_map is not None else None
    return FlopsReport(count, block_map, format_knobs(knobs_of(m.cfg)), knob_params(m.cfg))


@dataclass(frozen=True)
class MapModel:
    """The model a command runs a map on: the space (with --init's checkpoint), the map's per-layer counts,
    schedule and block count (resolve_schedule), the map as parsed where it is written as a block map, and the
    space's model for the schedule with the knob settings on (schedule_model)."""

    space: SpaceConfig
    counts: list[int]
    schedule: list[int]
    block: int | None
    block_map: Map | None
    cfg: ModelConfig


def map_model(
    space: str | Path | None,
    overrides: Overrides | None,
    reuse_map: str | Sequence[int] | None,
    block: int | None,
    knobs: str | None,
    init: str | None,
) -> MapModel:
    """`flops`' and `train`'s model for a map, resolved before any data work."""
    cfg_space = with_init(load_space(space, overrides), init)
    n_layers = cfg_space.model.n_layers
    counts, schedule, block = resolve_schedule(n_layers, reuse_map, block, cfg_space.search.max_reuse)
    cfg = schedule_model(cfg_space, schedule, knobs)
    chosen = Map.parse(reuse_map, n_layers) if isinstance(reuse_map, str) else None
    written = chosen if chosen is not None and (chosen.is_block or chosen.parts) else None
    return MapModel(cfg_space, counts, schedule, block, written, cfg if chosen is None else chosen.configure(cfg))


def train_report(
    space: str | Path | None = None,
    overrides: Overrides | None = None,
    reuse_map: str | Sequence[int] | None = None,
    block: int | None = None,
    on_step: OnStep | None = None,
    knobs: str | None = None,
    save: str | Path | None = None,
    init: str | None = None,
    save_format: str = "native",
) -> TrainReport:
    """`ilr-search train`: train one proxy for a reuse map (or block recurrence) on the configured data; with
    `save`, write the trained model there: natively (`model.safetensors`, `config.json` and the tokenizer;
    `ILRTransformer.load` reads them), or with save_format hf as a standard transformers checkpoint, its schedule
    unrolled. `init`: start from a checkpoint's model and weights, on data its tokenizer tokenizes (with_init)."""
    from ilr_search.commands.recipe import check_save, train_and_save, train_report_of

    m = map_model(space, overrides, reuse_map, block, knobs, init)
    save_dir = Path(save) if save is not None else None
    if save_dir is not None:
        check_save(m.cfg, m.schedule, save_dir, save_format)
    data = load_space_tokens(m.space)
    check_vocab(m.cfg, data.vocab_size)
    settings = parse_knob_settings(knobs or "")
    written = m.block_map or (Map.of_stack(m.block, len(m.counts)) if m.block else Map.of_counts(m.counts))
    choice = written.with_knobs(settings)
    result = train_and_save(m.cfg, choice, data, m.space, on_step, save_dir, save_format=save_format)
    return train_report_of(m.cfg, m.counts, result, m.block, knobs_of(m.cfg), save_dir)
