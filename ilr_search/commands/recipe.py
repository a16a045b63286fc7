"""The winner, to full scale: one map of a study with everything needed to train it elsewhere (`recipe`), the
same map trained again with the study's stored settings (`train --from-study`), and a trained model saved as
safetensors with a config JSON and its tokenizer (`train --save`; `--format hf`: a standard transformers
checkpoint, standard_checkpoint.py; the native format is ILRTransformer.save / .load, training/model.py)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import optuna

from ilr_search.analysis.replicates import Replicates
from ilr_search.analysis.results import finite_or_none, trained_by_map
from ilr_search.commands.standard_checkpoint import (
    SAVE_FORMATS,
    check_checkpoint,
    check_format,
    check_out_dir,
    data_tokenizer,
    default_family,
    save_tokenizer,
    write_checkpoint,
)
from ilr_search.config import DataConfig, ModelConfig, SpaceConfig, TrainConfig, without_omitted_defaults
from ilr_search.data.tokenizers import check_vocab, model_config
from ilr_search.data.tokens import load_space_tokens
from ilr_search.errors import UserInputError
from ilr_search.knobs import KnobValue, format_knobs, with_knobs
from ilr_search.records import record_json
from ilr_search.search.plan import RESULT_TRAIN_FIELDS, stored_config
from ilr_search.search.race_results import decided_front, race_report
from ilr_search.search.studies import open_study
from ilr_search.space import SpaceError, check_sizes
from ilr_search.storage import Run, Store, open_store, parse_storage, stored_references, study_storage
from ilr_search.storage.trials import TrialRecord, study_trials
from ilr_search.training.flops import Budget, flops_ratio, map_param_count
from ilr_search.training.model import ILRTransformer
from ilr_search.training.pretrained import check_exportable
from ilr_search.training.schedule import Map
from ilr_search.training.schedule import map_text as key_map_text
from ilr_search.training.train import OnStep, TrainResult, train_proxy

RECIPE_FORMATS = (".toml", ".json")
# What `model` means, for another codebase (model.py is the reference; its docstring details the knobs).
ARCHITECTURE = (
    "LLaMA-style pre-norm decoder without biases: token embedding (plus learned positions if pe = "
    "learned), per layer x += attn(RMSNorm(x)) with causal multi-head attention and the pe (rope, alibi "
    "or none), then x += SwiGLU(RMSNorm(x)) with hidden size round(mlp_ratio * d_model); a final RMSNorm "
    "and an output head tied to the token embedding. Layers run in `schedule` order (layer i runs "
    "reuse_map[i] times in a row; blockK runs the stack K times). Init: normal(0.02), residual "
    "projections (attn proj, MLP down) normal(0.02 / sqrt(2 * (init_depth or n_layers))), norm gains 1."
)


def parse_map_choice(text: str, n_layers: int) -> Map:
    """A map as `--map` names it (Map.parse: `2,1,1,1`, `2,1,1,1|injection=add` with knobs as `train --knobs`
    takes them, `block:1-2:2` or `block2`), checked against the model; one error line naming the option."""
    text = text.strip()
    try:
        return Map.parse(text, n_layers).checked(n_layers).normalised()
    except ValueError as e:
        raise UserInputError(f"--map {text!r}: {e}") from None


@dataclass(frozen=True)
class StudySettingsView:
    """A stored study's configuration as the trainer takes it."""

    study: optuna.Study
    space: SpaceConfig  # model, data and train settings as stored (steps: the proxy's)
    init_depth: int  # the depth_init knob's depth (the deepest schedule the study's budget pays for)
    budget: Budget
    store: Store  # the study's store (its race, audit and reference runs), opened read-only

    def model(self, knobs: dict[str, KnobValue], parts: tuple[str, ...] = ()) -> ModelConfig:
        """The study's model with these knob settings and a map's parts (as its trials and audit build it)."""
        return dataclasses.replace(with_knobs(model_config(self.space), knobs, self.init_depth), parts=parts)

    def trials(self) -> list[TrialRecord]:
        """The study's trials, each with its result on its map's run where Optuna holds none (study_trials)."""
        return study_trials(self.study, self.store.runs())

    def references(self) -> dict[str, Run]:
        """The study's reference runs by name."""
        return stored_references(self.store.reference_runs())


def load_study_settings(study_name: str, storage: str | None) -> StudySettingsView:
    """The stored settings of an ilr-search study and its store; one-line errors for a missing or foreign study."""
    from ilr_search.commands.audit import stored_space

    spec = parse_storage(storage, read_only=True)
    study = open_study(spec, study_name)
    config = stored_config(study.user_attrs)
    if config is None:
        raise UserInputError(f"study {study_name!r} was not made by ilr-search; it has no stored settings")
    space = stored_space(study, config.space.train.steps)
    store = open_store(spec, study_name, read_only=True, storage=study_storage(study))
    return StudySettingsView(study, space, config.init_depth, config.budget, store)


def choose_map(view: StudySettingsView, map_text: str | None, trained_only: bool) -> tuple[Map, str]:
    """The map `--map` names (default: the front's complete map of lowest perplexity) and a line saying which.
    `trained_only`: the map must have a result in the study (a trial, or a block reference)."""
    trials = view.trials()
    n_layers = view.space.model.n_layers
    if map_text is None:
        return default_map(view, trials)
    choice = parse_map_choice(map_text, n_layers)
    if not trained_only:
        return choice, f"map {choice.key}"
    trained = trained_by_map(trials)
    references = view.references() if choice.is_stack else {}
    if choice.is_stack and choice.key not in references:
        whole = Map.of_block(0, n_layers - 1, choice.repeats, n_layers)  # a study searching blocks trains blockK so
        if whole.key in trained:
            choice = whole
    if choice.is_stack:
        if choice.key not in references:
            raise UserInputError(
                f"--map {map_text!r}: study {view.study.study_name!r} has no {choice.key} "
                "reference run; give a map it trained (ilr-search trials lists them)"
            )
        return choice, f"map {choice.key} (reference run)"
    if choice.key in trained:
        return choice, f"map {choice.key} (trial {trained[choice.key].number})"
    if not choice.knobs:  # a map without knobs names the one trained knob setting of that map
        same = [k for k in trained if key_map_text(k) == choice.key]
        if len(same) == 1:
            t = trained[same[0]]
            choice = choice.with_knobs(dict(t.knobs))
            return choice, f"map {choice.key} (trial {t.number})"
        if len(same) > 1:
            raise UserInputError(
                f"--map {map_text!r}: study {view.study.study_name!r} trained it with several knob "
                f"settings ({', '.join(same)}); give one of them"
            )
    raise UserInputError(
        f"--map {map_text!r}: study {view.study.study_name!r} did not train that map; "
        "give one it trained (ilr-search trials lists them)"
    )


def default_map(view: StudySettingsView, trials: list[TrialRecord]) -> tuple[Map, str]:
    """The map of lowest perplexity on the study's decided front (decided_front: the race's, at its raced length,
    where the study was raced; the proxy's otherwise), with the line saying which and why."""
    race = race_report(trials, view.study.user_attrs, view.store.runs())
    front = decided_front(trials, race)
    if not front:
        raise UserInputError(f"study {view.study.study_name!r} has no complete trial yet; give --map or run it first")
    best = min(front, key=lambda p: (p.val_ppl, p.flops_ratio))
    trial = {t.number: t for t in trials}.get(best.trial) if best.trial is not None else None  # None: the baseline
    choice = Map.parse(best.map, view.space.model.n_layers).with_knobs(dict(trial.knobs) if trial is not None else {})
    words = Replicates.of(race.settings if race is not None else None)
    where = (
        f"the race's front {words.at(cast(int, best.steps))} (mean of {words.count(len(best.seeds))})"
        if best.beyond_proxy(view.space.train.steps)
        else "the proxy's front"
    )
    source = f"trial {best.trial}" if best.trial is not None else "the baseline"
    return choice, (
        f"map {choice.key} ({source}): the map of lowest perplexity on {where} ({best.val_ppl:.4g}); "
        "--map chooses another"
    )


def picked(record: Any, names: Sequence[str]) -> dict[str, Any]:
    """These fields of a stored record (a TrialRecord, a Run), under their names; None throughout for no record."""
    return {name: getattr(record, name) if record is not None else None for name in names}


RUN_RESULT = ("steps", "val_ppl", "val_bpb")  # what a recipe lists of every measured run of its map


def measured_results(view: StudySettingsView, choice: Map) -> dict[str, Any]:
    """What the study measured for the map, as the recipe lists it: its proxy result (the trial that trained it,
    or the block-recurrence reference run: None throughout where the study has none), its finished race runs (the
    race's and the audit's longer or extra-seed runs), the second-seed reference where it is that map, and a
    prediction (none: ilr-search makes no extrapolation yet)."""
    refs = view.references()
    proxy: dict[str, Any] | None = None
    if choice.is_stack:
        proxy = {"kind": "reference"} | picked(refs.get(choice.key), (*RUN_RESULT, "status"))
    else:
        t = trained_by_map(view.trials()).get(choice.key)
        if t is not None:
            proxy = {"kind": "trial", "trial": t.number, "state": t.state.name}
            proxy |= picked(t, (*RUN_RESULT, "pruned_at_step"))
    runs = [
        {"factor": float(row.job.factor), "seed": row.job.seed} | picked(row, ("steps", "state", *RUN_RESULT[1:]))
        for row in view.store.race_runs()
        if row.job.map_key == choice.key and row.state in ("complete", "failed")
    ]
    second = refs.get("second_seed")
    is_second = (
        second
        and list(second.reuse_map or ()) == list(choice.counts)
        and second.knobs == choice.knob_settings
        and not choice.is_stack
    )
    second_seed = picked(second, ("seed", *RUN_RESULT)) if is_second else None
    return {"proxy": proxy, "race_runs": runs, "second_seed": second_seed, "prediction": None}


# The training settings a recipe lists, as TrainConfig names them: those a study's results depend on (what it
# stores of its training), and the dtype; then the tokens a step, optimizer and schedule
RECIPE_TRAIN = (*RESULT_TRAIN_FIELDS, "dtype")


@dataclass(frozen=True)
class Recipe:
    """One trained map of a study with everything needed to train it elsewhere (`ilr-search recipe`): the map, its
    FLOPs ratio and parameters, the study's budget, the model (the map's knobs on), data and training settings,
    and what the study measured. to_json is the recipe as written (`recipe --json`, the TOML without its Nones)."""

    study: str
    choice: Map
    flops_ratio: float
    params: int
    budget: Budget
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    measured: dict[str, Any]  # measured_results

    @property
    def map(self) -> str:
        return self.choice.key

    def to_json(self) -> dict[str, Any]:
        choice, train = self.choice, self.train
        settings = record_json(train)
        return {
            "study": self.study,
            "map": choice.key,
            "reuse_map": list(choice.counts),
            "block": choice.stack_repeats,
            "schedule": choice.schedule(),
            "knobs": choice.knobs,
            "flops_ratio": self.flops_ratio,
            "params": self.params,
            "budget": self.budget.to_dict(),
            "architecture": ARCHITECTURE,
            "model": record_json(self.model),
            "data": without_omitted_defaults("data", record_json(self.data)),
            "train": {name: settings[name] for name in RECIPE_TRAIN}
            | {
                "tokens_per_step": train.tokens(self.model.seq_len) // train.steps,
                "optimizer": "AdamW(betas=(0.9, 0.95)); weight decay on matrices only",
                "lr_schedule": train.lr_schedule_text(),
            },
            "measured": self.measured,
            "train_command": f"ilr-search train --from-study {self.study} --map '{choice.key}' --steps N --save DIR",
        }


def study_recipe(
    study_name: str,
    storage: str | None = None,
    map_text: str | None = None,
    on_choice: Callable[[str], None] | None = None,
) -> Recipe:
    """`ilr-search recipe`: the model config, map, schedule, knobs, training and data settings, and measured
    perplexities of one trained map of a study (default: the map of lowest perplexity on its decided front)."""
    view = load_study_settings(study_name, storage)
    choice, why = choose_map(view, map_text, trained_only=True)
    if on_choice is not None:
        on_choice(why)
    model = view.model(choice.knob_settings, choice.parts)
    return Recipe(
        study_name,
        choice,
        flops_ratio(model, choice.schedule()),
        map_param_count(model, choice.schedule()),
        view.budget,
        model,
        view.space.data,
        view.space.train,
        measured_results(view, choice),
    )


def without_none(obj: Any) -> Any:
    """TOML has no null: keys whose value is None are left out."""
    if isinstance(obj, dict):
        return {k: without_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [without_none(v) for v in obj]
    return obj


def recipe_text(recipe: dict[str, Any], suffix: str) -> str:
    """A recipe's JSON form (Recipe.to_json) as a .json or a .toml file's text."""
    if suffix == ".json":
        return json.dumps(recipe, indent=2) + "\n"
    import tomli_w

    text = tomli_w.dumps(without_none(recipe))
    return text if text.endswith("\n") else text + "\n"


def write_recipe(recipe: Recipe, out: Path) -> None:
    from ilr_search.commands.report import _atomic_write

    text = recipe_text(recipe.to_json(), out.suffix.lower())
    _atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


# ----------------------------------------------------------------------------------------------------
# Training a study's map again, and saving / loading a trained model.


def check_save_dir(save: Path) -> Path:
    """A folder `train --save` can write (created only after training); refused before any work otherwise."""
    if save.exists() and not save.is_dir():
        raise UserInputError(f"--save {str(save)!r} is a file; give a folder")
    parent = save if save.exists() else next((p for p in save.parents if p.exists()), Path("."))
    if not os.access(parent, os.W_OK):
        raise UserInputError(f"--save {str(save)!r}: cannot write in {str(parent)!r}")
    return save


def train_from_study(
    study_name: str,
    storage: str | None,
    map_text: str | None,
    steps: int | None,
    train_overrides: dict[str, Any],
    on_step: OnStep | None = None,
    save: Path | None = None,
    on_choice: Callable[[str], None] | None = None,
    save_format: str = "native",
) -> TrainReport:
    """`train --from-study`: train a map (default: the study's best front map) with the study's stored model,
    data and training settings, at `steps` steps (default: the proxy's), optionally saving the model
    (`save_format`: native, or hf, a standard transformers checkpoint; standard_checkpoint.py)."""

    view = load_study_settings(study_name, storage)
    choice, why = choose_map(view, map_text, trained_only=False)
    if steps is not None and steps < 1:
        raise UserInputError(f"--steps must be at least 1, got {steps}")
    model_cfg = view.model(choice.knob_settings, choice.parts)
    train_steps = steps or view.space.train.steps
    if train_steps < 1:  # a frozen study's maps were never trained: --steps says how long
        raise UserInputError(
            f"study {study_name!r} is a frozen search (its maps evaluated, not trained); give "
            "--steps N to train the map from the checkpoint's weights"
        )
    train_cfg = dataclasses.replace(
        view.space.train, steps=train_steps, **{k: v for k, v in train_overrides.items() if v is not None}
    )
    space = dataclasses.replace(view.space, train=train_cfg)
    try:
        check_sizes(space)
    except SpaceError as e:
        raise UserInputError(f"--steps {steps}: {e.detail}" if e.section == "train" else str(e)) from None
    if save is not None:
        check_save(model_cfg, choice.schedule(), save, save_format)
    if on_choice is not None:
        on_choice(why)
    data = load_space_tokens(space)
    check_vocab(model_cfg, data.vocab_size)
    result = train_and_save(model_cfg, choice, data, space, on_step, save, {"study": study_name}, save_format)
    report = train_report_of(model_cfg, choice.counts, result, choice.stack_repeats, choice.knob_settings, save)
    return dataclasses.replace(report, study=study_name, map=choice.key)


def check_save(model_cfg: ModelConfig, schedule: Sequence[int], save: Path, save_format: str) -> None:
    """`--save DIR --format F`, checked before any work: a folder that can be written, and for hf a model that a
    standard checkpoint can hold (its tokenizer checked once the data is read)."""
    if check_format(save_format, SAVE_FORMATS) == "native":
        check_save_dir(save)
        return
    check_out_dir(save, "--save")
    check_exportable(model_cfg, default_family(model_cfg))


def train_and_save(
    model_cfg: ModelConfig,
    choice: Map,
    data: Any,
    space: SpaceConfig,
    on_step: OnStep | None,
    save: Path | None,
    extra: dict[str, Any] | None = None,
    save_format: str = "native",
) -> TrainResult:
    """Train the map; with `save`, write the trained model there: natively (ILRTransformer.save, with a copy of its
    tokenizer), or with save_format hf as a standard transformers checkpoint of its schedule unrolled."""
    tokenizer = data_tokenizer(model_cfg, space.data, data.path) if save is not None else None
    family = default_family(model_cfg) if save_format == "hf" else None
    if save is not None and family is not None:
        check_checkpoint(model_cfg, choice.schedule(), family, tokenizer)
    kept: list[ILRTransformer] = []
    result = train_proxy(
        model_cfg,
        choice.schedule(),
        data,
        space.train,
        on_step=on_step,
        on_trained=kept.append if save is not None else None,
    )
    if save is not None and family is not None:
        write_checkpoint(kept[0].to("cpu"), choice.schedule(), save, family, tokenizer)
    elif save is not None:
        kept[0].to("cpu").save(
            save,
            choice.schedule(),
            (extra or {})
            | {
                "map": choice.text if choice.is_stack else choice.key,  # blockK's name has no knobs
                "reuse_map": list(choice.counts),
                "block": choice.stack_repeats,
                "knobs": choice.knobs,
                "train": record_json(space.train),
                "data": record_json(space.data),
                "result": result_json(result, ("status", "steps", "tokens", *RESULT_MEASURES)),
            },
        )
        save_tokenizer(save, tokenizer)
    return result


RESULT_MEASURES = ("val_loss", "val_ppl", "val_bpb")  # a training result's measures (None where not finite)


def result_json(result: TrainResult, names: Sequence[str]) -> dict[str, Any]:
    """These fields of a training result, under their names, its measures (RESULT_MEASURES) None where not
    finite."""
    return {
        name: finite_or_none(getattr(result, name)) if name in RESULT_MEASURES else getattr(result, name)
        for name in names
    }


@dataclass(frozen=True)
class TrainReport:
    """One trained map (`ilr-search train`, `train --from-study`): its reuse map, FLOPs ratio and training result,
    the block recurrence K where it is one, its knob settings, the study and map key it was trained from (with
    --from-study) and the folder it was saved to. to_json is the command's --json."""

    reuse_map: tuple[int, ...]
    flops_ratio: float
    result: TrainResult
    block: int | None
    knobs: str
    saved: str | None
    study: str | None = None  # with `map`: `train --from-study`
    map: str | None = None

    def to_json(self) -> dict[str, Any]:
        result = self.result
        report: dict[str, Any] = (
            {"reuse_map": list(self.reuse_map), "params": result.params, "flops_ratio": self.flops_ratio}
            | result_json(result, ("steps", "tokens", *RESULT_MEASURES, "train_seconds", "tokens_per_second", "status"))
            | {"curve": result.curve_dicts()}
            | result_json(result, ("schedule", "reason", "data_seconds", "eval_seconds", "device", "dtype"))
        )
        if self.block is not None:
            report["block"] = self.block
        report["knobs"] = self.knobs
        if result.route_fractions is not None:  # a routed map: what its last evaluation ran, beside the nominal ratio
            report |= {"route_fractions": result.route_fractions, "realised_flops_ratio": result.realised_flops_ratio}
        if self.study is not None:
            report |= {"study": self.study, "map": self.map}
        return report | {"saved": self.saved}


def train_report_of(
    cfg: ModelConfig,
    counts: Sequence[int],
    result: TrainResult,
    block: int | None,
    knobs: dict[str, KnobValue],
    saved: Path | None,
) -> TrainReport:
    """The report of a trained map: `counts` its reuse map, `knobs` its settings, `saved` the folder written."""
    return TrainReport(
        tuple(counts),
        flops_ratio(cfg, result.schedule),
        result,
        block,
        format_knobs(knobs),
        str(saved) if saved is not None else None,
    )
