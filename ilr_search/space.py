"""Search spaces: TOML presets (search_spaces/*.toml) that fix the architecture, data, proxy training and
search settings; command-line flags override any of them."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ilr_search.config import (
    DEVICES,
    DTYPES,
    EQUAL_COMPUTE,
    FAMILIES,
    ITEM_OBJECTIVES,
    LR_SCHEDULES,
    MAP_PARTS,
    OBJECTIVES,
    PRUNERS,
    RACE_POLICIES,
    RETROFITS,
    SAMPLERS,
    SIZE_MAXIMA,
    TRIAL_FAMILIES,
    DataConfig,
    SearchConfig,
    SpaceConfig,
    TrainConfig,
    race_target_steps,
    races,
)
from ilr_search.errors import UserInputError
from ilr_search.knobs import check_knobs
from ilr_search.time_budget import parse_duration

PRESETS = Path(__file__).resolve().parent / "search_spaces"  # shipped in the package (search_spaces/ links here)
DEFAULT_SPACE = PRESETS / "default.toml"


class SpaceError(UserInputError):
    """A search-space file or override that cannot be used; `section` is the TOML section whose values were
    refused (None for checks across sections), `detail` the reason without the file's name."""

    def __init__(self, message: str, section: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.section, self.detail = section, detail


# The command-line flag of an override key where it is not `--` + the key with dashes (data corpus: --data).
_FLAGS = {("data", "corpus"): "--data"}


def _flags(section: str, values: Mapping[str, Any]) -> str:
    return " ".join(f"{_FLAGS.get((section, k), '--' + k.replace('_', '-'))} {v}" for k, v in values.items())


# TOML section -> (dataclass attribute, {toml key: dataclass field})
_MODEL_KEYS = {
    "layers": "n_layers",
    "d_model": "d_model",
    "heads": "n_heads",
    "seq_len": "seq_len",
    "mlp_ratio": "mlp_ratio",
    "pe": "pe",
    "norm_eps": "norm_eps",
    "rope_base": "rope_base",
    # recurrence knobs fixed for the whole space (model.py); [search] knobs searches them instead
    "injection": "injection",
    "iteration_encoding": "iteration_encoding",
    "iteration_norms": "iteration_norms",
    "init_depth": "init_depth",
    "repeat_scale": "repeat_scale",
    "damping": "damping",
}
_SECTIONS = {
    "model": ("model", _MODEL_KEYS),
    "data": ("data", {f.name: f.name for f in dataclasses.fields(DataConfig)}),
    "train": ("train", {f.name: f.name for f in dataclasses.fields(TrainConfig)}),
    "search": ("search", {f.name: f.name for f in dataclasses.fields(SearchConfig)}),
}


def load_space(path: str | Path | None = None, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> SpaceConfig:
    """Read a TOML preset and apply overrides given as {section: {key: value}} (None values are ignored)."""
    path = Path(path) if path is not None else DEFAULT_SPACE
    if not path.exists() and path.parent == Path(".") and (PRESETS / f"{path.stem}.toml").exists():
        path = PRESETS / f"{path.stem}.toml"  # a preset by name: --space paper-small
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        presets = ", ".join(sorted(p.stem for p in PRESETS.glob("*.toml")))
        raise SpaceError(
            f"search space file {str(path)!r} does not exist; give a TOML file or a preset ({presets})"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpaceError(f"cannot read search space {str(path)!r}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpaceError(f"search space {str(path)!r} is not valid TOML: {e}") from None
    given = {
        section: {k: v for k, v in values.items() if v is not None} for section, values in (overrides or {}).items()
    }
    merged = {section: dict(values) for section, values in raw.items()}
    for section, values in given.items():
        merged.setdefault(section, {}).update(values)
    try:
        return build_space(merged, source=str(path))
    except SpaceError as e:
        if e.section is None or not given.get(e.section):
            raise
        try:  # the file alone is fine: the section's flags are to blame, not the file
            build_space(raw, source=str(path))
        except SpaceError:
            raise e from None
        raise SpaceError(f"{_flags(e.section, given[e.section])}: {e.detail}", e.section, e.detail) from None


def build_space(raw: Mapping[str, Any], source: str = "") -> SpaceConfig:
    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise SpaceError(f"unknown section(s) {sorted(unknown)} in {source or 'space'}; use {sorted(_SECTIONS)}")
    parts: dict[str, Any] = {}
    defaults = SpaceConfig()
    for section, (attr, keys) in _SECTIONS.items():
        values = dict(raw.get(section, {}))
        bad = set(values) - set(keys)
        if bad:
            raise SpaceError(
                f"unknown key(s) {sorted(bad)} in [{section}] of {source or 'space'}; known: {sorted(keys)}"
            )
        kwargs = {keys[k]: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        section_class: type = type(getattr(defaults, attr))
        hints = typing.get_type_hints(section_class)  # config.py writes them as strings
        for key, value in values.items():
            hint = hints[keys[key]]
            if not has_type(kwargs[keys[key]], hint):
                detail = f"{key} must be {type_words(hint)}, got {json.dumps(value, default=str)}"
                raise SpaceError(f"[{section}] of {source or 'space'}: {detail}", section, detail)
        try:
            parts[attr] = dataclasses.replace(getattr(defaults, attr), **kwargs)
        except (TypeError, ValueError) as e:
            raise SpaceError(f"[{section}] of {source or 'space'}: {e}", section, str(e)) from None
    space = SpaceConfig(source=source, **parts)
    validate_space(space)
    return space


_TYPE_WORDS = {
    bool: ("true or false", "true/false values"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
}


def has_type(value: Any, hint: Any) -> bool:
    """Whether `value` (from TOML, lists as tuples) has the field type `hint`: an integer is a number too, but
    true and false are neither; a Literal asks only for its values' type (the value checks, validate_space's and
    the dataclasses', name the values allowed)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return has_type(value, type(args[0]))
    if origin in (typing.Union, types.UnionType):
        return any(has_type(value, a) for a in args)
    if origin is tuple:  # tuple[X, ...]
        return isinstance(value, tuple) and all(has_type(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    if isinstance(value, bool):
        return hint is bool
    return isinstance(value, (int, float) if hint is float else hint)


def type_words(hint: Any) -> str:
    """A field type in words: "an integer", "a list of numbers", "an integer or a string"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return type_words(type(args[0]))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_words(a) for a in args if a is not type(None))
    if origin is tuple:
        return f"a list of {_TYPE_WORDS[args[0]][1]}"
    return _TYPE_WORDS[hint][0]


def parse_target(text: str) -> float:
    """`--target 4x` (or 4): the race's training length as a multiple of the proxy's steps, at least 1."""
    raw = text.strip().lower()
    try:
        factor = float(raw[:-1] if raw.endswith("x") else raw)
    except ValueError:
        raise SpaceError(
            f"--target {text!r} is not a multiple of the proxy's steps; give e.g. 4x (1x: no longer training)"
        ) from None
    if not math.isfinite(factor) or factor < 1:
        raise SpaceError(
            f"--target {text!r} is below 1x: the race trains contenders at the proxy's steps or longer; "
            "give e.g. 4x (1x: no longer training)"
        )
    return factor


def check_sizes(space: SpaceConfig) -> None:
    """Every size at most its SIZE_MAXIMA (the race's length too): checked first, before anything is sized from
    them. The SpaceError names the section, so that load_space names the flag that set it."""
    for (section, key), maximum in SIZE_MAXIMA.items():
        keys = _SECTIONS[section][1]
        value = getattr(getattr(space, section), keys[key])
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > maximum:
            detail = f"{key} must be at most {maximum:,}, got {value}"
            raise SpaceError(f"[{section}] of {space.source or 'space'}: {detail}", section, detail)
    t, s = space.train, space.search
    if (
        isinstance(s.target, (int, float))
        and math.isfinite(s.target)
        and t.steps * s.target > SIZE_MAXIMA["train", "steps"]
    ):
        raise SpaceError(
            f"the race's length (target {s.target:g}x of {t.steps} steps) must be at most "
            f"{SIZE_MAXIMA['train', 'steps']:,} steps; give a smaller --target or --steps"
        )


def check_search_objective(space: SpaceConfig) -> None:
    """A search's objective and its data agree: answer rows (an answer column) are searched by the answer
    objective or scored as task items (choice, exact), and only they are, so that a study's objective always names
    what its scores are of; task items are scored by a frozen search of a pretrained model."""
    d, objective = space.data, space.search.objective
    if d.answer_column and objective not in ("answer", "choice", "exact"):
        raise SpaceError(
            f"--answer-column makes the loss the answer tokens'; search it with --objective answer, or score task "
            f"items with --objective choice or exact (not {objective})"
        )
    if objective in ITEM_OBJECTIVES:
        if space.train.steps != 0 or not space.model.init:
            raise SpaceError(
                f"--objective {objective} scores task items on a pretrained model's weights as they are: add --init "
                "MODEL and --train-steps 0"
            )
        if objective == "lm-eval":
            if not d.task:
                raise SpaceError(
                    "--objective lm-eval:TASK needs the task's name after the colon, e.g. lm-eval:arc_easy"
                )
            return
        if d.corpus == "stdlib" or not d.answer_column:
            raise SpaceError(
                f"--objective {objective} scores task items: give --data FILE (.jsonl, .json, .csv or .parquet, or "
                "hf:NAME of a cached dataset) with --text-column (the prompt) and --answer-column"
            )
        if objective == "choice" and not d.choices_column:
            raise SpaceError(
                "--objective choice needs --choices-column NAME (each item's list of choices; --answer-column holds "
                "the correct one, as its index or its text)"
            )
    if d.choices_column and objective != "choice":
        raise SpaceError(f"--choices-column is read by --objective choice only (not {objective})")


def validate_space(space: SpaceConfig) -> None:
    check_sizes(space)
    t, s = space.train, space.search
    checks = [
        (t.steps >= 0, f"steps must be 0 (frozen, with --init) or positive, got {t.steps}"),
        (t.batch_size >= 1, f"batch size must be at least 1, got {t.batch_size}"),
        (t.grad_accum >= 1, f"grad_accum must be at least 1, got {t.grad_accum}"),
        (t.lr > 0, f"learning rate must be positive, got {t.lr}"),
        (0 <= t.warmup_frac < 1, f"warmup_frac must be in [0, 1), got {t.warmup_frac}"),
        (t.warmup_steps >= 0, f"warmup_steps must be 0 (warmup_frac) or positive, got {t.warmup_steps}"),
        (t.lr_schedule in LR_SCHEDULES, f"unknown lr_schedule {t.lr_schedule!r}; use one of {', '.join(LR_SCHEDULES)}"),
        (t.retrofit in RETROFITS, f"unknown retrofit {t.retrofit!r}; use one of {', '.join(RETROFITS)}"),
        (0 < t.cooldown_frac < 1, f"cooldown_frac must be in (0, 1), got {t.cooldown_frac}"),
        (
            t.lr_schedule != "wsd" or t.warmup_length <= t.cooldown_start,
            f"wsd: the warmup ({t.warmup_length} steps) runs into the cooldown, which starts after step "
            f"{t.cooldown_start} of {t.steps}",
        ),
        (all(0 < f <= 1 for f in t.eval_fractions), f"eval_fractions must lie in (0, 1], got {list(t.eval_fractions)}"),
        (t.eval_windows >= 1, f"eval_windows must be at least 1, got {t.eval_windows}"),
        (t.device in DEVICES, f"unknown device {t.device!r}; use one of {', '.join(DEVICES)}"),
        (t.dtype in DTYPES, f"unknown dtype {t.dtype!r}; use one of {', '.join(DTYPES)}"),
        (s.max_reuse >= 1, f"max_reuse must be at least 1, got {s.max_reuse}"),
        (
            set(s.families) <= set(FAMILIES) and bool(set(s.families) & set(TRIAL_FAMILIES)),
            f"families must include 'ilr' or 'blocks' (or both) and may add 'block', got {list(s.families)}",
        ),
        (
            s.sampler != "grid" or not {"ilr", "blocks"} <= set(s.families),
            "the grid sampler scans per-layer counts (families 'ilr') or every feasible block (families "
            "'blocks'), not both at once",
        ),
        (
            bool(s.damping_choices) and 1.0 in s.damping_choices and all(0 < a <= 1 for a in s.damping_choices),
            f"damping_choices must lie in (0, 1] and include 1 (no damping), got {list(s.damping_choices)}",
        ),
        (s.n_trials >= 1, f"n-trials must be at least 1, got {s.n_trials}"),
        (s.sampler in SAMPLERS, f"unknown sampler {s.sampler!r}; use one of {', '.join(SAMPLERS)}"),
        (s.pruner in PRUNERS, f"unknown pruner {s.pruner!r}; use one of {', '.join(PRUNERS)}"),
        (s.objective in OBJECTIVES, f"unknown objective {s.objective!r}; use one of {', '.join(OBJECTIVES)}"),
        (
            not (s.pruner == "median" and s.objective != "ppl"),
            "--pruner median needs the single-objective study: add --objective ppl (or use --pruner pareto)",
        ),
        (s.prune_eta > 1, f"prune_eta must be above 1, got {s.prune_eta}"),
        (s.prune_calibration_maps >= 3, f"prune_calibration_maps must be at least 3, got {s.prune_calibration_maps}"),
        (-1 <= s.prune_min_spearman <= 1, f"prune_min_spearman must be in [-1, 1], got {s.prune_min_spearman}"),
        (
            isinstance(s.target, (int, float)) and math.isfinite(s.target) and s.target >= 1,
            "target must be at least 1x the proxy's steps (the race trains contenders longer, never shorter), "
            f"got {s.target}",
        ),
        (
            s.race_seeds >= 1,
            f"race-seeds (the seeds each contender is raced on) must be at least 1, got {s.race_seeds}",
        ),
        (
            s.race_contenders >= 1,
            f"race_contenders (maps raced beyond their first result) must be at least 1, got {s.race_contenders}",
        ),
        (
            s.race_policy in RACE_POLICIES,
            f"unknown race_policy {s.race_policy!r}; use one of {', '.join(RACE_POLICIES)}",
        ),
        (
            s.equal_compute in EQUAL_COMPUTE,
            f"unknown equal_compute {s.equal_compute!r}; use one of {', '.join(EQUAL_COMPUTE)}",
        ),
        (
            s.race_screen >= s.race_contenders,
            f"race_screen (maps screened at the target) must be at least race_contenders "
            f"({s.race_contenders}), got {s.race_screen}",
        ),
        (
            s.race_policy != "adaptive"
            or not (math.isfinite(s.target) and races(t.steps, race_target_steps(s.target, t.steps), s.race_seeds))
            or s.max_seeds >= max(3, s.race_seeds),
            f"--max-seeds must be at least 3 and at least --race-seeds ({s.race_seeds}) for the adaptive race "
            f"(one seed screens, the rest test), got {s.max_seeds}",
        ),
        (
            s.look_every >= 0,
            f"look_every (test seeds added a wave, where the race's test looks; 0: automatic) must be 0 or more, "
            f"got {s.look_every}",
        ),
        (
            s.max_race_steps >= 0,
            f"--max-race-steps must be 0 (no cap) or a positive number of steps, got {s.max_race_steps}",
        ),
        (
            s.fuse == "auto" or (isinstance(s.fuse, int) and not isinstance(s.fuse, bool) and s.fuse >= 1),
            f'fuse (maps trained at once in one fused group) must be at least 1 or "auto", got {s.fuse!r}',
        ),
        (
            isinstance(s.enqueue, tuple) and all(isinstance(e, str) for e in s.enqueue),
            f'[search] enqueue must be a list of strings like "3,2,2,1", got {list(s.enqueue)}',
        ),
        (
            not (t.steps == 0 and space.model.init and ("capacity" in s.knobs or space.model.capacity < 1)),
            "capacity routes tokens by routers that a frozen run (--train-steps 0) would leave untrained; train "
            "the maps (--train-steps N) or search without capacity",
        ),
        (0 < space.data.val_fraction < 1, f"val_fraction must be in (0, 1), got {space.data.val_fraction}"),
        (space.data.max_new_tokens >= 1, f"max_new_tokens must be at least 1, got {space.data.max_new_tokens}"),
        (
            s.objective != "answer" or bool(space.data.answer_column),
            "--objective answer needs --answer-column NAME (the answer column of the prompt/answer rows of --data)",
        ),
        (
            not space.data.answer_column or space.data.corpus != "stdlib",
            f"--answer-column {space.data.answer_column!r}: the embedded corpus (stdlib) has no rows; give --data a "
            ".jsonl/.parquet/.csv file or hf:NAME of prompt/answer rows",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise SpaceError(message)
    try:
        check_knobs(s.knobs)
    except ValueError as e:
        raise SpaceError(f"[search] knobs: {e}") from None
    unknown_parts = [p for p in s.parts if p not in MAP_PARTS]
    if unknown_parts or not s.parts or len(set(s.parts)) != len(s.parts):
        raise SpaceError(
            f"[search] parts {list(s.parts)}: give one or more of {', '.join(MAP_PARTS)}, each once (--parts both,attn)"
        )
    if s.time_budget is not None:
        try:
            parse_duration(s.time_budget, "time_budget")
        except UserInputError as e:
            raise SpaceError(f"[search] of {space.source or 'space'}: {e}", "search", str(e)) from None
