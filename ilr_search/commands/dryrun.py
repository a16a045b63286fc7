"""`run --dry-run`: the plan of a study (name, trials, references, pruning rungs, storage, space) and an estimate of
its time from a short timed probe of the cheapest and the costliest schedule. It writes nothing: no storage,
no study, no token cache (the probe trains on random tokens: a step's time does not depend on their values),
no checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


from ilr_search.config import ModelConfig, SpaceConfig
from ilr_search.data.tokens import TokenData, cache_key, cache_root, random_tokens
from ilr_search.training.flops import flops_ratio
from ilr_search.analysis.results import REFERENCE_PREFIX, has_result
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.search.maps import repair_to_budget
from ilr_search.search.plan import StudyPlan, adopt_stored_dtype, adopt_stored_race, check_resume, stored_study
from ilr_search.search.pruners import pruner_settings
from ilr_search.commands.layout import race_processes
from ilr_search.search.run import ReferenceRun, RunRequest, checked_request, reference_runs
from ilr_search.search.samplers import sampler_settings
from ilr_search.storage import open_storage
from ilr_search.training.device import resolve_compile, resolve_device
from ilr_search.training.train import train_proxy

PROBE_STEPS = 8  # timed steps per probed schedule, after one untimed first step


@dataclass(frozen=True)
class Probe:
    """One probed schedule: seconds per training step and per evaluation, measured on this machine."""

    label: str
    reuse_map: list[int]
    layer_runs: int
    seconds_per_step: float
    seconds_per_eval: float


def probe_schedule(space: SpaceConfig, model: ModelConfig, reuse_map: list[int], label: str, dtype: str,
                   data: TokenData) -> Probe:
    """Seconds per step (the difference of a 1-step and a (1 + PROBE_STEPS)-step run, so the first step's setup
    is not counted) and per evaluation, uncompiled."""
    schedule = reuse_map_schedule(reuse_map)
    base = dataclasses.replace(space.train, dtype=dtype, compile=False, eval_fractions=(1.0,), checkpoint_every=0)
    short = train_proxy(model, schedule, data, dataclasses.replace(base, steps=1))
    long = train_proxy(model, schedule, data, dataclasses.replace(base, steps=1 + PROBE_STEPS))
    step_seconds = ((long.train_seconds - long.eval_seconds) - (short.train_seconds - short.eval_seconds)) / PROBE_STEPS
    return Probe(label, reuse_map, len(schedule), max(step_seconds, 0.0), (short.eval_seconds + long.eval_seconds) / 2)


def costliest_map(n_layers: int, max_reuse: int, max_layer_runs: int) -> list[int]:
    """The deepest map the budget pays for (every layer at max_reuse, repaired to the budget)."""
    return repair_to_budget([max_reuse] * n_layers, max_layer_runs)


def dry_run_report(request: RunRequest, workers: int | None = None, probe: bool = True) -> dict[str, Any]:
    """The `run --dry-run` report: what `request` would do, and how long its training would take without pruning
    or a map trained twice (`workers`: --workers, None: the space's). Bad input raises as `run` would; nothing is
    written."""
    spec, space, plan = checked_request(request)
    workers = workers or 1
    existing = open_storage(spec, heartbeat=False) if spec.exists() else None
    if existing is not None and space.train.dtype == "auto":
        plan = adopt_stored_dtype(existing, plan)
    plan = adopt_stored_race(existing, plan, dict(request.asked_race))
    check_resume(existing, spec, plan, request.pruner)
    study = stored_study(existing, plan.name)
    trials = study.get_trials(deepcopy=False) if study is not None else []
    finished = sum(has_result(t) for t in trials)
    target = request.target_trials
    refs = reference_runs(plan, trials)
    names = [r.name for r in refs] + (["second_seed"] if space.search.noise_seeds and not any(
        r.name == "second_seed" for r in refs) else [])  # the best recurrent map at a second seed, once known
    done_refs = [n for n in names if study is not None and f"{REFERENCE_PREFIX}{n}" in study.user_attrs]
    max_runs = plan.budget.max_layer_runs(plan.model)
    n_layers = plan.model.n_layers
    costly = costliest_map(n_layers, space.search.max_reuse, max_runs)
    device = resolve_device(space.train.device)
    cache = cache_root() / f"tokens-{cache_key(space.data, space.data.max_train_tokens)}"
    report: dict[str, Any] = {
        "dry_run": True,
        "study": plan.name,
        "resume": study is not None,
        "n_trials": target,
        "finished_trials": finished,
        "trials_to_train": max(0, target - finished),
        "references": names,
        "references_to_train": [n for n in names if n not in done_refs],
        "sampler": sampler_settings(space.search.sampler, space.train.seed, space.search.max_reuse).name,
        "pruner": space.search.pruner,
        "pruning_rungs": list(pruner_settings(space).rungs) if space.search.pruner != "none" else [],
        "objective": space.search.objective,
        "budget": {"text": plan.budget.text, "ratio": plan.budget.ratio, "max_layer_runs": max_runs},
        "storage": spec.masked,
        "storage_exists": spec.exists(),
        "space": space.source,
        "model": {"layers": n_layers, "d_model": plan.model.d_model, "heads": plan.model.n_heads,
                  "seq_len": plan.model.seq_len, "pe": plan.model.pe, "vocab_size": plan.model.vocab_size},
        "data": {"corpus": space.data.corpus, "tokenizer": space.data.tokenizer,
                 "tokens_cached": (cache / "meta.json").exists() if not space.data.corpus.startswith("hf:") else None},
        "train": {"steps": space.train.steps, "batch_size": space.train.batch_size, "lr": space.train.lr,
                  "eval_steps": space.train.eval_steps, "device": str(device), "dtype": plan.dtype,
                  "compile": resolve_compile(space.train.compile, device)},
        "knobs": list(space.search.knobs),
        "workers": workers,
        "race": race_plan(plan, target),
    }
    if probe:
        report |= estimate(space, plan, costly, refs, report["trials_to_train"], done_refs, workers, report["race"])
    return report


def race_plan(plan: StudyPlan, n_trials: int) -> dict[str, Any]:
    """What the race would train, in runs at the target length: at least (every run a decided race needs: the
    screen, the contenders' first test seeds, the equal-compute reference at those seeds) and at most (every
    contender to the pool's last seed), both within the compute cap; the fixed race trains its contenders at every
    length and seed, fewer where it eliminates."""
    search, base = plan.space.search, plan.space.train.steps
    target = max(base, round(search.target * base))
    if search.target <= 1 and search.race_seeds <= 1:
        return {"policy": "off", "target_steps": target, "runs_min": 0, "runs_max": 0, "steps_min": 0, "steps_max": 0}
    if search.race_policy == "fixed":
        lengths = [base * 2 ** i for i in range(64) if base * 2 ** i < target] + [target]
        per_map = sum(lengths) * search.race_seeds - base
        most = search.race_contenders * per_map
        return {"policy": "fixed", "target_steps": target, "seeds": search.race_seeds, "lengths": lengths,
                "contenders": search.race_contenders, "runs_min": 0,
                "runs_max": search.race_contenders * (len(lengths) * search.race_seeds - 1), "steps_min": 0,
                "steps_max": most, "cap": search.max_race_steps or None}
    screened = min(search.race_screen, n_trials)
    contenders = min(search.race_contenders, screened)
    deep = 1 if search.equal_compute == "depth" else 0
    first = screened + contenders * (search.race_seeds - 1) + deep * search.race_seeds
    most = screened + contenders * (search.max_seeds - 1) + deep * search.max_seeds
    cap = search.max_race_steps or None
    steps_min, steps_max = first * target, most * target
    if cap is not None:
        steps_min, steps_max = min(steps_min, cap), min(steps_max, cap)
    return {"policy": "adaptive", "target_steps": target, "screen": screened, "contenders": contenders,
            "first_test_seeds": search.race_seeds - 1, "max_seeds": search.max_seeds, "equal_compute": search.equal_compute,
            "runs_min": steps_min // target, "runs_max": steps_max // target, "steps_min": steps_min,
            "steps_max": steps_max, "cap": cap}


def estimate(space: SpaceConfig, plan: StudyPlan, costly: list[int], refs: list[ReferenceRun], trials_to_train: int,
             done_refs: list[str], workers: int, race: dict[str, Any]) -> dict[str, Any]:
    """Time per schedule as a line through the probed cheapest and costliest schedules (per layer run), applied
    to an average sampled map (half-way), each reference, each evaluation and each race run (its least and most;
    on a CPU of several cores the race's runs share them, one process a core)."""
    n_layers = plan.model.n_layers
    data = random_tokens(plan.model.vocab_size, plan.model.seq_len)
    baseline = probe_schedule(space, plan.model, [1] * n_layers, "baseline", plan.dtype, data)
    costliest = probe_schedule(space, plan.model, costly, "costliest", plan.dtype, data)
    span = max(1, costliest.layer_runs - baseline.layer_runs)

    def proxy_seconds(layer_runs: float) -> float:
        at = (layer_runs - baseline.layer_runs) / span
        step = baseline.seconds_per_step + at * (costliest.seconds_per_step - baseline.seconds_per_step)
        evaluation = baseline.seconds_per_eval + at * (costliest.seconds_per_eval - baseline.seconds_per_eval)
        return space.train.steps * step + len(space.train.eval_steps) * evaluation

    mid_runs = (baseline.layer_runs + costliest.layer_runs) / 2
    trial_seconds = proxy_seconds(mid_runs)
    ref_seconds = sum(proxy_seconds(mid_runs if r.name == "second_seed" else len(r.schedule))
                      for r in refs if r.name not in done_refs)
    if space.search.noise_seeds and "second_seed" not in done_refs and not any(r.name == "second_seed" for r in refs):
        ref_seconds += proxy_seconds(mid_runs)
    run_seconds = proxy_seconds(mid_runs) * race["target_steps"] / space.train.steps if race["runs_max"] else 0.0
    racers = max(workers, race_processes(space, 1))
    race_min = race["steps_min"] / race["target_steps"] * run_seconds / racers if race["runs_max"] else 0.0
    race_max = race["steps_max"] / race["target_steps"] * run_seconds / racers if race["runs_max"] else 0.0
    total = trials_to_train * trial_seconds / max(1, workers) + ref_seconds
    return {"probe": [dataclasses.asdict(baseline), dataclasses.asdict(costliest)],
            "probe_flops_ratios": [flops_ratio(plan.model, reuse_map_schedule(p.reuse_map)) for p in (baseline, costliest)],
            "estimated_trial_seconds": trial_seconds, "estimated_reference_seconds": ref_seconds,
            "estimated_race_seconds": [race_min, race_max],
            "estimated_seconds": total + race_min, "estimated_seconds_max": total + race_max,
            "estimate_note": "no pruning and no repeated map assumed (both shorten a run); an average trial is "
                             "taken half-way between the baseline and the costliest map; start-up, storage writes, "
                             "tokenizing an uncached corpus, layer compilation and a changing machine load are not "
                             "counted"
                             + (f"; {workers} workers are assumed to share the device without slowing each other"
                                if workers > 1 else "")}
