"""`export-model`: a standard transformers checkpoint of a model under a map, its schedule unrolled (a layer that
runs r times is written r times; standard_checkpoint.py writes it):

- `--study NAME [--map MAP]`: a frozen study's pretrained model (its checkpoint's own weights) under a map
  (default: the study's decided best, as `recipe` chooses it); a study that trained its maps (from scratch or
  retrofit) keeps no trained weights, and is refused with the command that makes them
  (`train --from-study NAME --map MAP --save DIR --format hf`);
- `--model DIR [--map MAP]`: a model `train --save DIR` wrote (native), under any map of its layers, e.g. the 4
  distinct layers of a model trained with 2,2,1,1 as a plain 4-layer model with `--map 1,1,1,1`;
- `--study NAME [--map MAP] --format mergekit --out FILE.yml`: instead of the checkpoint, the mergekit passthrough
  config that builds it from the study's source checkpoint (training/mergekit.py writes it), its damping as scales.

A frozen study's map may carry the knobs that are branch factors (damping, repeat_scale residual): the checkpoint
has them as scaled o_proj and down_proj copies, the mergekit config as scales.

Every check runs before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ilr_search.commands.recipe import (
    StudySettingsView,
    choose_map,
    load_study_settings,
    parse_map_choice,
)
from ilr_search.commands.standard_checkpoint import (
    check_checkpoint,
    check_format,
    check_out_dir,
    default_family,
    write_checkpoint,
)
from ilr_search.config import DataConfig, ModelConfig
from ilr_search.errors import UserInputError
from ilr_search.knobs import KNOB_CHOICES
from ilr_search.options import ExportModelOptions
from ilr_search.training.model import CONFIG_FILE, SAVED_FORMAT, WEIGHTS_FILE, ILRTransformer, read_saved
from ilr_search.training.pretrained import (
    SUPPORTED_FAMILIES,
    TOKENIZER_FILES,
    CheckpointError,
    open_checkpoint,
    resolve_source,
)
from ilr_search.training.schedule import Map, parsed_key

EXPORT_FORMATS = {
    "hf": "a standard transformers checkpoint in the folder --out",
    "mergekit": "a passthrough config of a frozen study's checkpoint, --out FILE.yml",
}
MERGEKIT_SUFFIXES = (".yml", ".yaml")
SCALE_KNOBS = ("damping", "repeat_scale")  # the knobs a mergekit config carries, as tensor scales


def export_checkpoint(opts: ExportModelOptions, on_choice: Callable[[str], None]) -> ExportedModel:
    """`ilr-search export-model`: a frozen study's checkpoint (`study`) or a model train --save wrote (`model`),
    one of them, exported under a map in `export_format`; the flags that do not go together are refused first."""
    if (opts.study is None) == (opts.model is None):
        raise UserInputError(
            "give --study NAME (a frozen study's model) or --model DIR (a model train --save wrote), one of them"
        )
    check_format(opts.export_format, EXPORT_FORMATS)
    if opts.model is not None:
        if opts.storage is not None:
            raise UserInputError("--storage goes with --study")
        if opts.export_format == "mergekit":
            raise UserInputError(
                "--format mergekit goes with --study (a frozen study of a checkpoint, whose slices the config "
                "stacks); export a --model DIR with --format hf"
            )
        return export_saved_model(opts.model, opts.out, opts.map_text, opts.family)
    assert opts.study is not None  # exactly one of study and model
    if opts.export_format == "mergekit":
        if opts.family is not None:
            raise UserInputError("--family goes with --format hf: a mergekit config takes the checkpoint's own family")
        return export_study_mergekit(opts.study, opts.out, opts.storage, opts.map_text, on_choice=on_choice)
    return export_study_model(opts.study, opts.out, opts.storage, opts.map_text, opts.family, on_choice=on_choice)


def parse_export_map(map_text: str, n_layers: int, knobs: bool = False) -> Map:
    """A `--map` of export-model: a per-layer map, a block map (block:I-J:R) or blockK, without knobs unless
    `knobs` (a frozen study's map, whose knobs the study's model config takes)."""
    written = parsed_key(map_text)  # per-layer counts give their own number of layers
    if written is not None and not written.is_deeper and written.n_layers != n_layers:
        raise CheckpointError(
            f"--map {map_text!r} has {written.n_layers} entries but the model has "
            f"{n_layers} distinct layers; give one count per layer ({','.join(['1'] * n_layers)} "
            "writes each once)"
        )
    choice = parse_map_choice(map_text, n_layers)
    if choice.knobs and not knobs:
        raise CheckpointError(
            f"--map {map_text!r}: knobs have no equivalent in a standard checkpoint; give the map alone"
        )
    return choice


def check_family(family: str | None, cfg: ModelConfig) -> str:
    if family is not None and family not in SUPPORTED_FAMILIES:
        raise UserInputError(f"unknown --family {family!r}; use {', '.join(SUPPORTED_FAMILIES)}")
    return family or default_family(cfg)


def export_saved_model(
    folder: str | Path, out: str | Path, map_text: str | None = None, family: str | None = None
) -> ExportedModel:
    """`export-model --model DIR`: a model `train --save DIR` wrote, under `map_text` (default: the map it was
    trained with), as a standard checkpoint in `out`."""
    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise UserInputError(f"--model {str(folder)!r}: no such folder; give a folder ilr-search train --save wrote")
    if (
        not (folder / WEIGHTS_FILE).is_file()
        or not (folder / CONFIG_FILE).is_file()
        or f'"{SAVED_FORMAT}"' not in (folder / CONFIG_FILE).read_text(encoding="utf-8", errors="replace")
    ):
        raise UserInputError(
            f"--model {str(folder)!r} holds no model ilr-search train --save wrote ({WEIGHTS_FILE} "
            f"and {CONFIG_FILE} in the native format); save one with train --save DIR"
        )
    files = read_saved(folder)
    cfg = files.model
    if map_text is None:
        saved = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
        schedule, key = files.schedule, str(saved.get("map", "the trained schedule"))
    else:
        choice = parse_export_map(map_text, cfg.n_layers)
        schedule, key = choice.schedule(), choice.key
        cfg = dataclasses.replace(cfg, parts=choice.parts)
    family = check_family(family, cfg)
    tokenizer = saved_tokenizer(folder, files.data)
    check_out_dir(out)
    check_checkpoint(cfg, schedule, family, tokenizer)
    model, _ = ILRTransformer.load(folder)
    model.cfg = cfg  # the map's parts, where --map names another
    write_checkpoint(model, schedule, out, family, tokenizer)
    return ExportedModel(out, family, key, tuple(schedule), f"model {folder}", parts=cfg.parts)


def saved_tokenizer(folder: Path, data: DataConfig | None) -> Path | None:
    """The tokenizer a native save keeps (save_tokenizer), or None where its data was byte-tokenized."""
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return folder
    if data is None or data.tokenizer == "byte":
        return None
    raise CheckpointError(
        f"--model {str(folder)!r}: its data was tokenized by {data.tokenizer}, whose tokenizer "
        "the folder does not hold; save the model again with this version's train --save"
    )


def export_study_model(
    study_name: str,
    out: str | Path,
    storage: str | None = None,
    map_text: str | None = None,
    family: str | None = None,
    on_choice: Callable[[str], None] | None = None,
) -> ExportedModel:
    """`export-model --study NAME`: a frozen study's pretrained model (its checkpoint's weights, evaluated as they
    are) under `map_text` (default: the study's decided best map), as a standard checkpoint in `out`."""
    from ilr_search.training.build import build_model

    out = Path(out)
    view, choice, why = frozen_study_map(study_name, storage, map_text)
    init = view.space.model.init
    checkpoint = open_checkpoint(init)
    raw = json.loads((checkpoint.path / "config.json").read_text(encoding="utf-8"))
    positions = int(raw.get("max_position_embeddings") or checkpoint.config.seq_len)  # the checkpoint's, kept
    cfg = dataclasses.replace(view.model(choice.knob_settings, choice.parts), seq_len=positions)
    family = check_family(family or checkpoint.family, cfg)
    tokenizer = resolve_source(init)
    check_out_dir(out)
    check_checkpoint(cfg, choice.schedule(), family, tokenizer)
    if on_choice is not None:
        on_choice(why)
    model = build_model(cfg, seed=0).eval()
    write_checkpoint(model, choice.schedule(), out, family, tokenizer)
    return ExportedModel(out, family, choice.key, tuple(choice.schedule()), f"study {study_name}", parts=cfg.parts)


def frozen_study_map(
    study_name: str, storage: str | None, map_text: str | None, export_format: str = "hf"
) -> tuple[StudySettingsView, Map, str]:
    """A frozen study's settings, the map `map_text` names (default: its decided best) and the line saying which;
    a study that trained its maps (from scratch or retrofit) kept no trained weights, and is refused with the
    command that makes them (for a mergekit config: that it has no checkpoint holding them to take slices of)."""
    view = load_study_settings(study_name, storage)
    if map_text is not None:
        parse_export_map(map_text, view.space.model.n_layers, knobs=True)
    choice, why = choose_map(view, map_text, trained_only=False)
    init, steps = view.space.model.init, view.space.train.steps
    if not init or steps != 0:
        how = f"retrofit from {init} ({steps} steps a map)" if init else "from scratch"
        why_not = (
            "keeps no trained weights"
            if export_format == "hf"
            else "has no checkpoint of them for a mergekit config to take slices of"
            if not init
            else f"a mergekit config of {init} would not hold the weights its maps were trained to"
        )
        raise UserInputError(
            f"study {study_name!r} trained its maps {how} and {why_not}; train the map and save it as a "
            f"checkpoint: ilr-search train --from-study {study_name} --map '{choice.key}' --save DIR --format hf"
        )
    return view, choice, why


def check_mergekit_out(out: Path) -> Path:
    """A new .yml or .yaml file that can be written."""
    from ilr_search.commands.report import check_out_path

    path = check_out_path(out, MERGEKIT_SUFFIXES)
    if path.exists():
        raise UserInputError(f"--out {str(path)!r} exists; give a new file for the mergekit config")
    return path


def mergekit_model(init: str) -> str:
    """A study's checkpoint as a mergekit config names it: hf:NAME as NAME, a folder as its absolute path, a GGUF file
    (which mergekit does not read) as the transformers folder it was converted into (training/gguf.py, in the
    cache)."""
    from ilr_search.training.gguf import gguf_file

    if init.startswith("hf:"):
        return init[3:]
    folder = (resolve_source(init) if gguf_file(init) is not None else Path(init).expanduser()).resolve()
    if not folder.is_dir():
        raise CheckpointError(
            f"checkpoint {init}: no such folder; the mergekit config would take its slices from a checkpoint "
            "that is not there"
        )
    return str(folder)


def export_study_mergekit(
    study_name: str,
    out: str | Path,
    storage: str | None = None,
    map_text: str | None = None,
    on_choice: Callable[[str], None] | None = None,
) -> ExportedModel:
    """`export-model --study NAME --format mergekit`: the mergekit passthrough config that builds a frozen study's
    checkpoint under `map_text` (default: the study's decided best map), written to the new file `out`."""
    from ilr_search.commands.report import _atomic_write
    from ilr_search.training.mergekit import passthrough_yaml

    out = check_mergekit_out(Path(out))
    view, choice, why = frozen_study_map(study_name, storage, map_text, "mergekit")
    settings = choice.knob_settings
    others = sorted(name for name in settings if name not in SCALE_KNOBS and settings[name] != KNOB_CHOICES[name][0])
    if others:
        raise UserInputError(
            f"map {choice.key}: the knob(s) {', '.join(others)} have no place in a mergekit passthrough config, "
            "which stacks and scales a checkpoint's tensors (damping and repeat_scale residual are scales); "
            "export it with --format hf, which merges adapters into each pass's copy"
        )
    n_layers = view.space.model.n_layers
    cfg = view.model(settings, choice.parts)
    chosen = Map.of_block(0, n_layers - 1, choice.repeats, n_layers) if choice.is_stack else choice  # blockK's block
    text = passthrough_yaml(chosen, cfg.damping, mergekit_model(cfg.init), n_layers, repeat_scale=cfg.repeat_scale)
    if on_choice is not None:
        on_choice(why)
    _atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return ExportedModel(out, None, choice.key, tuple(choice.schedule()), f"study {study_name}", "mergekit")


@dataclass(frozen=True)
class ExportedModel:
    """What `export-model` wrote: where, the family of a checkpoint (None for a mergekit config), the map (its key)
    and schedule it runs, where its weights came from, and its format (hf or mergekit). to_json is
    `export-model --json`."""

    out: Path
    family: str | None
    map: str
    schedule: tuple[int, ...]
    source: str
    format: str = "hf"
    parts: tuple[str, ...] = ()  # the map's parts (ModelConfig.parts): one-branch passes

    @property
    def layers(self) -> int:
        return len(self.schedule)

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "family": self.family,
            "map": self.map,
            "schedule": list(self.schedule),
            "layers": self.layers,
            "source": self.source,
            "format": self.format,
        } | ({"zeroed_branches_cost_flops": True} if self.parts else {})
