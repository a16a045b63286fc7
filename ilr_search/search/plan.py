"""What a study is: its configuration and name, derived from the space and budget, stored in the study, and
checked on resume (a resume with other settings is refused with the differences named)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from ..config import KNOB_FIELD_DEFAULTS, ModelConfig, SearchConfig, SpaceConfig, StudySettings, TrainConfig
from ..data import model_config
from ..errors import UserInputError
from ..flops import Budget, parse_budget
from ..knobs import KnobValue, with_knobs
from ..storage import StorageSpec
from ..device import resolve_device, resolve_dtype

from .pruners import pruner_settings


CONFIG_ATTR = "ilr:config"


SAMPLER_ATTR = "ilr:sampler"


FIDELITY_ATTR = "ilr:fidelity"


ENQUEUED_BLOCKS_ATTR = "ilr:enqueued_blocks"  # block K asked for with --enqueue blockK: trained as reference runs


@dataclass(frozen=True)


class StudyPlan:
    space: SpaceConfig
    model: ModelConfig  # with the tokenizer's vocabulary
    budget: Budget
    dtype: str
    config: dict[str, Any]  # what the study stores and a resume must match
    name: str

    @property
    def init_depth(self) -> int:
        """The depth knob's init depth: the deepest schedule the budget pays for, the same for every map."""
        return self.budget.max_layer_runs(self.model)

    def trial_model(self, knobs: dict[str, KnobValue]) -> ModelConfig:
        return with_knobs(self.model, knobs, self.init_depth)


RESULT_TRAIN_FIELDS = ("steps", "batch_size", "grad_accum", "lr", "warmup_frac", "min_lr_frac", "weight_decay",
                       "grad_clip", "eval_fractions", "eval_windows", "seed")


# The schedule's fields beyond cosine's, stored only where they are not the defaults: a study made before wsd
# existed keeps its configuration (and its derived name).
LR_SCHEDULE_FIELDS = ("lr_schedule", "warmup_steps", "cooldown_frac")


RACE_FIELDS = ("target", "race_seeds", "race_contenders")


def study_config(space: SpaceConfig, model: ModelConfig, budget: Budget, dtype: str) -> dict[str, Any]:
    # Knob fields are stored only where they are not off, and the searched knobs only where there are some:
    # a study made before the knobs existed keeps its configuration (and its derived name).
    stored_model = {k: v for k, v in dataclasses.asdict(model).items()
                    if k not in KNOB_FIELD_DEFAULTS or v != KNOB_FIELD_DEFAULTS[k]}
    search: dict[str, Any] = {"max_reuse": space.search.max_reuse, "families": list(space.search.families),
                              "objective": space.search.objective}
    if space.search.knobs:
        search |= {"knobs": list(space.search.knobs), "init_depth": budget.max_layer_runs(model)}
    # The race's length and seeds likewise, only where they are not the defaults.
    search |= {k: getattr(space.search, k) for k in RACE_FIELDS if getattr(space.search, k) != getattr(SearchConfig(), k)}
    return {
        "model": stored_model,
        "data": dataclasses.asdict(space.data),
        "train": {k: getattr(space.train, k) for k in RESULT_TRAIN_FIELDS} | {"dtype": dtype}
                 | {k: getattr(space.train, k) for k in LR_SCHEDULE_FIELDS
                    if getattr(space.train, k) != getattr(TrainConfig(), k)},
        "budget": {"text": budget.text, "ratio": round(budget.ratio, 9)},
        "search": search,
    }


def canonical_config(config: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(config, sort_keys=True))


def derive_study_name(config: dict[str, Any]) -> str:
    m, d = config["model"], config["data"]
    digest = hashlib.sha256(json.dumps(canonical_config(config), sort_keys=True).encode()).hexdigest()[:8]
    corpus = "stdlib" if d["corpus"] == "stdlib" else Path(d["corpus"].replace(":", "-")).name[:24]
    return (f"ilr-L{m['n_layers']}-d{m['d_model']}-{m['pe']}-{corpus}-{d['tokenizer'].replace(':', '')}"
            f"-{config['budget']['ratio']:g}x-{digest}")


def config_differences(stored: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(stored) | set(wanted)):
        a, b = stored.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: study has {a!r}, this run asks for {b!r}")
    return diffs


def plan_study(space: SpaceConfig, budget_text: str, study_name: str | None) -> StudyPlan:
    """Everything about the study that can be checked without touching storage or data."""
    model = model_config(space)
    budget = parse_budget(budget_text, model)
    device = resolve_device(space.train.device)
    dtype = resolve_dtype(space.train.dtype, device, model, space.train.batch_size)
    config = study_config(space, model, budget, dtype)
    return StudyPlan(space, model, budget, dtype, config, study_name or derive_study_name(config))


def stored_study(storage: optuna.storages.BaseStorage | None, name: str) -> optuna.Study | None:
    """The study `name` in a storage already open (None where there is no storage yet, or no such study)."""
    if storage is None:
        return None
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def adopt_stored_dtype(storage: optuna.storages.BaseStorage | None, plan: StudyPlan) -> StudyPlan:
    """`--dtype auto` resumes a study in the dtype it was made with (made on a GPU in bf16, resumed on a CPU).
    `storage`: the storage already open, None where there is none yet."""
    study = stored_study(storage, plan.name)
    if study is None:
        return plan
    stored = study.user_attrs.get(CONFIG_ATTR, {}).get("train", {}).get("dtype")
    if stored is None or stored == plan.dtype:
        return plan
    config = plan.config | {"train": plan.config["train"] | {"dtype": stored}}
    return dataclasses.replace(plan, dtype=stored, config=config)


def search_differences(settings: StudySettings, space: SpaceConfig, sampler_flag: str | None,
                       pruner_flag: str | None) -> list[str]:
    """How this run's sampler and pruner settings, from flags or the space's TOML alike, differ from a stored
    study's. A study stored before calibrated pruning existed keeps its rule unless a flag asks for another."""
    diffs = []
    if space.search.sampler != settings.sampler.requested:
        diffs.append(f"sampler: study has {settings.sampler.requested!r}, this run asks for {space.search.sampler!r}")
    stored = settings.pruner
    if settings.pruner_before_calibration:  # only a flag is checked
        if pruner_flag is not None and pruner_flag != stored.name:
            diffs.append(f"pruner: study has {stored.name!r}, this run asks for {pruner_flag!r}")
        return diffs
    wanted = pruner_settings(space)
    for field in ("name", "eta", "epsilon", "warmup", "calibration_maps", "min_spearman"):
        a, b = getattr(stored, field), getattr(wanted, field)
        if a != b:
            key = "pruner" if field == "name" else f"prune_{field}"
            diffs.append(f"{key}: study has {a!r}, this run asks for {b!r}")
    return diffs


def check_resume(storage: optuna.storages.BaseStorage | None, spec: StorageSpec, plan: StudyPlan,
                 sampler: str | None, pruner: str | None) -> StudySettings | None:
    """The stored settings of an existing study of that name (None if new, or stored without them); refuses
    incompatible resumes. `storage`: the storage already open on `spec`, None where there is none yet."""
    study = stored_study(storage, plan.name)
    if study is None:
        return None
    stored = study.user_attrs.get(CONFIG_ATTR)
    for _ in range(50):  # another worker may have just created the study and not yet stored its configuration
        if stored is not None or study.trials:
            break
        time.sleep(0.2)
        stored = study.user_attrs.get(CONFIG_ATTR)
    if stored is None:
        raise UserInputError(f"study {plan.name!r} in {spec.masked} was not made by ilr-search; choose another --study")
    diffs = config_differences(stored, canonical_config(plan.config))
    settings = StudySettings.from_dict(study.user_attrs[SAMPLER_ATTR]) if SAMPLER_ATTR in study.user_attrs else None
    if settings is not None:
        diffs += search_differences(settings, plan.space, sampler, pruner)
    if diffs:
        raise UserInputError(f"cannot resume study {plan.name!r} with another configuration ({'; '.join(diffs)}); "
                             "rerun with the study's settings or choose a new --study")
    return settings


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
