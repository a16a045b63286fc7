"""What a study is: its configuration and name, derived from the space and budget, stored in the study, and
checked on resume (a resume with other settings is refused with the differences named)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from ilr_search.config import (
    SPACE_SCHEMA_VERSION,
    STORED_OMITTED_DEFAULTS,
    Dtype,
    ModelConfig,
    SpaceConfig,
    StudySettings,
    without_omitted_defaults,
)
from ilr_search.data.tokenizers import model_config
from ilr_search.errors import UserInputError
from ilr_search.knobs import KnobValue, with_knobs
from ilr_search.search.pruners import pruner_settings
from ilr_search.storage import StorageSpec
from ilr_search.storage.trials import CONFIG_ATTR  # the study attribute of its stored configuration
from ilr_search.training.device import frozen_dtype, resolve_device, resolve_dtype
from ilr_search.training.flops import Budget, parse_budget

SAMPLER_ATTR = "ilr:sampler"


ENQUEUED_BLOCKS_ATTR = "ilr:enqueued_blocks"  # block K asked for with --enqueue blockK: trained as reference runs


LAYOUT_ATTR = "ilr:layout"  # how the study's runs used the machine: a list of StudyLayout records, one per change


@dataclass(frozen=True)
class PhaseLayout:
    """How one phase of a run trains: `processes` processes, each with `threads` torch threads (None: not set, as
    on a GPU) in each of its `lanes` (Python threads that train groups side by side, training/jobs.py), each
    training up to `fuse` runs at once in one fused group. Threads, lanes and fusion change the float rounding of
    training, so two runs of one study give the same numbers only with the same layout."""

    processes: int
    threads: int | None
    fuse: int
    lanes: int = 1

    def describe(self) -> str:
        where = f"{self.processes} processes" if self.processes > 1 else "1 process"
        lanes = f" x {self.lanes} lanes" if self.lanes > 1 else ""
        threads = "" if self.threads is None else f" x {self.threads} thread{'s' if self.threads != 1 else ''}"
        return f"{where}{lanes}{threads}, K = {self.fuse}"


@dataclass(frozen=True)
class StudyLayout:
    """How a run of the study uses the machine: for its trials and reference runs, and for its race."""

    trials: PhaseLayout
    race: PhaseLayout

    def describe(self) -> str:
        return f"trials {self.trials.describe()}; race {self.race.describe()}"

    def to_dict(self) -> dict[str, Any]:
        return {"trials": dataclasses.asdict(self.trials), "race": dataclasses.asdict(self.race)}

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> StudyLayout:
        return cls(
            *(
                PhaseLayout(
                    int(stored[k]["processes"]),
                    None if stored[k]["threads"] is None else int(stored[k]["threads"]),
                    int(stored[k]["fuse"]),
                    int(stored[k].get("lanes", 1)),
                )
                for k in ("trials", "race")
            )
        )


def stored_layouts(study_attrs: Mapping[str, Any]) -> list[tuple[StudyLayout, int]]:
    """The layouts a study ran with, in order, each with the finished trials the study had when it began."""
    return [(StudyLayout.from_dict(r), int(r.get("finished_trials", 0))) for r in study_attrs.get(LAYOUT_ATTR, [])]


def stored_layout(study_attrs: Mapping[str, Any]) -> StudyLayout | None:
    """The layout the study last ran with (None: none stored, a study made before layouts were stored)."""
    layouts = stored_layouts(study_attrs)
    return layouts[-1][0] if layouts else None


def record_layout(study: optuna.Study, layout: StudyLayout, finished_trials: int) -> None:
    """Store `layout` as the study's present one, unless it already is (the record grows only on a change)."""
    if stored_layout(study.user_attrs) == layout:
        return
    records = list(study.user_attrs.get(LAYOUT_ATTR, []))
    study.set_user_attr(LAYOUT_ATTR, records + [layout.to_dict() | {"finished_trials": finished_trials}])


@dataclass(frozen=True)
class StudyPlan:
    space: SpaceConfig
    model: ModelConfig  # with the tokenizer's vocabulary
    budget: Budget
    dtype: Dtype
    config: dict[str, Any]  # what the study stores and a resume must match
    name: str

    @property
    def init_depth(self) -> int:
        """The depth knob's init depth: the deepest schedule the budget pays for, the same for every map."""
        return self.budget.max_layer_runs(self.model)

    def trial_model(self, knobs: dict[str, KnobValue], parts: tuple[str, ...] = ()) -> ModelConfig:
        """The study's model with a map's knob settings and its parts (ModelConfig.parts; Map.parts)."""
        return dataclasses.replace(with_knobs(self.model, knobs, self.init_depth), parts=parts)


RESULT_TRAIN_FIELDS = (
    "steps",
    "batch_size",
    "grad_accum",
    "lr",
    "warmup_frac",
    "min_lr_frac",
    "weight_decay",
    "grad_clip",
    "eval_fractions",
    "eval_windows",
    "seed",
)


# The schedule's fields beyond cosine's, stored only where they are not the defaults: a study made before wsd
# existed keeps its configuration (and its derived name).
LR_SCHEDULE_FIELDS = ("lr_schedule", "warmup_steps", "cooldown_frac")
# the training fields a study stores only where they are not STORED_OMITTED_DEFAULTS' (the schedule's, the retrofit's)
OPTIONAL_TRAIN_FIELDS = (*LR_SCHEDULE_FIELDS, "retrofit")


RACE_FIELDS = (
    "target",
    "race_seeds",
    "race_contenders",
    "race_policy",
    "max_seeds",
    "race_screen",
    "equal_compute",
    "look_every",
    "judge",
)


# The race's policy and the adaptive race's own settings: stored with a study, but not part of what names it or of
# what a resume must match. A study made before they existed resumes under its old name with the race it was made
# with (the fixed race: STORED_OMITTED_DEFAULTS), while a new study of the same space is made with today's; a
# flag that asks a stored study for another of these is refused (adopt_stored).
ADOPTED_RACE_FIELDS = ("race_policy", "max_seeds", "race_screen", "equal_compute", "look_every")


SCHEMA_KEY = "schema_version"  # in the stored configuration, but not part of what the study is (its name, resumes)


def study_config(space: SpaceConfig, model: ModelConfig, budget: Budget, dtype: Dtype) -> dict[str, Any]:
    """What a study stores as its configuration (CONFIG_ATTR): the parts of the space (SpaceConfig.to_dict) that
    change its results, its budget, and the schema version; SpaceConfig.from_dict reads it back."""
    full = dataclasses.replace(space, model=model, train=dataclasses.replace(space.train, dtype=dtype)).to_dict()
    # Knob and pretrained-architecture fields are stored only where they are not off, the answer column only where
    # there is one, the searched knobs only where there are some, and the race's length and seeds only where they
    # are not STORED_OMITTED_DEFAULTS': a study made before these existed keeps its configuration (and its derived
    # name), and from_dict reads the omitted values back.
    omitted_train, omitted_search = STORED_OMITTED_DEFAULTS["train"], STORED_OMITTED_DEFAULTS["search"]
    stored_model = without_omitted_defaults("model", full["model"])
    stored_data = without_omitted_defaults("data", full["data"])
    search: dict[str, Any] = {k: full["search"][k] for k in ("max_reuse", "families", "objective")}
    if space.search.knobs:
        search |= {"knobs": full["search"]["knobs"], "init_depth": budget.max_layer_runs(model)}
    damping = full["search"]["damping_choices"]
    if "damping" in space.search.knobs and tuple(damping) != omitted_search["damping_choices"]:
        search["damping_choices"] = damping
    search |= {k: full["search"][k] for k in RACE_FIELDS if full["search"][k] != omitted_search[k]}
    if tuple(space.search.parts) != omitted_search["parts"]:
        search["parts"] = full["search"]["parts"]
    init = full["model"].get("init")
    return {
        SCHEMA_KEY: SPACE_SCHEMA_VERSION,
        **({"init": checkpoint_identity(init)} if init else {}),
        "model": stored_model,
        "data": stored_data,
        "train": {k: full["train"][k] for k in (*RESULT_TRAIN_FIELDS, "dtype")}
        | {k: full["train"][k] for k in OPTIONAL_TRAIN_FIELDS if full["train"][k] != omitted_train[k]},
        "budget": budget.to_dict(),
        "search": search,
    }


def checkpoint_identity(source: str) -> dict[str, str]:
    """What a study of a pretrained model knows its checkpoint by, so that a resume with another checkpoint is
    refused: its source and the SHA-256 of its config.json (and of its tokenizer.json where it has one); for a GGUF
    file, of the file itself (the folder converted from it is derived: its bytes depend on the converter)."""
    from ilr_search.training.pretrained import open_checkpoint

    checkpoint = open_checkpoint(source)
    if checkpoint.gguf is not None:
        return {"source": source, "gguf_sha256": checkpoint.gguf.sha256}
    identity = {
        "source": source,
        "config_sha256": hashlib.sha256((checkpoint.path / "config.json").read_bytes()).hexdigest(),
    }
    if checkpoint.tokenizer_file is not None:
        identity["tokenizer_sha256"] = hashlib.sha256(checkpoint.tokenizer_file.read_bytes()).hexdigest()
    return identity


@dataclass(frozen=True)
class StoredConfig:
    """A study's stored configuration (CONFIG_ATTR) read back, whatever its schema version."""

    space: SpaceConfig  # the study's space: its model with the tokenizer's vocabulary, train.dtype the study's
    budget: Budget
    init_depth: int  # the depth_init knob's depth (the deepest schedule the budget pays for); 0: no knob searched
    schema_version: int

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> StoredConfig:
        space = SpaceConfig.from_dict(stored)
        return cls(
            space,
            Budget.from_dict(stored["budget"], space.model),
            int(stored.get("search", {}).get("init_depth", 0)),
            int(stored.get(SCHEMA_KEY, 0)),
        )


def stored_config(study_attrs: Mapping[str, Any]) -> StoredConfig | None:
    """The stored configuration of a study from its user attributes; None for a study not made by ilr-search."""
    stored = study_attrs.get(CONFIG_ATTR)
    return None if stored is None else StoredConfig.from_dict(stored)


def study_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """What names a study and what a resume must match: its stored configuration without the schema version
    (a study stored before the version existed resumes under the same name, with the same check) and without the
    race settings a resume adopts (ADOPTED_RACE_FIELDS)."""
    identity = {k: v for k, v in config.items() if k != SCHEMA_KEY}
    if isinstance(identity.get("search"), Mapping):
        identity["search"] = {k: v for k, v in identity["search"].items() if k not in ADOPTED_RACE_FIELDS}
    return canonical_config(identity)


def canonical_config(config: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(config, sort_keys=True))


def derive_study_name(config: dict[str, Any]) -> str:
    m, d = config["model"], config["data"]
    digest = hashlib.sha256(json.dumps(study_identity(config), sort_keys=True).encode()).hexdigest()[:8]
    corpus = "stdlib" if d["corpus"] == "stdlib" else Path(d["corpus"].replace(":", "-")).name[:24]
    if d.get("answer_column"):  # a study of the answer loss says so (only they store an answer column)
        corpus += "-answer"
    if m.get("init"):  # a pretrained model: named by its checkpoint (its tokenizer is the checkpoint's own)
        checkpoint = safe_name(Path(m["init"].replace(":", "-")).name)[:24]
        return (
            f"ilr-{checkpoint}-L{m['n_layers']}-d{m['d_model']}-{corpus}-{config['budget']['ratio']:g}x"
            f"-{'frozen' if config['train']['steps'] == 0 else str(config['train']['steps']) + 'steps'}-{digest}"
        )
    return (
        f"ilr-L{m['n_layers']}-d{m['d_model']}-{m['pe']}-{corpus}-{d['tokenizer'].replace(':', '')}"
        f"-{config['budget']['ratio']:g}x-{digest}"
    )


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
    # a frozen study evaluates only: bf16 where the device computes it natively (device.frozen_dtype)
    dtype = (
        frozen_dtype(space.train.dtype, device) if space.train.steps == 0 else resolve_dtype(space.train.dtype, device)
    )
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


def adopt_stored(
    study: optuna.Study | None, plan: StudyPlan, dtype_auto: bool, asked: Mapping[str, str | int] | None = None
) -> StudyPlan:
    """`plan` with what a stored study (`study`; None where there is none yet) keeps on a resume: its race settings
    (ADOPTED_RACE_FIELDS; a study made with the fixed race is resumed with it) and, under `--dtype auto`
    (`dtype_auto`), the dtype it was made with (made on a GPU in bf16, resumed on a CPU). `asked`: the race
    settings this run's flags ask for; one that differs from the study's is refused."""
    config = stored_config(study.user_attrs) if study is not None else None
    if config is None:
        return plan
    stored = {k: getattr(config.space.search, k) for k in ADOPTED_RACE_FIELDS}
    conflicts = [
        f"{k}: study has {stored[k]!r}, this run asks for {v!r}"
        for k, v in (asked or {}).items()
        if k in stored and v is not None and v != stored[k]
    ]
    if conflicts:
        raise UserInputError(
            f"cannot resume study {plan.name!r} with another race ({'; '.join(conflicts)}); drop "
            "these flags to resume it as it was made, or choose a new --study"
        )
    space = dataclasses.replace(plan.space, search=dataclasses.replace(plan.space.search, **stored))
    dtype = config.space.train.dtype if dtype_auto else plan.dtype
    return dataclasses.replace(
        plan, space=space, dtype=dtype, config=study_config(space, plan.model, plan.budget, dtype)
    )


def search_differences(settings: StudySettings, space: SpaceConfig, pruner_flag: str | None) -> list[str]:
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


def check_resume(
    study: optuna.Study | None, spec: StorageSpec, plan: StudyPlan, pruner: str | None
) -> StudySettings | None:
    """The stored settings of `study`, the stored study of that name in `spec` (None if new, or stored without
    them); refuses incompatible resumes."""
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
    diffs = config_differences(study_identity(stored), study_identity(plan.config))
    settings = StudySettings.from_dict(study.user_attrs[SAMPLER_ATTR]) if SAMPLER_ATTR in study.user_attrs else None
    if settings is not None:
        diffs += search_differences(settings, plan.space, pruner)
    if diffs:
        raise UserInputError(
            f"cannot resume study {plan.name!r} with another configuration ({'; '.join(diffs)}); "
            "rerun with the study's settings or choose a new --study"
        )
    return settings


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
