"""The commands' settings: each field, declared once here with setting(), is an option of the command line
(cli/main.py builds them) and a keyword of the Python API alike (RunOptions, ParetoOptions, BenchBuildOptions,
...). The space they override (ModelConfig, SearchConfig, ...) is config.py's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from ilr_search.config import SearchConfig
from ilr_search.errors import UserInputError


def setting(
    default: Any = None,
    help: str = "",
    *,
    flag: str | None = None,
    key: tuple[str, str] | None = None,
    required: bool = False,
    space_default: str | bool = False,
) -> Any:
    """A field of a command's settings (SpaceOptions, RunOptions, ...) that is also its option: the field's name,
    type and `default` are the option's (`--` + the name with dashes, or `flag`: typer's declaration such as
    "--compile/--no-compile"), `help` its help; `key`: the space's (section, TOML key) the value overrides;
    `required`: the command line must give it (the Python API takes `default`); `space_default`: the setting left
    None takes the space's value, and its help ends "[default: from the space]" (True) or "[default: from the space,
    TEXT]". cli/main.py builds every command's options from these fields."""
    if space_default:
        help += " \\[default: from the space" + (f", {space_default}" if isinstance(space_default, str) else "") + "]"
    return field(default=default, metadata={"help": help, "flag": flag, "key": key, "required": required})


@dataclass(frozen=True)
class AuditSettings:
    """What `ilr-search audit` retrains (its options; commands/audit.check_settings checks them)."""

    factor: float = setting(4.0, "Retrain at this many times the proxy's steps (at least 1).")
    maps: str = setting(
        "auto", "auto (front, baseline, best pruned near the front, random trained maps), front, top:K or all."
    )
    seeds: int = setting(1, "Seeds per map (the study's seed first).")


Overrides = Mapping[str, Mapping[str, Any]]

STORAGE_HELP = (
    "Optuna storage URL (sqlite, postgresql, mysql) or journal:PATH. \\[default: sqlite:///studies/ilr-search.db]"
)
STUDY_NAME_HELP = "Study name; the same name resumes. \\[default: derived from the configuration]"
INIT_HELP = (
    "Start from a pretrained checkpoint: a folder as transformers' save_pretrained writes it (config.json, "
    "safetensors, tokenizer.json), a GGUF file (or a folder holding one; converted once, dequantized to "
    "float32) or hf:NAME. The model takes its architecture and weights, the data its "
    "tokenizer; the shape flags and --tokenizer go without it."
)


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """The space a command reads and the flags over its model: `flops`' options (what its FLOPs depend on). A flag
    left None takes the space's value; `space_keys` sets any other key of the space ({section: {key: value}}, under
    the flags)."""

    space: str | Path | None = setting(
        help=(
            "Search-space TOML, or a preset by name (default, paper-small, paper-large, bench-small, "
            "bench-crossing). \\[default: default]"
        )
    )
    layers: int | None = setting(help="Number of distinct layers L.", key=("model", "layers"), space_default=True)
    d_model: int | None = setting(help="Model width.", key=("model", "d_model"))
    heads: int | None = setting(help="Attention heads.", key=("model", "heads"))
    seq_len: int | None = setting(help="Context length of the proxy.", key=("model", "seq_len"))
    mlp_ratio: float | None = setting(help="SwiGLU width as a multiple of d_model.", key=("model", "mlp_ratio"))
    pe: str | None = setting(help="Positional encoding: nope|rope|learned|alibi.", key=("model", "pe"))
    tokenizer: str | None = setting(
        help="byte, bpe:N, hf:NAME or file:PATH (a tokenizer.json); sets the model's vocabulary.",
        key=("data", "tokenizer"),
    )
    space_keys: Overrides = dataclasses.field(default_factory=dict)

    def given(self) -> tuple[str, ...]:
        """The names of the space's flags given, in declaration order (check_init_flags reads them)."""
        return tuple(f.name for f in _space_flags(self) if getattr(self, f.name) is not None)

    def overrides(self) -> dict[str, dict[str, Any]]:
        """What the space is read with (load_space): `space_keys`, and over them the flags given."""
        merged = {section: dict(values) for section, values in self.space_keys.items()}
        for f in _space_flags(self):
            section, key = f.metadata["key"]
            if getattr(self, f.name) is not None:
                merged.setdefault(section, {})[key] = getattr(self, f.name)
        return merged


def _space_flags(options: ModelOptions) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(options) if f.metadata.get("key")]


@dataclass(frozen=True, kw_only=True)
class SpaceOptions(ModelOptions):
    """`train`'s and `run`'s space flags: the model's (ModelOptions), the data's and the training's."""

    data: str | None = setting(
        help="stdlib (embedded), a local file/folder, or hf:NAME[:CONFIG].", key=("data", "corpus")
    )
    text_column: str | None = setting(
        help="Text column of .jsonl/.parquet/.csv data (with --answer-column: the prompt column).",
        key=("data", "text_column"),
    )
    answer_column: str | None = setting(
        help=(
            "Answer column of prompt/answer rows: the loss and validation metrics are on the answer tokens only. "
            "\\[default: none, the whole text]"
        ),
        key=("data", "answer_column"),
    )
    choices_column: str | None = setting(
        help=(
            "--objective choice: the column of each item's choices (a list; in CSV a JSON list), the correct one "
            "in --answer-column as its index or its text."
        ),
        key=("data", "choices_column"),
    )
    tasks_path: str | None = setting(
        help="--objective lm-eval:TASK: a folder of local lm-eval task YAMLs (their data_files local).",
        key=("data", "tasks_path"),
    )
    steps: int | None = setting(help="Proxy training steps.", key=("train", "steps"))
    batch_size: int | None = setting(help="Sequences per step.", key=("train", "batch_size"))
    lr: float | None = setting(help="Peak learning rate.", key=("train", "lr"))
    seed: int | None = setting(help="Seed of data order and initialisation.", key=("train", "seed"))
    device: str | None = setting(help="auto|cpu|cuda|mps.", key=("train", "device"))
    dtype: str | None = setting(
        help=(
            "auto|fp32|bf16: training in bf16 autocasts; a frozen evaluation stores its weights in bf16 (auto: "
            "where the device computes bf16 natively)."
        ),
        key=("train", "dtype"),
    )
    compile: bool | None = setting(
        help="Compile each decoder layer. \\[default: auto]", flag="--compile/--no-compile", key=("train", "compile")
    )


REUSE_MAP_HELP = (
    "One positive count per layer, e.g. 4,2,1,1, or a block map block:I-J:R (layers I..J, from 0, run R times "
    "as a block)."
)
KNOB_SETTINGS_HELP = (
    "Recurrence knobs on: injection[=add|gated], iteration_encoding, iteration_norms, depth_init (init for the "
    "schedule's depth), repeat_scale[=residual|lr], damping=A, adapters=RANK, capacity=C (the fraction of "
    "tokens each repeated pass runs, in (0, 1]); comma-separated."
)


@dataclass(frozen=True, kw_only=True)
class MapOptions:
    """The map a command runs (`flops`, `train`): a reuse map or block map, or block recurrence, with knob settings,
    on the space's model or a checkpoint's (`init`)."""

    reuse_map: str | None = setting(help=REUSE_MAP_HELP)
    block: int | None = setting(help="Block recurrence: the whole stack run K times.")
    knobs: str | None = setting(help=KNOB_SETTINGS_HELP)
    init: str | None = setting(help=INIT_HELP)


@dataclass(frozen=True, kw_only=True)
class FlopsOptions(MapOptions, ModelOptions):
    """`ilr-search flops`'s settings: the map and the space's model."""


INIT_REFUSES = ("layers", "d_model", "heads", "mlp_ratio", "pe", "tokenizer")  # what --init's checkpoint sets
FROM_STUDY_FLAGS = ("steps", "seed", "device", "dtype", "compile")  # what --from-study lets a flag change


def check_init_flags(given: tuple[str, ...], init: str | None) -> None:
    """--init takes the checkpoint's architecture and tokenizer: the options that set them (of the space options
    `given`) are refused beside it."""
    refused = [name for name in INIT_REFUSES if init is not None and name in given]
    if refused:
        raise UserInputError(f"--init takes the checkpoint's architecture and tokenizer; drop --{_flag(refused[0])}")


def _flag(option: str) -> str:
    return option.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class TrainOptions(MapOptions, SpaceOptions):
    """`ilr-search train`'s settings: the map (MapOptions; with `from_study`, `map_text` as the study names it) on
    the space's flags (SpaceOptions), where the model starts (`init`) and where it is saved."""

    from_study: str | None = setting(
        help=(
            "Train with this study's stored model, data and training settings (--steps, --seed, --device, --dtype "
            "and --compile may change them)."
        ),
        flag="--from-study",
    )
    storage: str | None = setting(help="Storage of --from-study. \\[default: sqlite:///studies/ilr-search.db]")
    map_text: str | None = setting(
        help=(
            "With --from-study: the map, as the study names it (2,1,1,1, 2,1,1,1|injection=add, block:1-2:2 or "
            "block2). \\[default: the front's map of lowest perplexity]"
        ),
        flag="--map",
    )
    save: Path | None = setting(help="Write the trained model to this folder, in --format.")
    save_format: str = setting(
        "native",
        (
            "With --save: native (model.safetensors, config.json and the tokenizer; ILRTransformer.load "
            "reads them, export-model --model re-exports them) or hf (a standard transformers checkpoint of "
            "the imported family, else llama, its schedule unrolled, with the tokenizer)."
        ),
        flag="--format",
    )

    def check(self) -> None:
        """The options that do not go together are refused: --from-study takes the study's settings (only
        FROM_STUDY_FLAGS may change them), --init the checkpoint's."""
        if self.from_study is not None and self.init is not None:
            raise UserInputError("--init and --from-study both set the model; give one")
        if self.save is None and self.save_format != "native":
            raise UserInputError("--format goes with --save DIR")
        if self.from_study is None:
            if self.map_text is not None or self.storage is not None:
                raise UserInputError(
                    "--map and --storage go with --from-study; without it give --reuse-map (and --knobs)"
                )
            check_init_flags(self.given(), self.init)
            return
        given = [name for name in self.given() if name not in FROM_STUDY_FLAGS]
        if self.reuse_map is not None or self.block is not None or self.knobs is not None:
            given.insert(0, "reuse_map/block/knobs (use --map)")
        if given:
            raise UserInputError(
                f"--from-study takes the study's settings; drop --{_flag(given[0])} (only --map, "
                f"{', '.join('--' + f for f in FROM_STUDY_FLAGS)}, --save and --format may be given with it)"
            )


@dataclass(frozen=True, kw_only=True)
class RunOptions(SpaceOptions):
    """`ilr-search run`'s settings, the command line's and the Python API's (run_request makes the study's request of
    them): the space's flags (SpaceOptions) and the run's. A setting left None takes the space's (and on resume the
    study's)."""

    budget: str = setting(
        "1.5x",
        "Forward compute per token: 1.5x or 150% of the plain model's, or FLOPs like 4.2e6.",
        required=True,
    )
    study: str | None = setting(help=STUDY_NAME_HELP)
    storage: str | None = setting(help=STORAGE_HELP)
    n_trials: int | None = setting(help="Finished trials the study should reach in total.", space_default=True)
    timeout: float | None = setting(help="Stop starting new trials after this many seconds.")
    time_budget: str | None = setting(
        help=(
            "A wall-clock budget for this invocation of the whole study (trials, reference runs, race): 15m, "
            "90s, 1h, 1.5h or seconds. No new run starts once it is spent (runs in flight finish); the run ends "
            "undecided with exit 0 and the same command continues. Never stored with the study. \\[default: "
            "the space's time_budget, else none]"
        )
    )
    sampler: str | None = setting(help=f"auto|tpe|nsga2|gp|random|grid. \\[default: {SearchConfig.sampler}]")
    pruner: str | None = setting(
        help=(
            "pareto (calibrated: prunes only at rungs that predict the final ranking) | pareto-eager (the "
            f"uncalibrated rule) | median | none. \\[default: {SearchConfig.pruner}]"
        )
    )
    objective: str | None = setting(
        help=(
            "pareto (perplexity and FLOPs), ppl (budget as a constraint only), answer (the answer tokens' "
            "perplexity and FLOPs; needs --answer-column), or task items scored frozen (--init, --train-steps 0), "
            "each right or wrong: choice (the correct choice's summed log-likelihood the highest, lm-eval's acc; "
            "--choices-column), exact (greedy decoding to a newline matches the answer after normalising case and "
            "spaces), lm-eval:TASK (an lm-evaluation-harness task's 0/1 metric per document; extra .[eval])."
        )
    )
    workers: int | None = setting(
        help=(
            "Worker processes on this machine, sharing the study and the device (its trials, reference runs and "
            "race); on a CPU one thread each."
        ),
        space_default="one a CPU core in default.toml, else 1, or as --fuse auto chooses",
    )
    fuse: str | None = setting(
        help=(
            "Maps trained at once in one fused group (K proxies in lockstep in one process); 1: one at a time; "
            "auto: K (and on a CPU, workers against threads) from memory and a short probe. A resume reuses the "
            "study's stored layout unless --fuse or --workers is given."
        ),
        space_default=f"{SearchConfig.fuse} in default.toml",
    )
    knobs: str | None = setting(
        help=(
            "Recurrence knobs searched with the map, comma-separated: injection, iteration_encoding, "
            "iteration_norms, depth_init, repeat_scale, damping, adapters, capacity."
        ),
        space_default="none in the presets",
    )
    parts: str | None = setting(
        help=(
            "Which part of a repeated layer or block the search proposes, comma-separated: both (the whole layer, "
            "R), attn (its attention repeated, Ra), mlp (its MLP repeated, Rm)."
        ),
        space_default=f"{','.join(SearchConfig.parts)} in default.toml",
    )
    target: str | None = setting(
        help=(
            "The length the verdict is about, a multiple of the proxy's steps: contenders are screened and raced "
            "there (1x: seeds only)."
        ),
        space_default=f"{SearchConfig.target:g}x",
    )
    race_seeds: int | None = setting(
        help=(
            "Seeds each contender has at the target at its first test (adaptive race: the first screens, the rest "
            "test; fixed race: seeds at every length). --target 1x --race-seeds 1: no race."
        ),
        space_default=str(SearchConfig.race_seeds),
    )
    max_seeds: int | None = setting(
        help=(
            "Adaptive race: the most seeds a contender gets at the target; seeds are added while its comparison "
            "with the baseline is open."
        ),
        space_default=str(SearchConfig.max_seeds),
    )
    max_race_steps: int | None = setting(
        help=("A cap on the steps the race trains (0: none); a resume with a larger cap goes on."),
        space_default=str(SearchConfig.max_race_steps),
    )
    race_policy: str | None = setting(
        help=(
            "adaptive (judged at the target, seeds until decided) or fixed (race-seeds at doubled lengths, as "
            "studies made before it)."
        ),
        space_default=SearchConfig.race_policy,
    )
    equal_compute: str | None = setting(
        help=(
            "depth: also race a plain model as deep as the best contender runs (the same compute, more "
            "parameters); off."
        ),
        space_default=SearchConfig.equal_compute,
    )
    enqueue: str | None = setting(
        help=(
            'Your maps, trained first after the baseline, in order, space-separated: "3,2,2,1 4,2,1,1", with knobs '
            "as --knobs of train takes them (2,1,1,1|injection=add), block maps block:I-J:R (where the study "
            "searches blocks), blockK (trained as a reference run; a trial where blocks are searched), or a "
            "mergekit passthrough config FILE.yml of the checkpoint (the map its slices stack, a scale on "
            "o_proj/down_proj read as damping). Over-budget maps are repaired to the budget. \\[default: the "
            "space's enqueue list]"
        )
    )
    init: str | None = setting(help=INIT_HELP)
    train_steps: int | None = setting(
        help=(
            "Steps each map trains (--steps under the name a pretrained model's search uses): with --init, 0 "
            "evaluates each map on the checkpoint's weights as they are (frozen, the race pairs maps by held-out "
            "window chunk), N continues training them (retrofit)."
        ),
        space_default=True,
    )
    learn: bool = setting(
        False,
        (
            "Also learn a map: one model trained at the widest schedule (every layer max_reuse times) with a gate "
            "on each extra pass, held within the budget; the passes whose gate ends >= 0.5 are the map, trained "
            "and raced as a trial. With --n-trials 0: the learned map and the plain model alone. Frozen (--init "
            "--train-steps 0): only the gates learn, on the select windows."
        ),
        flag="--learn",
    )
    # how this invocation reports, not what the study is
    track: str | None = setting(
        help=(
            "Log each trial (validation curve, map, knobs, final values) and the reference runs: tensorboard:DIR "
            "or mlflow:URI (needs mlflow)."
        )
    )
    dry_run: bool = setting(
        False,
        (
            "Print the plan (study, trials, references, pruning rungs, storage, space) and a time estimate from a "
            "short timed probe; write nothing."
        ),
        flag="--dry-run",
    )

    @property
    def asked_race(self) -> dict[str, str | int]:
        """The race settings given ({field: value}), which a resumed study must not contradict."""
        asked = {"race_policy": self.race_policy, "max_seeds": self.max_seeds, "equal_compute": self.equal_compute}
        return {k: v for k, v in asked.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class JudgeOptions(SpaceOptions):
    """`ilr-search judge`'s settings: the model, the candidates as given, the run's flags (None: not given) and the
    space's data and evaluation flags (SpaceOptions; JUDGE_SPACE_OPTIONS names those the command line offers)."""

    init: str = setting(
        dataclasses.MISSING,
        (
            "The model judged: a folder as save_pretrained writes it, a GGUF file (or a folder holding one) or "
            "hf:NAME; evaluated frozen, as it is."
        ),
    )
    candidates: tuple[str, ...] = setting(
        dataclasses.MISSING,
        (
            "A candidate, repeatable: a reuse map (2,1,1,1), a block map (block:16-27:2), either with "
            "|damping=A, or a mergekit passthrough YAML that stacks slices of the one model (a scale on "
            "o_proj/down_proj read as damping)."
        ),
        flag="--candidate",
    )
    objective: str | None = setting(
        help=(
            "What is judged: pareto (held-out text's loss, the default), answer (--answer-column), choice, exact "
            "or lm-eval:TASK (task items, each right or wrong). As run --objective."
        )
    )
    budget: str | None = setting(
        help="A FLOPs budget the candidates must fit (1.5x), else refused. \\[default: the costliest candidate's]"
    )
    chunks: int | None = setting(
        help=(
            "Chunks evaluated at most: chunk 0 orders the candidates, the rest test them, until each comparison "
            "is decided. \\[default: 16, or as many as the data holds]"
        )
    )
    chunk_size: int | None = setting(
        help=(
            "Windows or items a chunk. \\[default: the space's eval_windows, fewer where the items would "
            "otherwise make fewer than --chunks chunks]"
        )
    )
    study: str | None = setting(help=STUDY_NAME_HELP)
    storage: str | None = setting(help=STORAGE_HELP)


# judge's space options, in its own words: what it evaluates and how (no shape flag: the checkpoint sets the model;
# no training flag)
JUDGE_SPACE_OPTIONS = {
    "space": "Search-space TOML or preset whose \\[data] and \\[train] settings the judge reads.",
    "seq_len": "Tokens a held-out window (and an item at most) holds.",
    "batch_size": "Windows or items evaluated at once.",
    "seed": "The first chunk evaluated (chunk 0 orders the candidates). \\[default: 0]",
    "device": "auto|cpu|cuda|mps.",
    "dtype": "auto|fp32|bf16: the weights' dtype (auto: bf16 where the device computes it natively).",
    "data": "",
    "text_column": "",
    "answer_column": "",
    "choices_column": "",
    "tasks_path": "",
}


# ----------------------------------------------------------------------------------------------------
# The settings of the commands that read a stored study, and of the benchmarks' commands.


@dataclass(frozen=True, kw_only=True)
class StudyChoice:
    """The stored study a command reads (`trials`, `pareto`, `export`, `recipe`, `audit`): its name (None: the
    storage's only study, else its most recently active) in its storage (None: the default database)."""

    study: str | None = setting(help="Study name. \\[default: the storage's only study, else its most recently active]")
    storage: str | None = setting(help=STORAGE_HELP)


@dataclass(frozen=True, kw_only=True)
class AuditOptions(StudyChoice, AuditSettings):
    """`ilr-search audit`'s settings: what it retrains (AuditSettings), of which study, and how many runs at once."""

    fuse: str = setting(
        "1", "Runs of one model trained at once in one fused group (the same results); 1: one at a time."
    )


ParetoView = Literal["front", "layers", "blocks"]
PARETO_VIEWS: tuple[ParetoView, ...] = get_args(ParetoView)


@dataclass(frozen=True, kw_only=True)
class ParetoOptions(StudyChoice):
    """`ilr-search pareto`'s settings: the study, the file it writes, and its view."""

    out: Path | None = setting(help="Write .html (interactive, offline), .png/.svg (kaleido), .csv or .json.")
    view: ParetoView = setting(
        "front",
        (
            "front; layers: which layers the front's maps recur and their importance; or blocks: a block "
            "search's (start, end) grid of loss differences to the plain model, one grid per repeat count."
        ),
    )

    def __post_init__(self) -> None:
        if self.view not in PARETO_VIEWS:
            raise UserInputError(f"unknown --view {self.view!r}; use front, layers or blocks")


@dataclass(frozen=True, kw_only=True)
class ExportOptions(StudyChoice):
    """`ilr-search export`'s settings: the study and the tables it writes."""

    out: Path = setting(dataclasses.MISSING, "trials.csv or trials.parquet")
    curves: Path | None = setting(
        help=(
            "Also write the learning curves as a long table (trial, reference, map, kind val|train, step, tokens, "
            "loss; a race run's seed, run_steps): curves.csv or curves.parquet."
        )
    )


@dataclass(frozen=True, kw_only=True)
class RecipeOptions(StudyChoice):
    """`ilr-search recipe`'s settings: the study, the map, and where the recipe goes."""

    map_text: str | None = setting(
        help=(
            "A map the study trained (2,1,1,1, 2,1,1,1|injection=add, block:1-2:2 or block2). \\[default: the "
            "front's map of lowest perplexity]"
        ),
        flag="--map",
    )
    out: Path | None = setting(help="Write the recipe to FILE.toml or FILE.json. \\[default: TOML on stdout]")


@dataclass(frozen=True, kw_only=True)
class ExportModelOptions:
    """`ilr-search export-model`'s settings: where the checkpoint goes, the model (a frozen study's or a saved
    one), its map, family and format."""

    out: Path = setting(
        dataclasses.MISSING,
        (
            "A new or empty folder for the checkpoint (config.json, model.safetensors, tokenizer files); with "
            "--format mergekit a new FILE.yml."
        ),
    )
    study: str | None = setting(
        help=(
            "A frozen study of a pretrained model (run --init ... --train-steps 0): its checkpoint's weights under "
            "--map."
        )
    )
    storage: str | None = setting(help="Storage of --study. \\[default: sqlite:///studies/ilr-search.db]")
    model: Path | None = setting(help="Instead of --study: a folder train --save wrote (native), exported under --map.")
    map_text: str | None = setting(
        help=(
            "The map the checkpoint unrolls: 2,2,1,1, block:1-2:2 or block2 (with --study also damping, e.g. "
            "block:1-2:2|damping=0.5); 1,1,1,1 writes each distinct layer once. \\[default: the study's decided "
            "best map, as recipe chooses it; for --model the map it was trained with]"
        ),
        flag="--map",
    )
    family: str | None = setting(
        help="llama, mistral, qwen2 or qwen3. \\[default: the imported checkpoint's family, else llama]"
    )
    export_format: str = setting(
        "hf",
        (
            "hf (a standard transformers checkpoint) or mergekit (with --study: the passthrough config that "
            "builds it from the study's checkpoint with mergekit-yaml, damping as o_proj/down_proj scales)."
        ),
        flag="--format",
    )


@dataclass(frozen=True, kw_only=True)
class BenchBuildOptions:
    """`ilr-search bench build`'s settings: the space whose feasible maps are trained, the table, and the study."""

    space: Path = setting(dataclasses.MISSING, "A small search space, e.g. search_spaces/bench-small.toml.")
    out: Path = setting(dataclasses.MISSING, "The table: bench.parquet (or .csv).")
    budget: str = setting("2x", "FLOP budget the maps must fit.")
    storage: str | None = setting(help=STORAGE_HELP)
    study: str | None = setting(help=STUDY_NAME_HELP)
    steps: int | None = setting(help="Proxy steps (a longer table of the same space). \\[default: the space's]")
    sample: int | None = setting(
        help="Train only this many maps (a seeded sample; the baseline always). \\[default: every feasible map]"
    )
    seed: int = setting(0, "Seed of the sample.")


@dataclass(frozen=True, kw_only=True)
class BenchReplayOptions:
    """`ilr-search bench replay`'s settings: a pruning rule over a table."""

    table: Path = setting(
        dataclasses.MISSING,
        "A table in the bench format (bench build writes one; partial tables and blockK rows are fine).",
    )
    pruner: str = setting(
        "pareto", "pareto (calibrated, the default) or pareto-eager (the uncalibrated rule), or none."
    )
    seed: int | None = setting(help="Shuffle the row order with this seed. \\[default: table order]")
