"""Samplers: every default set explicitly and stored with the study, so a resumed study samples the same way."""

from __future__ import annotations

import optuna

from ..config import SamplerOption, SamplerSettings
from ..errors import UserInputError
from ..knobs import KNOB_CHOICES


def sampler_settings(name: str, seed: int, n_layers: int, max_reuse: int) -> SamplerSettings:
    """The settings of sampler `name` (auto: TPE), every default explicit. The grid's knob dimensions come from
    the study's configuration (build_sampler's `knobs`)."""
    resolved = "tpe" if name == "auto" else name
    options: dict[str, SamplerOption] = {}
    if resolved == "tpe":
        options = {"n_startup_trials": 8, "n_ei_candidates": 24, "multivariate": True, "group": False,
                   "constant_liar": True}
    elif resolved == "nsga2":
        options = {"population_size": 8, "crossover_prob": 0.9, "swapping_prob": 0.5, "mutation_prob": None}
    elif resolved == "gp":
        options = {"n_startup_trials": 8, "deterministic_objective": False}
    elif resolved == "grid":
        options = {"values": tuple(range(1, max_reuse + 1))}
    return SamplerSettings(resolved, name, seed, tuple(options.items()))


def build_sampler(settings: SamplerSettings, n_layers: int, worker_offset: int = 0,
                  knobs: tuple[str, ...] = ()) -> optuna.samplers.BaseSampler:
    s = dict(settings.options)
    # Each worker (and each resume) draws from its own stream; the first worker of a study is reproducible.
    seed = None if settings.seed is None else settings.seed * 1_000_003 + worker_offset
    name = settings.name
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **s)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, **s)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, **s)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        grid = {f"r{i}": list(s["values"]) for i in range(n_layers)} | {k: list(KNOB_CHOICES[k]) for k in knobs}
        return optuna.samplers.GridSampler(grid, seed=seed)
    raise UserInputError(f"unknown sampler {name!r}")
