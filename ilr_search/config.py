"""Every configuration of the project, in one place, with one set of defaults: those of the default search
(search_spaces/default.toml, a laptop CPU; tests/test_config.py checks that the two agree).

- ModelConfig: the decoder and its recurrence knobs (model.py says what each knob does);
- DataConfig, TrainConfig, SearchConfig, and SpaceConfig holding the four: a search space (space.py reads
  them from TOML presets and flags);
- PrunerSettings: how a study prunes, stored with it.
The commands' settings, which override these (RunOptions, ...), are options.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

PositionalEncoding = Literal["nope", "rope", "learned", "alibi"]
POSITIONAL_ENCODINGS: tuple[PositionalEncoding, ...] = get_args(PositionalEncoding)
Injection = Literal["none", "add", "gated"]
INJECTIONS: tuple[Injection, ...] = get_args(Injection)
RepeatScale = Literal["off", "residual", "lr"]
REPEAT_SCALES: tuple[RepeatScale, ...] = get_args(RepeatScale)
Retrofit = Literal["adapters", "all"]
RETROFITS: tuple[Retrofit, ...] = get_args(Retrofit)
# a layer's part in a map (training/schedule.py): "" the whole layer, "a" attention repeated, "m" MLP repeated
LAYER_PARTS = ("", "a", "m")
# the parts a search proposes ([search] parts, --parts), each a layer part: both "", attn "a", mlp "m"
MAP_PARTS = {"both": "", "attn": "a", "mlp": "m"}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    n_layers: int = 8
    d_model: int = 32
    n_heads: int = 4
    seq_len: int = 64
    mlp_ratio: float = 4.0
    pe: PositionalEncoding = "rope"
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    injection: Injection = "none"  # re-add the embedding output at each repeat after the first: none, add, gated
    iteration_encoding: bool = False  # add a learned embedding of the repeat index
    iteration_norms: bool = False  # RMSNorm gains of their own for each repeat
    init_depth: int = 0  # residual-projection init for this many layer runs; 0: n_layers
    max_reuse: int = 1  # repeats of one layer that the knobs' tables cover
    # a layer that runs r times: off, each pass's residual branches scaled by 1/r, or its parameters' lr by 1/r
    repeat_scale: RepeatScale = "off"
    # every pass of a repeated layer or block after its first adds its attention and MLP branches times `damping`
    # (1: the plain repeat); the first pass is the plain layer
    damping: float = 1.0
    # Which branch a layer's repeated passes run, per layer (training/schedule.py's map grammar): "" the whole
    # layer, "a" its attention in every pass and its MLP in the last only (`3a`), "m" its attention in the first pass
    # only and its MLP in every pass (`3m`); () every layer whole. A layer run once is whole whatever its entry.
    parts: tuple[str, ...] = ()
    # each pass k >= 1 of a repeated branch adds its own low-rank delta B_k A_k (rank adapter_rank, B starting at 0)
    # to each of the branch's matrices; 0: none
    adapter_rank: int = 0
    # Mixture-of-Recursions-style per-token depth (model.py's docstring): a fraction C in (0, 1] of each sequence's
    # tokens, chosen by a router per layer and pass, takes each pass k >= 1 of a repeated layer; 1: every token
    capacity: float = 1.0
    # Architecture options of pretrained checkpoints (training/pretrained.py reads them from config.json); each
    # off by default, the project's own model.
    n_kv_heads: int = 0  # key/value heads (grouped-query attention); 0: n_heads
    head_dim: int = 0  # size of each head; 0: d_model // n_heads (head_size is the resolved value)
    tie_embeddings: bool = True  # False: an LM head of its own (vocab x d_model) instead of the embedding
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2), none on the output projection
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Qwen3)
    init: str = ""  # the checkpoint the weights start from (a folder or hf:NAME); "": random init

    def __post_init__(self) -> None:
        if self.injection not in INJECTIONS:
            raise ValueError(f"unknown injection {self.injection!r}; use one of {', '.join(INJECTIONS)}")
        if self.repeat_scale not in REPEAT_SCALES:
            raise ValueError(f"unknown repeat_scale {self.repeat_scale!r}; use one of {', '.join(REPEAT_SCALES)}")
        if not 0 < self.damping <= 1:
            raise ValueError(f"damping must be in (0, 1], got {self.damping}")
        object.__setattr__(self, "parts", tuple(self.parts))  # a list from JSON: hashable, as the groups key on it
        if any(p not in LAYER_PARTS for p in self.parts) or len(self.parts) not in (0, self.n_layers):
            raise ValueError(f"parts must be {self.n_layers} entries of {LAYER_PARTS}, got {self.parts}")
        if self.adapter_rank < 0 or self.adapter_rank > self.d_model:
            raise ValueError(f"adapter_rank must be in 0..d_model ({self.d_model}), got {self.adapter_rank}")
        if not 0 < self.capacity <= 1:
            raise ValueError(f"capacity must be in (0, 1], got {self.capacity}")
        if self.capacity < 1 and self.pe == "alibi":
            raise ValueError(
                "capacity below 1 runs a routed pass on a sub-sequence of tokens, whose ALiBi distances this model "
                "does not gather; use rope, nope or learned positions"
            )
        if self.init_depth < 0:
            raise ValueError(f"init_depth must be 0 (n_layers) or positive, got {self.init_depth}")
        if self.pe not in POSITIONAL_ENCODINGS:
            raise ValueError(f"unknown positional encoding {self.pe!r}; use one of {', '.join(POSITIONAL_ENCODINGS)}")
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "seq_len", "max_reuse"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("n_kv_heads", "head_dim"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 (the default) or positive, got {getattr(self, name)}")
        if not self.head_dim and self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"heads {self.n_heads} is not divisible by key/value heads {self.kv_heads}")
        if self.pe == "rope" and self.head_size % 2:
            raise ValueError(f"rope needs an even head size, got {self.head_size}")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be positive, got {self.mlp_ratio}")

    @property
    def head_size(self) -> int:
        """The size of each attention head: head_dim where set, else d_model // n_heads."""
        return self.head_dim or self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        """The key/value heads: n_kv_heads where set, else n_heads (one per query head)."""
        return self.n_kv_heads or self.n_heads

    @property
    def mlp_hidden(self) -> int:
        return int(round(self.mlp_ratio * self.d_model))

    @property
    def adapter_shapes(self) -> dict[str, tuple[int, int]]:
        """Each matrix a pass's adapter adapts (model.ADAPTED order) with its (in, out) features: its adapter's A is
        (adapter_rank, in), its B (out, adapter_rank)."""
        d, f = self.d_model, self.mlp_hidden
        q, kv = self.n_heads * self.head_size, self.kv_heads * self.head_size
        return {"qkv": (d, q + 2 * kv), "proj": (q, d), "gate_up": (d, 2 * f), "down": (f, d)}

    @property
    def adapter_params_per_pass(self) -> int:
        """The parameters of one pass's adapters on a whole layer (every adapted matrix's A and B)."""
        return sum(self.adapter_rank * (n_in + n_out) for n_in, n_out in self.adapter_shapes.values())

    @property
    def router_params(self) -> int:
        """The routers' parameters (capacity below 1): a d_model vector per layer and pass k >= 1."""
        return self.n_layers * (self.max_reuse - 1) * self.d_model if self.capacity < 1 else 0


# The knob fields at their "off" values (today's model); max_reuse only sizes the knobs' tables.
KNOB_FIELD_DEFAULTS = {
    "injection": "none",
    "iteration_encoding": False,
    "iteration_norms": False,
    "init_depth": 0,
    "max_reuse": 1,
    "repeat_scale": "off",
    "damping": 1.0,
    "parts": [],  # as to_dict writes it (a list)
    "adapter_rank": 0,
    "capacity": 1.0,
}

# The pretrained-architecture fields at their defaults (the project's own model, random init): stored with a study
# only where they differ, so that a study made before they existed keeps its configuration and its name.
ARCHITECTURE_FIELD_DEFAULTS = {
    "n_kv_heads": 0,
    "head_dim": 0,
    "tie_embeddings": True,
    "qkv_bias": False,
    "qk_norm": False,
    "init": "",
}


Sampler = Literal["auto", "tpe", "nsga2", "gp", "random", "grid"]  # auto: resolved to one of the others
SAMPLERS: tuple[Sampler, ...] = get_args(Sampler)
PrunerName = Literal["pareto", "pareto-eager", "median", "none"]
PRUNERS: tuple[PrunerName, ...] = get_args(PrunerName)
# pareto: validation perplexity against FLOPs; ppl: perplexity alone (the budget only a constraint); answer: the
# perplexity of the answer tokens of prompt/answer rows (DataConfig.answer_column) against FLOPs. Task items, scored
# one at a time by a frozen study (data/items.py), against FLOPs: choice (the correct choice's log-likelihood the
# highest), exact (greedy decoding matches the answer), lm-eval (an lm-evaluation-harness task's 0/1 metric per
# document, DataConfig.task; `--objective lm-eval:TASK`).
Objective = Literal["pareto", "ppl", "answer", "choice", "exact", "lm-eval"]
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
ITEM_OBJECTIVES: tuple[Objective, ...] = ("choice", "exact", "lm-eval")  # scored per item, 0 or 1, frozen only


def scored_by_item(objective: str, train_steps: int) -> bool:
    """Whether a study's runs are scored one task item at a time: the item objectives, and `answer` in a frozen
    study (each row's answer-token loss after its prompt; a trained study scores answer rows as held-out text)."""
    return objective in ITEM_OBJECTIVES or (objective == "answer" and train_steps == 0)


# The map families of a study: ilr (per-layer reuse counts, the sampler's), block (block recurrence blockK, the whole
# stack run K times, trained as reference runs) and blocks (one contiguous block run R times, block:I-J:R, the
# sampler's; off by default).
Family = Literal["ilr", "block", "blocks"]
FAMILIES: tuple[Family, ...] = get_args(Family)
TRIAL_FAMILIES: tuple[Family, ...] = ("ilr", "blocks")  # the families whose maps the trials propose
Device = Literal["auto", "cpu", "cuda", "mps"]
DEVICES: tuple[Device, ...] = get_args(Device)
Dtype = Literal["auto", "fp32", "bf16"]
DTYPES: tuple[Dtype, ...] = get_args(Dtype)
LrSchedule = Literal["cosine", "wsd"]
LR_SCHEDULES: tuple[LrSchedule, ...] = get_args(LrSchedule)
RacePolicy = Literal["adaptive", "fixed"]  # the racing policies: adaptive_race.py and fixed_race.py
RACE_POLICIES: tuple[RacePolicy, ...] = get_args(RacePolicy)
EqualCompute = Literal["depth", "off"]
EQUAL_COMPUTE: tuple[EqualCompute, ...] = get_args(EqualCompute)


@dataclass(frozen=True)
class DataConfig:
    corpus: str = "stdlib"
    tokenizer: str = "byte"
    text_column: str = "text"  # the text of a document; with answer_column, the prompt of a prompt/answer row
    answer_column: str = ""  # "": documents of text; else rows of prompt and answer, whose loss is on the answer only
    choices_column: str = ""  # objective choice: the column of each item's choices (answer_column: the correct one)
    stop: str = "\n"  # objective exact: greedy decoding stops at this text
    max_new_tokens: int = 16  # objective exact: ... or after this many tokens
    task: str = ""  # objective lm-eval: the task's name (lm-eval's registry, or a YAML under tasks_path)
    tasks_path: str = ""  # objective lm-eval: a folder of local task YAMLs
    val_fraction: float = 0.05
    max_train_tokens: int = 0  # 0: the whole training split; else a cap (e.g. for epochs over a fixed sample)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 500
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 1e-2
    warmup_frac: float = 0.1
    warmup_steps: int = 0  # 0: round(warmup_frac * steps); else this many steps whatever the run's length
    min_lr_frac: float = 0.1
    lr_schedule: LrSchedule = "cosine"  # "cosine" decays over the whole run, "wsd" only at its end
    cooldown_frac: float = 0.2  # wsd: the last cooldown_frac of the run decays (1-sqrt) to min_lr_frac * lr
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_fractions: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)
    eval_windows: int = 128
    seed: int = 0
    device: Device = "auto"
    dtype: Dtype = "auto"
    compile: bool | None = None  # None: auto (compile on CUDA only)
    checkpoint_every: int = 50  # steps between trial checkpoints; 0: none
    # a retrofit (a pretrained model's continued training) of a map with adapters: train the adapters alone, the
    # model's weights as they were (as relaxed recursion and Think-at-Hard do), or every weight ("all")
    retrofit: Retrofit = "adapters"

    @property
    def eval_steps(self) -> list[int]:
        """Steps at which the proxy is evaluated; the last step always is."""
        steps = {max(1, min(self.steps, round(f * self.steps))) for f in self.eval_fractions}
        return sorted(steps | {self.steps})

    @property
    def warmup_length(self) -> int:
        """Steps of linear warmup: warmup_steps where set, else warmup_frac of the run (at least one)."""
        return self.warmup_steps or max(1, round(self.warmup_frac * self.steps))

    @property
    def cooldown_start(self) -> int:
        """The last step of a wsd run's constant phase; its cooldown runs over the steps after it. A wsd run of any
        length with the same warmup passes through the same state at this step: its stable-phase checkpoint, from
        which a longer run continues (train_proxy's `start_from`)."""
        return self.steps - max(1, round(self.cooldown_frac * self.steps))

    def lr_schedule_text(self) -> str:
        """The learning-rate schedule in words, over the run's own length (train.lr_at computes it)."""
        warmup = f"{self.warmup_steps} steps" if self.warmup_steps else f"{self.warmup_frac:g}"
        if self.lr_schedule == "wsd":
            return f"wsd(warmup {warmup}, 1-sqrt cooldown {self.cooldown_frac:g}, floor {self.min_lr_frac:g})"
        return f"cosine(warmup {warmup}, floor {self.min_lr_frac:g})"

    def tokens(self, seq_len: int) -> int:
        return self.steps * self.batch_size * self.grad_accum * seq_len


@dataclass(frozen=True)
class SearchConfig:
    max_reuse: int = 4
    families: tuple[Family, ...] = ("ilr", "block")
    n_trials: int = 12
    sampler: Sampler = "auto"
    pruner: PrunerName = "pareto"
    objective: Objective = "pareto"
    prune_eta: float = 3.0
    prune_epsilon: float = 0.01
    prune_warmup: int = 4
    prune_calibration_maps: int = 6
    prune_min_spearman: float = 0.6
    # the baseline's extra seeds (its seed-to-seed noise band), and the switch of the second_seed reference (the best
    # recurrent map at a second seed, trained while noise_seeds > 0: second_seed_reference). One setting, so that a
    # study stored with noise_seeds = 0 keeps meaning what it trained.
    noise_seeds: int = 2
    enqueue_paper_maps: bool = True
    knobs: tuple[str, ...] = ()  # recurrence knobs searched with the map (knobs.py), each a categorical dimension
    # which part of a repeated layer (or block) the search proposes: both (the whole layer), attn, mlp (MAP_PARTS)
    parts: tuple[str, ...] = ("both",)
    damping_choices: tuple[float, ...] = (1.0, 0.5, 0.25, 0.1)  # the values of a searched damping knob (1: plain)
    target: float = 4.0  # the race's training length, a multiple of the proxy's steps (1: no longer training)
    race_seeds: int = 3  # adaptive: seeds each contender has at the target at its first test; fixed: at every length
    race_contenders: int = (
        3  # maps raced on more seeds (adaptive: of the screen's, at the target), the baseline among them
    )
    race_policy: RacePolicy = "adaptive"  # adaptive_race.py, or fixed_race.py (race_seeds at doubled lengths)
    max_seeds: int = 8  # adaptive: the most seeds a contender gets at the target (its first screens, the rest test)
    race_screen: int = 12  # adaptive: the most maps screened at the target at the first seed
    # adaptive: test seeds added a wave after the first test, where the sequential test looks; 0: automatic, 2 where
    # the pool has at most 4 test seeds (max_seeds 5 or less), else 1 (analysis/sequential.looks_apart)
    look_every: int = 0
    equal_compute: EqualCompute = "depth"  # "depth": race a plain model as deep as the best contender runs; "off"
    judge: bool = False  # `ilr-search judge`: given candidates raced both ways against the plain model, no search
    max_race_steps: int = 0  # a cap on the steps the race trains (0: none); how a run goes, not what the study is
    fuse: int | Literal["auto"] = (
        4  # maps trained at once in one fused group (fused.py), or "auto" (commands/autofuse.py);
    )
    # how a study runs, not what it is: never stored
    # maps trained first, after the baseline, in this order: "3,2,2,1", "2,1,1,1|injection=add" or "block2"
    enqueue: tuple[str, ...] = ()
    # a wall-clock budget for one invocation of `run` ("15m", "1.5h", or seconds; time_budget.py): no new run starts
    # once it is spent. How a run goes, not what the study is: never stored
    time_budget: str | float | None = None

    @property
    def second_seed_reference(self) -> bool:
        """Whether the study trains the second_seed reference: with the noise band, never without it."""
        return self.noise_seeds > 0


# The largest value of each size a space accepts, from its TOML or a flag alike (space.validate_space checks them
# before anything is allocated, trained or stored): (section, TOML key) -> maximum. Beyond them a model could not
# be allocated, a run would not end, or a count would not fit a database's integer. The race's length (target x
# steps) is held to the steps' maximum too, and `run --workers` to WORKERS_MAX.
SIZE_MAXIMA: dict[tuple[str, str], int | float] = {
    ("model", "layers"): 1024,
    ("model", "d_model"): 65_536,
    ("model", "heads"): 1024,
    ("model", "seq_len"): 1_048_576,
    ("model", "mlp_ratio"): 64,
    ("model", "init_depth"): 1024 * 64,  # layers x max_reuse: the deepest map
    ("train", "steps"): 10**9,
    ("train", "batch_size"): 65_536,
    ("train", "grad_accum"): 65_536,
    ("train", "warmup_steps"): 10**9,
    ("train", "eval_windows"): 1_000_000,
    ("train", "checkpoint_every"): 10**9,
    ("data", "max_train_tokens"): 10**15,
    ("search", "n_trials"): 100_000,
    ("search", "max_reuse"): 64,
    ("search", "race_seeds"): 1000,
    ("search", "max_seeds"): 1000,
    ("search", "race_contenders"): 1000,
    ("search", "race_screen"): 1000,
    ("search", "look_every"): 1000,
    ("search", "max_race_steps"): 10**15,
    ("search", "fuse"): 1024,
    ("search", "noise_seeds"): 1000,
    ("search", "prune_warmup"): 100_000,
    ("search", "prune_calibration_maps"): 100_000,
}
WORKERS_MAX = 1024


# The version of the stored configuration's layout (SpaceConfig.to_dict, and the study configuration plan.py
# stores). 0: no `schema_version` key, what every study stored before this field existed; 1: the same sections
# and keys, with the version written. A later layout gets a new number and its own reading in from_dict.
SPACE_SCHEMA_VERSION = 1


# What a stored configuration that lacks a key ran with (versions 0 and 1 alike). A study leaves the knob fields out
# while they are off, the answer column out while there is none, and the race settings out at these values, so that a
# study made before they existed keeps its configuration and its derived name: the study made by commit eeb668a
# (tests/fixtures/study-eeb668a.sql) has no knob field, no searched knob and no race setting, and it ran with the
# knobs off (today's model, so none of its trials has a knob) and is raced on resume at target 4, 3 seeds, 3
# contenders (the race's first settings, commit 16303f0), by the fixed race with no equal-compute reference (a study
# made before the adaptive race existed keeps the race it was made with). Every study has stored its dtype (since the
# first search, commit ef78507); a missing one reads as fp32, as the audit read it, never as "auto". A study made
# before the WSD schedule existed ran cosine with its warmup a fraction of its steps. A study that stored no look_every
# tested after every seed. Pinned here and not read from
# the dataclasses' defaults: a later default must not change what an old study meant. Keys absent from this table that
# a section lacks take the dataclass's default (a study stores what changes its results, not e.g. the device).
STORED_OMITTED_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": KNOB_FIELD_DEFAULTS | ARCHITECTURE_FIELD_DEFAULTS,
    "data": {
        "answer_column": "",
        "choices_column": "",
        "stop": "\n",
        "max_new_tokens": 16,
        "task": "",
        "tasks_path": "",
    },
    "train": {
        "dtype": "fp32",
        "lr_schedule": "cosine",
        "warmup_steps": 0,
        "cooldown_frac": 0.2,
        "retrofit": "adapters",
    },
    "search": {
        "knobs": (),
        "parts": ("both",),
        "target": 4.0,
        "race_seeds": 3,
        "race_contenders": 3,
        "race_policy": "fixed",
        "max_seeds": 3,
        "race_screen": 3,
        "equal_compute": "off",
        "look_every": 1,
        "damping_choices": (1.0, 0.5, 0.25, 0.1),
        "judge": False,
    },
}


V = TypeVar("V")


def without_omitted_defaults(section: str, values: Mapping[str, V]) -> dict[str, V]:
    """A section's values (SpaceConfig.to_dict's) without the keys at their STORED_OMITTED_DEFAULTS value: what a
    study stores of that section."""
    omitted = STORED_OMITTED_DEFAULTS.get(section, {})
    return {k: v for k, v in values.items() if k not in omitted or v != omitted[k]}


def _section(cls: type, stored: Mapping[str, Any], omitted: Mapping[str, Any]) -> Any:
    """One dataclass from its stored section: the keys it knows (lists back to tuples), `omitted` for the
    keys missing, the dataclass's defaults for the rest."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {k: v for k, v in {**omitted, **stored}.items() if k in fields}
    defaults = cls()
    return cls(
        **{
            k: tuple(v) if isinstance(getattr(defaults, k), tuple) and isinstance(v, list) else v
            for k, v in values.items()
        }
    )


@dataclass(frozen=True)
class SpaceConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (tuples as lists), with the layout's `schema_version`; from_dict reads it back."""
        sections = {
            name: {
                k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(getattr(self, name)).items()
            }
            for name in ("model", "data", "train", "search")
        }
        return {"schema_version": SPACE_SCHEMA_VERSION, **sections, "source": self.source}

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> SpaceConfig:
        """The space of a stored dict: to_dict's, or a study's stored configuration of any version up to
        SPACE_SCHEMA_VERSION (no `schema_version`: version 0), whose missing keys take STORED_OMITTED_DEFAULTS
        and then the dataclasses' defaults. Keys of no field (a study's budget, init_depth) are left out."""
        version = stored.get("schema_version", 0)
        if not isinstance(version, int) or not 0 <= version <= SPACE_SCHEMA_VERSION:
            raise ValueError(
                f"stored configuration of schema version {version!r}; this ilr-search reads versions "
                f"0 to {SPACE_SCHEMA_VERSION} (a newer ilr-search stored it)"
            )
        kinds = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "search": SearchConfig}
        return cls(
            **{
                name: _section(kind, stored.get(name, {}), STORED_OMITTED_DEFAULTS.get(name, {}))
                for name, kind in kinds.items()
            },
            source=str(stored.get("source", "")),
        )


@dataclass(frozen=True)
class PrunerSettings:
    """How a study prunes; stored with the study so that a resumed study prunes the same way."""

    name: PrunerName = "pareto"
    rungs: tuple[int, ...] = ()
    eta: float = 3.0  # the best ceil(n / eta) maps at a rung always continue
    epsilon: float = 0.01  # relative slack on the rung's losses
    warmup: int = 4  # pareto-eager: maps at a rung before it prunes; median: Optuna's n_startup_trials
    calibration_maps: int = 6  # pareto: complete maps a rung needs before it may prune
    min_spearman: float = 0.6  # pareto: rung-to-final rank agreement a rung needs before it may prune

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"rungs": list(self.rungs)}

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> PrunerSettings:
        """Settings stored by a study; a `pareto` study stored before calibration existed prunes as it did."""
        values = dict(stored)
        if values.get("name") == "pareto" and "min_spearman" not in values:
            values["name"] = "pareto-eager"
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in values.items() if k in known}
        values["rungs"] = tuple(values.get("rungs", ()))
        return cls(**values)


def factor_key(factor: float) -> str:
    """How a race run's factor (its steps over the proxy's) is stored and named: `audit --factor 4` and a race run
    of 4x the proxy's steps are both "4"; "0" for a frozen study's runs (no step: an evaluation on a window chunk)."""
    return f"{factor:g}"


def race_target_steps(target: float, base_steps: int) -> int:
    """The race's length in steps: `target` times the proxy's `base_steps`, rounded, never below them."""
    return max(base_steps, round(target * base_steps))


def races(base_steps: int, target_steps: int, race_seeds: int) -> bool:
    """Whether a race trains anything: a target beyond the proxy's length, or more than one seed (the adaptive race's
    first test needs race_seeds > 1; the fixed race races every contender on race_seeds seeds)."""
    return target_steps > base_steps or race_seeds > 1


SamplerOption = int | float | bool | None | tuple[int, ...]


@dataclass(frozen=True)
class SamplerSettings:
    """How a study samples, every default explicit; stored with the study so that a resume samples the same way."""

    name: Sampler  # the sampler built: tpe, nsga2, gp, random or grid
    requested: Sampler  # what the space or flag asked for (auto resolves to a name)
    seed: int | None
    options: tuple[tuple[str, SamplerOption], ...] = ()  # the sampler's keyword arguments

    def to_dict(self) -> dict[str, Any]:
        options = {k: list(v) if isinstance(v, tuple) else v for k, v in self.options}
        return {"name": self.name, "requested": self.requested, "seed": self.seed} | options

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> SamplerSettings:
        options = tuple(
            (k, tuple(v) if isinstance(v, list) else v)
            for k, v in stored.items()
            if k not in ("name", "requested", "seed")
        )
        return cls(stored["name"], stored.get("requested", stored["name"]), stored.get("seed"), options)


@dataclass(frozen=True)
class StudySettings:
    """The sampler and pruner settings a study stores beside its configuration."""

    sampler: SamplerSettings
    pruner: PrunerSettings
    pruner_before_calibration: bool = False  # stored before calibrated pruning: a resume checks only --pruner

    def to_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.to_dict(), "pruner": self.pruner.to_dict()}

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> StudySettings:
        pruner = stored.get("pruner", {})
        return cls(
            SamplerSettings.from_dict(stored["sampler"]),
            PrunerSettings.from_dict(pruner),
            pruner_before_calibration="min_spearman" not in pruner,
        )
