"""Samplers: every default set explicitly and stored with the study, so a resumed study samples the same way."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from ilr_search.config import SAMPLERS, Sampler, SamplerOption, SamplerSettings
from ilr_search.errors import UserInputError
from ilr_search.knobs import knob_choices
from ilr_search.search.maps import (
    BLOCK_END,
    BLOCK_PARAMS,
    BLOCK_REPEATS,
    BLOCK_START,
    FAMILY_PARAM,
    TrialParams,
    block_params,
    feasible_blocks,
    map_params,
    repair_block,
    repair_to_budget,
    trial_families,
)
from ilr_search.storage import trial_id


def sampler_settings(name: str, seed: int, max_reuse: int) -> SamplerSettings:
    """The settings of sampler `name` (auto: TPE), every default explicit. The grid's knob dimensions come from
    the study's configuration (build_sampler's `knobs`)."""
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; use one of {', '.join(SAMPLERS)}")
    resolved: Sampler = "tpe" if name == "auto" else name
    options: dict[str, dict[str, SamplerOption]] = {
        "tpe": {
            "n_startup_trials": 8,
            "n_ei_candidates": 24,
            "multivariate": True,
            "group": False,
            "constant_liar": True,
        },
        "nsga2": {"population_size": 8, "crossover_prob": 0.9, "swapping_prob": 0.5, "mutation_prob": None},
        "gp": {"n_startup_trials": 8, "deterministic_objective": False},
        "grid": {"values": tuple(range(1, max_reuse + 1))},
    }
    return SamplerSettings(resolved, name, seed, tuple(options.get(resolved, {}).items()))


class BudgetRepairSampler(optuna.samplers.BaseSampler):
    """A sampler whose proposals are maps the budget pays for, so that what Optuna stores for a trial (r0..rN)
    is the map it trains: the wrapped sampler proposes every per-layer count at once (jointly where it models
    them jointly, independently where it does not yet), the proposal is repaired to the budget
    (maps.repair_to_budget), and the repaired counts are what the trial gets. The wrapped sampler then learns
    from maps that were trained, and the dashboard's plots describe them.

    With the blocks family the same holds for a block's parameters (maps.repair_block); where the study searches
    both families, the trial's `family` is drawn first and only that family's parameters are proposed. A block
    drawn afresh (start and end both independent) is uniform over the blocks (start <= end): the start is drawn
    from 0..L-1 and a second index from 0..L, which give each block exactly two of the L(L+1) pairs."""

    redraws = 8  # independent redraws of a proposal that lands on a tried map, before it is kept (and reused)

    def __init__(
        self,
        base: optuna.samplers.BaseSampler,
        n_layers: int,
        max_reuse: int,
        max_layer_runs: int,
        knobs: tuple[str, ...] = (),
        families: tuple[str, ...] = ("ilr",),
    ) -> None:
        self.base, self.knobs = base, knobs
        self.n_layers, self.max_layer_runs, self.max_reuse = n_layers, max_layer_runs, max_reuse
        self.families = trial_families(families)
        self.counts_space = (
            {f"r{i}": IntDistribution(1, max_reuse) for i in range(n_layers)} if "ilr" in self.families else {}
        )
        self.block_space: dict[str, BaseDistribution] = (
            {
                BLOCK_START: IntDistribution(0, n_layers - 1),
                BLOCK_END: IntDistribution(0, n_layers - 1),
                BLOCK_REPEATS: IntDistribution(1, max_reuse),
            }
            if "blocks" in self.families
            else {}
        )
        self.family_space: dict[str, BaseDistribution] = (
            {FAMILY_PARAM: CategoricalDistribution(self.families)} if len(self.families) > 1 else {}
        )
        self.map_space: dict[str, BaseDistribution] = self.family_space | self.counts_space | self.block_space
        self._base_space: dict[int, dict[str, BaseDistribution]] = {}  # trial id -> the wrapped sampler's own space

    def reseed_rng(self) -> None:
        self.base.reseed_rng()

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        own = self.base.infer_relative_search_space(study, trial)
        self._base_space[trial_id(trial)] = own
        return own | self.map_space

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> TrialParams:
        own = self._base_space.pop(trial_id(trial), {})
        params = self._repaired(study, trial, dict(self.base.sample_relative(study, trial, own)) if own else {})
        if set(self.knobs) - set(params):  # knobs sampled later: whether the proposal was tried is not known yet
            return params
        tried = [
            t.params
            for t in study.get_trials(deepcopy=False)
            if t.number != trial.number and t.state != TrialState.WAITING
        ]
        for _ in range(self.redraws):
            if params not in tried:
                break
            # The proposal would only reuse a tried map's result (the repair maps many proposals onto one map
            # at the budget's edge; GP ignores pruned trials and proposes them again): the counts are drawn
            # again by the sampler's independent sampling (cheap, no model refit), the rest kept.
            params = self._repaired(study, trial, {k: v for k, v in params.items() if k not in self.map_space})
        if params in tried and self.block_space and (not self.family_space or params[FAMILY_PARAM] == "blocks"):
            params = self._untried_block(params, tried, trial.number)
        return params

    def _untried_block(self, params: TrialParams, tried: list[TrialParams], number: int) -> TrialParams:
        """`params` moved to a feasible block no trial has tried (drawn with the trial's number as the seed), where
        one is left: blocks are few enough to list, so a proposal never repeats an evaluated block while others
        remain."""
        left = [
            b
            for b in feasible_blocks(self.n_layers, self.max_reuse, self.max_layer_runs)
            if params | block_params(b) not in tried
        ]
        return params | block_params(random.Random(number).choice(left)) if left else params

    def _repaired(self, study: optuna.Study, trial: FrozenTrial, params: TrialParams) -> TrialParams:
        """`params` with every map parameter the base sampler did not give drawn independently, and the map
        repaired to the budget (only the trial's family's parameters are kept)."""
        for name, distribution in self.family_space.items():
            if name not in params:
                params[name] = self.base.sample_independent(study, trial, name, distribution)
        family = params[FAMILY_PARAM] if self.family_space else self.families[0]
        if family == "blocks":
            return self._repaired_block(study, trial, params)
        params = {k: v for k, v in params.items() if k not in self.block_space}
        for name, distribution in self.counts_space.items():
            if name not in params:
                params[name] = self.base.sample_independent(study, trial, name, distribution)
        proposed = [int(params[f"r{i}"]) for i in range(self.n_layers)]
        return params | map_params(repair_to_budget(proposed, self.max_layer_runs))

    def _repaired_block(self, study: optuna.Study, trial: FrozenTrial, params: TrialParams) -> TrialParams:
        params = {k: v for k, v in params.items() if k not in self.counts_space}
        if BLOCK_START not in params and BLOCK_END not in params:  # a fresh block: uniform over start <= end
            a = int(self.base.sample_independent(study, trial, BLOCK_START, self.block_space[BLOCK_START]))
            b = int(self.base.sample_independent(study, trial, BLOCK_END, IntDistribution(0, self.n_layers)))
            params[BLOCK_START], params[BLOCK_END] = (b, a) if b <= a else (a, b - 1)
        for name in BLOCK_PARAMS:
            if name not in params:
                params[name] = self.base.sample_independent(study, trial, name, self.block_space[name])
        start, end, repeats = (int(params[p]) for p in BLOCK_PARAMS)
        block = repair_block(start, end, repeats, self.n_layers, self.max_layer_runs)
        return params | block_params(block)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self, study: optuna.Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.base.after_trial(study, trial, state, values)


def build_sampler(
    settings: SamplerSettings,
    n_layers: int,
    max_reuse: int,
    max_layer_runs: int,
    worker_offset: int = 0,
    knobs: tuple[str, ...] = (),
    families: tuple[str, ...] = ("ilr",),
    damping_choices: Sequence[float] = (),
) -> optuna.samplers.BaseSampler:
    """The study's sampler, wrapped so that it proposes maps (of the study's `families`) within the budget only
    (BudgetRepairSampler: the space's max_reuse, the budget's max_layer_runs)."""
    blocks_only = trial_families(families) == ("blocks",)
    base = _base_sampler(settings, n_layers, worker_offset, knobs, damping_choices, blocks_only)
    return BudgetRepairSampler(base, n_layers, max_reuse, max_layer_runs, knobs, families)


def _base_sampler(
    settings: SamplerSettings,
    n_layers: int,
    worker_offset: int,
    knobs: tuple[str, ...],
    damping_choices: Sequence[float] = (),
    blocks_only: bool = False,
) -> optuna.samplers.BaseSampler:
    s: dict[str, Any] = dict(settings.options)  # the sampler's own keyword arguments
    # Each worker (and each resume) draws from its own stream; the first worker of a study is reproducible.
    seed = None if settings.seed is None else settings.seed * 1_000_003 + worker_offset
    name = settings.name
    # grid over blocks is a scan: every feasible block is enqueued (run.first_trials); none sampled
    if name == "random" or (name == "grid" and blocks_only):
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        grid = {f"r{i}": list(s["values"]) for i in range(n_layers)} | {
            k: list(knob_choices(k, damping_choices)) for k in knobs
        }
        return optuna.samplers.GridSampler(grid, seed=seed)
    samplers: dict[str, Callable[..., optuna.samplers.BaseSampler]] = {
        "tpe": optuna.samplers.TPESampler,
        "nsga2": optuna.samplers.NSGAIISampler,
        "gp": optuna.samplers.GPSampler,
    }
    if name not in samplers:
        raise UserInputError(f"unknown sampler {name!r}")
    return samplers[name](seed=seed, **s)
