"""mergekit passthrough configs of one model, read into a map and written from one.

mergekit's passthrough method (`mergekit-yaml CONFIG OUT`) builds a model by stacking `slices`, each a
`layer_range: [start, end)` of a source model (end excluded), and multiplies every tensor by its `scale` parameter,
resolved per tensor: the source's parameters first, then its slice's, then the config's. A setting is a number,
or conditions `{filter: SUBSTRING, value: X}`, of which the first whose filter is in the tensor's name (or that has
no filter, or "*") wins, or a list of numbers (a gradient over the slice's layers). The embeddings take the first
slice's settings, the final norm and the head the last slice's.

Read here: the slices of one model stack a schedule, which must be a map's (schedule.map_of_schedule: a per-layer
map's or one block's), and a scale on the two tensors that end a layer's residual branches, o_proj and down_proj,
is the branch factor of that pass (model.branch_scales): damping a on every pass after a layer's first, or with
repeat_scale "residual" 1/r on every pass of a layer run r times (times a after its first). No other tensor may be
scaled. Written: the config of a map over one model, maximal runs of consecutive layers of one factor, a damped
run's source scaling o_proj and down_proj; reading it back gives the map and its knobs.

A config is data: read with yaml.safe_load (a tag that would build a Python object is refused), every value
checked; anything else is one MergekitError line.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ilr_search.config import ModelConfig
from ilr_search.errors import UserInputError
from ilr_search.knobs import KnobValue, config_key
from ilr_search.training.schedule import Map, map_of_schedule, parse_keyed_map

CONFIG_SUFFIXES = (".yml", ".yaml")
METHOD = "passthrough"
# The tensors of one layer as mergekit names them for the supported families (llama, mistral, qwen2's biases,
# qwen3's q/k norms), after `model.layers.N.`; the first two end the attention and MLP branches.
BRANCH_OUTPUTS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
BRANCH_NAMES = ("o_proj", "down_proj")
LAYER_TENSORS = (
    *BRANCH_OUTPUTS,
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
)
FIRST_SLICE_TENSORS = ("model.embed_tokens.weight",)
LAST_SLICE_TENSORS = ("model.norm.weight", "lm_head.weight")
DAMPING_ONLY = (
    "ilr-search reads a scale on o_proj and down_proj only, as damping (conditions filter: o_proj and filter: "
    "down_proj with the factor, then value: 1.0)"
)
WRITTEN_REPEAT_SCALES = ("off", "residual")


class MergekitError(UserInputError):
    """A mergekit config that ilr-search cannot read as a map, or a map it cannot write as one."""


@dataclass(frozen=True)
class PassthroughMap:
    """A passthrough config read: the map its slices stack (canonical, as Map.parse gives it), the damping its
    scales carry (1: none), the model its slices take (as the config names it), the schedule, and repeat_scale
    "residual" where every pass of a repeated layer is scaled by 1/r."""

    map: Map
    damping: float
    model: str
    schedule: tuple[int, ...]
    repeat_scale: str = "off"

    @property
    def knobs(self) -> dict[str, KnobValue]:
        """The knob settings the scales give, those not off."""
        knobs: dict[str, KnobValue] = {}
        if self.repeat_scale != "off":
            knobs["repeat_scale"] = self.repeat_scale
        if self.damping != 1.0:
            knobs["damping"] = self.damping
        return knobs

    @property
    def key(self) -> str:
        """The map key with its knobs, as a study stores it: `block:16-27:2|damping=0.5`."""
        return config_key(self.map.text, self.knobs)


def is_config_path(text: str | Path) -> bool:
    """Written as a mergekit config's path (ending .yml or .yaml), not as a map."""
    return str(text).strip().lower().endswith(CONFIG_SUFFIXES)


def candidate_key(candidate: str | Path, n_layers: int) -> str:
    """The map key (with its knobs) of a candidate as a person gives it: a map (`2,1,1,1`, `block:16-27:2`), a map
    with knobs (`block:16-27:2|damping=0.5`), or a mergekit passthrough config (a path ending .yml or .yaml)."""
    text = str(candidate).strip()
    if is_config_path(text):
        return read_passthrough(Path(text), n_layers).key
    return parse_keyed_map(text, n_layers, f"candidate {text!r}").key


def read_passthrough(path: Path, n_layers: int) -> PassthroughMap:
    """The map (and damping) of the passthrough config at `path`, for a model of `n_layers` layers."""
    path = Path(path)
    where = f"mergekit config {str(path)!r}"
    if not path.is_file():
        raise MergekitError(
            f"{where}: no such file; give a mergekit passthrough YAML (merge_method: passthrough, slices of one model)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MergekitError(f"{where}: cannot read it ({type(e).__name__})") from None
    return parse_passthrough(text, n_layers, where)


@dataclass(frozen=True)
class _Slice:
    """One slice as read: its model, layers start..end-1, and its settings in mergekit's order of precedence
    (the source's, the slice's, the config's)."""

    model: str
    start: int
    end: int
    scopes: tuple[Mapping[str, Any] | None, ...]
    where: str


def parse_passthrough(text: str, n_layers: int, where: str = "mergekit config") -> PassthroughMap:
    """read_passthrough of a config's text; `where` names it in the error lines."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MergekitError(f"{where}: not YAML that ilr-search reads: {yaml_problem(e)}") from None
    if not isinstance(doc, dict):
        raise MergekitError(
            f"{where}: not a mergekit config (a YAML mapping with merge_method: passthrough and slices:)"
        )
    method = doc.get("merge_method")
    if method != METHOD:
        said = "has no merge_method" if method is None else f"has merge_method {method!r}"
        raise MergekitError(
            f"{where} {said}: ilr-search reads merge_method passthrough only (slices of one model stacked), "
            "not merges of several models' weights"
        )
    for key in ("models", "modules"):
        if doc.get(key) is not None:
            raise MergekitError(
                f"{where} lists {key}: (whole models merged); ilr-search reads slices: of one model stacked"
            )
    raw_slices = doc.get("slices")
    if not isinstance(raw_slices, list) or not raw_slices:
        raise MergekitError(f"{where} has no slices: (a list of slices, each one source with model and layer_range)")
    top = settings_of(doc.get("parameters"), f"{where}: parameters")
    slices = [read_slice(item, n, top, n_layers, where) for n, item in enumerate(raw_slices, 1)]
    models = list(dict.fromkeys(s.model for s in slices))
    if len(models) > 1:
        raise MergekitError(
            f"{where}: the slices take layers of {len(models)} models ({', '.join(map(repr, models[:3]))}); "
            "ilr-search reads slices of one model"
        )
    model = models[0]
    for key in ("base_model", "tokenizer_source"):
        other = doc.get(key)
        if other is not None and other not in ("base", "union") and other != model:
            raise MergekitError(
                f"{where}: {key} {other!r} is a second model beside the slices' {model!r}; ilr-search reads "
                "slices of one model"
            )
    schedule = [layer for s in slices for layer in range(s.start, s.end)]
    chosen = map_of_schedule(schedule, n_layers)
    if chosen is None:
        stacked = " + ".join(f"{s.start}..{s.end - 1}" for s in slices)
        missing = sorted(set(range(n_layers)) - set(schedule))
        if missing:
            raise MergekitError(
                f"{where}: the slices build the schedule {stacked}, which never runs layer(s) "
                f"{', '.join(map(str, missing[:5]))}{', ...' if len(missing) > 5 else ''} of the model's "
                f"{n_layers}; a map runs every layer at least once"
            )
        raise MergekitError(
            f"{where}: the slices build the schedule {stacked}, which is neither a reuse map (each layer's runs in "
            "a row) nor one block run R times ([0..I-1] + [I..J]*R + [J+1..L-1])"
        )
    pairs = pass_factors(slices)
    chosen = with_read_parts(chosen, [(o != 0.0, d != 0.0) for o, d in pairs], schedule, where)
    if chosen.parts:  # the factors of the branches that run, each at its own pass index (model.branch_passes)
        from ilr_search.training.model import branch_passes

        passes = branch_passes(ModelConfig(n_layers=n_layers, parts=chosen.parts), schedule)
        kept = [
            (f, k)
            for pair, ks in zip(pairs, passes, strict=True)
            for f, k in zip(pair, ks, strict=True)
            if k is not None
        ]
        damping = read_part_damping(kept, where)
        return PassthroughMap(chosen, damping, model, tuple(schedule))
    unequal = next(((p, o, d) for p, (o, d) in enumerate(pairs) if o != d), None)
    if unequal is not None:
        p, o, d = unequal
        raise MergekitError(
            f"{where}: layer {schedule[p]}'s o_proj is scaled by {o:g} and its down_proj by {d:g}; damping scales "
            "both branches of a pass alike (a scale of 0 on one of them makes a one-branch pass)"
        )
    damping, repeat_scale = read_damping([o for o, _ in pairs], schedule, where)
    return PassthroughMap(chosen, damping, model, tuple(schedule), repeat_scale)


def with_read_parts(chosen: Map, running: Sequence[tuple[bool, bool]], schedule: Sequence[int], where: str) -> Map:
    """`chosen` with the parts its one-branch passes (a branch scaled by 0: `running` False) make: each layer's
    passes must be part_passes' of "a" or "m" (one part for a whole block); unchanged where every pass is whole."""
    from ilr_search.training.schedule import part_passes

    if all(a and m for a, m in running):
        return chosen
    by_layer: dict[int, list[tuple[bool, bool]]] = {}
    for layer, on in zip(schedule, running, strict=True):
        by_layer.setdefault(layer, []).append(on)
    parts = []
    for layer in range(len(chosen.counts)):
        seen = by_layer[layer]
        found = [
            p for p in ("", "a", "m") if [(a is not None, m is not None) for a, m in part_passes(p, len(seen))] == seen
        ]
        if not found:
            ran = " ".join("both" if a and m else "attn" if a else "mlp" for a, m in seen)
            raise MergekitError(
                f"{where}: layer {layer}'s passes run {ran}; a one-branch layer repeats its attention with the "
                "MLP in its last pass (Ra) or its MLP after one attention (Rm)"
            )
        parts.append(found[0])
    if chosen.is_block:
        inside = set(parts[chosen.start : chosen.end + 1])
        if len(inside) > 1:
            raise MergekitError(f"{where}: the block's layers repeat different parts; a block map has one part")
        return chosen.with_part(inside.pop())
    return Map.of_counts(chosen.counts, parts)


def read_part_damping(kept: Sequence[tuple[float, int]], where: str) -> float:
    """The damping of a map with one-branch passes: its branches' first passes plain, their later ones one factor."""
    if any(f != 1.0 for f, k in kept if k == 0):
        raise MergekitError(
            f"{where}: a branch's first pass is scaled; with one-branch passes ilr-search reads a scale on the passes "
            "after a branch's first as damping"
        )
    later = sorted({f for f, k in kept if k >= 1})
    if len(later) > 1:
        raise MergekitError(f"{where}: the repeated passes are scaled unequally; damping is one factor")
    return checked_damping(later[0] if later else 1.0, where)


def yaml_problem(error: Exception) -> str:
    """One line of a YAML error: its problem and line, and why a Python tag is refused."""
    problem = str(getattr(error, "problem", None) or type(error).__name__)
    mark = getattr(error, "problem_mark", None)
    line = f" (line {mark.line + 1})" if mark is not None else ""
    why = "; a config is read as data (yaml.safe_load): no tag builds a Python object" if "python/" in problem else ""
    return f"{' '.join(problem.split())}{line}{why}"


def settings_of(value: Any, where: str) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise MergekitError(f"{where} must be a mapping of parameter names to settings, got {value!r}")
    return value


def read_slice(item: Any, n: int, top: Mapping[str, Any] | None, n_layers: int, where: str) -> _Slice:
    at = f"{where}: slice {n}"
    sources = item.get("sources") if isinstance(item, dict) else None
    if not isinstance(sources, list) or not sources:
        raise MergekitError(f"{at} has no sources: (one source: model and layer_range)")
    if len(sources) != 1:
        raise MergekitError(
            f"{at} has {len(sources)} sources: a passthrough slice takes one; ilr-search reads slices of one model"
        )
    source = sources[0]
    model = source.get("model") if isinstance(source, dict) else None
    if not isinstance(model, str) or not model.strip():
        raise MergekitError(f"{at}: its source has no model (a checkpoint's folder or Hugging Face name)")
    if "+" in model:
        raise MergekitError(
            f"{at}: model {model!r} applies the LoRA {model.split('+', 1)[1]!r}; ilr-search reads slices of one "
            "model as it is"
        )
    base = item.get("base_model")
    if base is not None and base != model:
        raise MergekitError(
            f"{at}: base_model {base!r} is a second model beside {model!r}; ilr-search reads slices of one model"
        )
    start, end = layer_range(source.get("layer_range"), at, n_layers)
    scopes = (
        settings_of(source.get("parameters"), f"{at}: the source's parameters"),
        settings_of(item.get("parameters"), f"{at}: parameters"),
        top,
    )
    return _Slice(model, start, end, scopes, at)


def layer_range(value: Any, at: str, n_layers: int) -> tuple[int, int]:
    """A slice's [start, end), checked against the model's layers."""
    if not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise MergekitError(f"{at}: layer_range {value!r} must be [start, end], two whole numbers (end excluded)")
    start, end = value
    if not 0 <= start < end <= n_layers:
        what = "empty" if start == end else "reversed" if start > end else "outside the model"
        raise MergekitError(
            f"{at}: layer_range [{start}, {end}] is {what}; a range is [start, end) with 0 <= start < end <= "
            f"{n_layers}, the model's {n_layers} layers"
        )
    return start, end


def pass_factors(slices: Sequence[_Slice]) -> list[tuple[float, float]]:
    """Each position's scales on o_proj and down_proj (1 where none), where nothing else is scaled."""
    factors: list[tuple[float, float]] = []
    for s in slices:
        for layer in range(s.start, s.end):
            scales = {name: resolve_scale(s, f"model.layers.{layer}.{name}") for name in LAYER_TENSORS}
            scaled = {short_name(name): v for name, v in scales.items() if v != 1.0}
            if scaled and len(scaled) == len(LAYER_TENSORS) and len(set(scaled.values())) == 1:
                raise MergekitError(
                    f"{s.where}: scale {next(iter(scaled.values())):g} on every tensor of layer {layer} (a scale "
                    f"without a filter); {DAMPING_ONLY}"
                )
            others: dict[str, float] = {}  # by projection or norm (a projection's bias with its weight)
            for name, v in scaled.items():
                if name not in map(short_name, BRANCH_OUTPUTS):
                    others.setdefault(name.split(".")[0], v)
            if others:
                said = ", ".join(f"{name} by {v:g}" for name, v in others.items())
                raise MergekitError(f"{s.where}: the scale multiplies {said} of layer {layer}; {DAMPING_ONLY}")
            o_proj, down_proj = (scales[name] for name in BRANCH_OUTPUTS)
            if o_proj == down_proj == 0.0:
                raise MergekitError(
                    f"{s.where}: layer {layer}'s o_proj and down_proj are both scaled by 0: a pass of nothing"
                )
            factors.append((o_proj, down_proj))
    for s, names, which in ((slices[0], FIRST_SLICE_TENSORS, "first"), (slices[-1], LAST_SLICE_TENSORS, "last")):
        for name in names:
            value = resolve_scale(s, name)
            if value != 1.0:
                raise MergekitError(
                    f"{s.where}: the scale multiplies {name} (taken from the {which} slice) by {value:g}; "
                    f"{DAMPING_ONLY}"
                )
    return factors


def short_name(tensor: str) -> str:
    """`self_attn.q_proj.weight` -> `q_proj`, `self_attn.q_proj.bias` -> `q_proj.bias`."""
    name = tensor.split(".", 1)[1] if tensor.startswith(("self_attn.", "mlp.")) else tensor
    return name.removesuffix(".weight")


def resolve_scale(s: _Slice, tensor: str) -> float:
    """The scale mergekit's passthrough multiplies `tensor` of slice `s` by (1 where no setting gives one)."""
    for scope in s.scopes:
        if scope is not None and "scale" in scope:
            value = evaluate_scale(scope["scale"], tensor, s.where)
            if value is not None:
                return value
    return 1.0


def evaluate_scale(setting: Any, tensor: str, at: str) -> float | None:
    """One `scale` setting for one tensor, as mergekit resolves it (None: no condition applies), gradients
    refused."""
    if isinstance(setting, dict):
        setting = [setting]
    if is_number(setting):
        return float(setting)
    if isinstance(setting, list):
        if not setting:
            return None
        if not any(isinstance(e, dict) for e in setting):
            if all(is_number(e) for e in setting):
                raise MergekitError(
                    f"{at}: scale {setting} is a gradient (numbers interpolated over the slice's layers); "
                    "ilr-search reads one scale per pass: conditions filter: o_proj and filter: down_proj, one "
                    "value each"
                )
        for condition in setting:
            if not isinstance(condition, dict) or "value" not in condition:
                raise MergekitError(
                    f"{at}: scale {setting!r} mixes numbers and conditions; give conditions {{filter, value}}"
                )
            name_filter = condition.get("filter")
            if name_filter is not None and not isinstance(name_filter, str):
                raise MergekitError(f"{at}: a scale's filter must be text, got {name_filter!r}")
            if name_filter is None or name_filter == "*" or name_filter in tensor:
                return evaluate_scale(condition["value"], tensor, at)
        return None
    raise MergekitError(f"{at}: scale {setting!r} is not a number, conditions (filter, value) or a gradient of numbers")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_damping(factors: Sequence[float], schedule: Sequence[int], where: str) -> tuple[float, str]:
    """(damping, repeat_scale) of the per-position factors: the passes after a layer's first share one factor a
    (the first passes plain), or every pass of a layer run r > 1 times is 1/r (times a after its first)."""
    from ilr_search.training.model import repeat_indices

    repeats = repeat_indices(schedule)
    runs = Counter(schedule)
    if all(f == 1.0 for f, k in zip(factors, repeats, strict=True) if k == 0):
        later = sorted({f for f, k in zip(factors, repeats, strict=True) if k >= 1})
        if len(later) > 1:
            raise MergekitError(
                f"{where}: the passes after a layer's first are scaled unequally ({', '.join(f'{f:g}' for f in later)}"
                "); damping is one factor for every repeated pass"
            )
        damping = later[0] if later else 1.0
        return checked_damping(damping, where), "off"
    residual = residual_damping(factors, schedule, repeats, runs)
    if residual is not None:
        return checked_damping(residual, where), "residual"
    position = next(p for p, (f, k) in enumerate(zip(factors, repeats, strict=True)) if k == 0 and f != 1.0)
    raise MergekitError(
        f"{where}: the first pass of layer {schedule[position]} is scaled by {factors[position]:g}; ilr-search "
        "reads a scale on the passes after a layer's first as damping (or 1/r on every pass of a layer run r "
        "times: repeat_scale residual)"
    )


def residual_damping(
    factors: Sequence[float], schedule: Sequence[int], repeats: Sequence[int], runs: Mapping[int, int]
) -> float | None:
    """The damping a of factors that are repeat_scale "residual"'s (1/r on every pass of a layer run r > 1 times,
    times a after its first), or None where they are not."""
    later = [f * runs[layer] for f, layer, k in zip(factors, schedule, repeats, strict=True) if k >= 1]
    damping = float(f"{later[0]:.12g}") if later else 1.0
    for f, layer, k in zip(factors, schedule, repeats, strict=True):
        expected = (1.0 / runs[layer]) * (damping if k >= 1 else 1.0) if runs[layer] > 1 else 1.0
        if not math.isclose(f, expected, rel_tol=1e-9):
            return None
    return damping


def checked_damping(damping: float, where: str) -> float:
    if not 0 < damping <= 1:
        raise MergekitError(f"{where}: the repeated passes are scaled by {damping:g}; damping is a factor in (0, 1]")
    return damping


def passthrough_yaml(
    chosen: Map,
    damping: float,
    model_ref: str,
    n_layers: int,
    dtype: str = "float32",
    repeat_scale: str = "off",
) -> str:
    """The passthrough config of `chosen`'s schedule over the one model `model_ref` (a folder or a Hugging Face
    name, as mergekit takes it): maximal runs of consecutive layers of one branch factor, each a slice; a run of
    factor f != 1 (damping on a repeated pass, repeat_scale "residual"'s 1/r) scales o_proj and down_proj by f.
    Undamped, a block is two slices, [0, J+1] and [I, L], as layer-scan writes it. read_passthrough of it gives
    the map and its knobs back."""
    import yaml

    from ilr_search.training.model import branch_scales

    if repeat_scale not in WRITTEN_REPEAT_SCALES:
        raise MergekitError(
            f"repeat_scale {repeat_scale!r} has no place in a passthrough config, which scales tensors: it writes "
            f"repeat_scale {' or '.join(WRITTEN_REPEAT_SCALES)}"
        )
    chosen = chosen.checked(n_layers).canonical()
    try:
        cfg = ModelConfig(n_layers=n_layers, damping=damping, repeat_scale=repeat_scale, parts=chosen.parts)  # type: ignore[arg-type]
    except ValueError as e:
        raise MergekitError(f"cannot write a mergekit config: {e}") from None
    schedule = chosen.schedule()
    factors = [f if isinstance(f, tuple) else (f or 1.0, f or 1.0) for f in branch_scales(cfg, schedule)]
    runs: list[list[Any]] = []  # [start, end, (o_proj's factor, down_proj's)]
    for layer, factor in zip(schedule, factors, strict=True):
        if runs and runs[-1][1] == layer and runs[-1][2] == factor:
            runs[-1][1] = layer + 1
        else:
            runs.append([layer, layer + 1, factor])
    slices = []
    for start, end, factor in runs:
        source: dict[str, Any] = {"model": model_ref, "layer_range": [start, end]}
        if factor != (1.0, 1.0):
            conditions = [
                {"filter": name, "value": f} for name, f in zip(BRANCH_NAMES, factor, strict=True) if f != 1.0
            ]
            source["parameters"] = {"scale": [*conditions, {"value": 1.0}]}
        slices.append({"sources": [source]})
    knobs: dict[str, KnobValue] = {"repeat_scale": repeat_scale, "damping": float(damping)}
    key = config_key(chosen.text, knobs)
    header = (
        f"# written by ilr-search: map {key} of {n_layers} layers, unrolled to {len(schedule)}; "
        "build it with mergekit-yaml THIS_FILE OUT_DIR\n"
    )
    body = yaml.safe_dump(
        {"merge_method": METHOD, "dtype": dtype, "slices": slices}, sort_keys=False, default_flow_style=None
    )
    return header + body
