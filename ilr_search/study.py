"""The Optuna driver: proposes reuse maps under a FLOP budget, trains each as a proxy, and keeps the study
(configuration, trials, curves, fronts) in a storage it can resume from."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.trial import FrozenTrial, TrialState

from .data import TokenData, load_space_tokens, model_config
from .errors import StorageFullError, UserInputError
from .flops import Budget, flops_ratio, parse_budget
from .model import ModelConfig, param_count
from .fidelity import audit_reports, best_recurrent, study_fidelity
from .results import FINISHED, REFERENCE_PREFIX, finite_or_none, has_result, references, study_front, trial_row
from .pruning import Pruner, PrunerSettings, build_pruner
from .schedule import block_schedule, format_reuse_map, reuse_map_schedule
from .space import SpaceConfig, validate_space
from .storage import Heartbeat, StorageSpec, grace_period, heartbeat_interval, open_storage, open_store, parse_storage
from .storage import CurvePoint, Store
from .train import EvalPoint, TrainResult, resolve_device, resolve_dtype, train_proxy

CONFIG_ATTR = "ilr:config"
SAMPLER_ATTR = "ilr:sampler"
FIDELITY_ATTR = "ilr:fidelity"
HEARTBEAT_ATTR = "ilr:heartbeat"

# Failed trials (a divergence, Ctrl-C) are reported by the run itself; Optuna's warnings would add tracebacks.
optuna.logging.set_verbosity(optuna.logging.ERROR)
# Heartbeats, stale-trial sweeps and metric names are marked experimental; the run uses them on purpose.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class TrialDiverged(Exception):
    """The proxy's loss became non-finite: the trial ends FAIL with its reason, the study goes on."""


# ----------------------------------------------------------------------------------------------------
# Reuse maps under a budget

def repair_to_budget(reuse_map: list[int], max_layer_runs: int) -> list[int]:
    """The map scaled into the budget, keeping its shape: the extra iterations (r - 1) are scaled down in
    proportion and the iterations left over go to the largest remainders (ties: the larger request, then the
    earlier layer). Every layer keeps at least one run; a map within budget is returned unchanged."""
    extras = [r - 1 for r in reuse_map]
    allowed = max(0, max_layer_runs - len(reuse_map))
    total = sum(extras)
    if total <= allowed:
        return list(reuse_map)
    scaled = [e * allowed / total for e in extras]
    kept = [math.floor(x) for x in scaled]
    leftover = allowed - sum(kept)
    order = sorted(range(len(extras)), key=lambda i: (-(scaled[i] - kept[i]), -extras[i], i))
    for i in order[:leftover]:
        kept[i] += 1
    return [1 + e for e in kept]


def propose_map(trial: optuna.Trial, n_layers: int, max_reuse: int, max_layer_runs: int) -> tuple[list[int], list[int]]:
    """(proposed, trained) maps of a trial: the sampler's per-layer counts, and the same repaired to the budget.
    The sampler is told how far over budget its proposal was (<= 0: feasible) through a constraint."""
    proposed = [trial.suggest_int(f"r{i}", 1, max_reuse) for i in range(n_layers)]
    trial.set_constraint("budget", float(sum(proposed) - max_layer_runs))
    return proposed, repair_to_budget(proposed, max_layer_runs)


def seed_maps(n_layers: int, max_reuse: int, max_layer_runs: int) -> list[list[int]]:
    """The all-ones baseline and front-loaded maps in the spirit of the paper's findings ([4,2,1,1], [3,2,2,1]
    and [2,1,1,1] were its best small-model maps), repaired to the budget, without duplicates."""
    ones = [1] * n_layers
    shapes = [[2], [4, 2], [3, 2, 2], [2, 2]]
    maps, seen = [ones], {tuple(ones)}
    for head in shapes:
        m = [min(max_reuse, r) for r in head[:n_layers]] + [1] * max(0, n_layers - len(head))
        m = repair_to_budget(m, max_layer_runs)
        if tuple(m) not in seen:
            seen.add(tuple(m))
            maps.append(m)
    return maps


# ----------------------------------------------------------------------------------------------------
# The study's configuration: what it is, stored in the study, checked on resume

@dataclass(frozen=True)
class StudyPlan:
    space: SpaceConfig
    model: ModelConfig  # with the tokenizer's vocabulary
    budget: Budget
    dtype: str
    config: dict[str, Any]  # what the study stores and a resume must match
    name: str


RESULT_TRAIN_FIELDS = ("steps", "batch_size", "grad_accum", "lr", "warmup_frac", "min_lr_frac", "weight_decay",
                       "grad_clip", "eval_fractions", "eval_windows", "seed")


def study_config(space: SpaceConfig, model: ModelConfig, budget: Budget, dtype: str) -> dict[str, Any]:
    return {
        "model": dataclasses.asdict(model),
        "data": dataclasses.asdict(space.data),
        "train": {k: getattr(space.train, k) for k in RESULT_TRAIN_FIELDS} | {"dtype": dtype},
        "budget": {"text": budget.text, "ratio": round(budget.ratio, 9)},
        "search": {"max_reuse": space.search.max_reuse, "families": list(space.search.families),
                   "objective": space.search.objective},
    }


def _canonical(config: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(config, sort_keys=True))


def derive_study_name(config: dict[str, Any]) -> str:
    m, d = config["model"], config["data"]
    digest = hashlib.sha256(json.dumps(_canonical(config), sort_keys=True).encode()).hexdigest()[:8]
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


# ----------------------------------------------------------------------------------------------------
# Samplers: every default set explicitly and stored with the study

def sampler_settings(name: str, seed: int, n_layers: int, max_reuse: int) -> dict[str, Any]:
    resolved = "tpe" if name == "auto" else name
    settings: dict[str, Any] = {"name": resolved, "requested": name, "seed": seed}
    if resolved == "tpe":
        settings |= {"n_startup_trials": 8, "n_ei_candidates": 24, "multivariate": True, "group": False,
                     "constant_liar": True}
    elif resolved == "nsga2":
        settings |= {"population_size": 8, "crossover_prob": 0.9, "swapping_prob": 0.5, "mutation_prob": None}
    elif resolved == "gp":
        settings |= {"n_startup_trials": 8, "deterministic_objective": False}
    elif resolved == "grid":
        settings |= {"values": list(range(1, max_reuse + 1))}
    return settings


def build_sampler(settings: dict[str, Any], n_layers: int, worker_offset: int = 0) -> optuna.samplers.BaseSampler:
    s = {k: v for k, v in settings.items() if k not in ("name", "requested")}
    # Each worker (and each resume) draws from its own stream; the first worker of a study is reproducible.
    seed = None if s.get("seed") is None else s.pop("seed") * 1_000_003 + worker_offset
    name = settings["name"]
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **s)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, **s)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, **s)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({f"r{i}": s["values"] for i in range(n_layers)}, seed=seed)
    raise UserInputError(f"unknown sampler {name!r}")


def pruner_settings(space: SpaceConfig) -> PrunerSettings:
    s = space.search
    return PrunerSettings(name=s.pruner, rungs=tuple(space.train.eval_steps[:-1]), eta=s.prune_eta,
                          epsilon=s.prune_epsilon, warmup=s.prune_warmup, calibration_maps=s.prune_calibration_maps,
                          min_spearman=s.prune_min_spearman)


# ----------------------------------------------------------------------------------------------------
# Progress: what the run tells its caller (the CLI draws bars and tables from it)

class RunReporter:
    def study_started(self, study: str, target: int, finished: int) -> None: ...
    def trial_started(self, number: int, reuse_map: list[int], steps: int) -> None: ...
    def step(self, step: int, steps: int, loss: float) -> None: ...
    def trial_finished(self, row: dict[str, Any], front: list[dict[str, Any]], finished: int) -> None: ...
    def message(self, text: str) -> None: ...


def summarize(study: optuna.Study, spec: StorageSpec, store: Store) -> dict[str, Any]:
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    return {
        "study": study.study_name,
        "storage": spec.masked,
        "n_trials": sum(s in FINISHED or s == TrialState.FAIL for s in states),
        "n_complete": states.count(TrialState.COMPLETE),
        "n_pruned": states.count(TrialState.PRUNED),
        "n_failed": states.count(TrialState.FAIL),
        "steps_trained": sum(int(t.user_attrs.get("steps", 0)) for t in trials),
        "steps_saved_by_pruning": sum(int(t.user_attrs.get("steps_saved", 0)) for t in trials),
        "pareto": [{k: p[k] for k in ("trial", "reuse_map", "flops_ratio", "val_ppl", "val_bpb")}
                   for p in study_front(trials)],
        "references": references(study),
        "fidelity": fidelity_of(study, store, trials),
    }


def summarize_stored(storage: str | None, study_name: str) -> dict[str, Any]:
    """The `run` summary of a stored study, trained nothing (an interrupted multi-worker run)."""
    spec = parse_storage(storage)
    study = open_study(spec, study_name)
    summary = summarize(study, spec, open_store(spec, study_name))
    settings = study.user_attrs.get(SAMPLER_ATTR, {})
    summary["sampler"] = settings.get("sampler")
    summary["pruner"] = PrunerSettings.from_dict(settings["pruner"]).name if "pruner" in settings else None
    return summary


def fidelity_of(study: optuna.Study, store: Store, trials: list[FrozenTrial] | None = None) -> dict[str, Any]:
    """The study's fidelity (rung agreement, noise, second seed, audits, verdict) from its trials and rows."""
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    final_step = int(study.user_attrs.get(CONFIG_ATTR, {}).get("train", {}).get("steps", 0))
    return study_fidelity(study.study_name, trials, study.user_attrs, final_step,
                          audit_reports(trials, store.audit_rows()))


# ----------------------------------------------------------------------------------------------------
# Stale trials on journal storage (RDB storages have Optuna's heartbeat for this)

def journal_heartbeat(study: optuna.Study, trial_id: int) -> Heartbeat:
    """Beats for a running trial on journal storage (RDB storages have Optuna's heartbeat thread) for the
    trial's whole RUNNING life, claim waits included; ends once the trial is finished."""
    def beat() -> bool:
        try:
            study._storage.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
            return True
        except optuna.exceptions.UpdateFinishedTrialError:
            return False

    return Heartbeat(beat)


def last_beat(t: FrozenTrial) -> float:
    """When a running trial last showed life: its own heartbeat or its start, whichever is later (a retry
    inherits its dead predecessor's system attributes, heartbeat included, which must not count against it)."""
    start = t.datetime_start.timestamp() if t.datetime_start else time.time()
    return max(float(t.system_attrs.get(HEARTBEAT_ATTR) or 0.0), start)


def sweep_stale_journal_trials(study: optuna.Study, spare: int | None = None) -> list[int]:
    """Fail RUNNING trials whose last beat is older than the grace period and enqueue their retry; `spare` is
    the calling worker's own trial, which it never fails."""
    failed = []
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t._trial_id == spare or now - last_beat(t) <= grace_period():
            continue
        try:
            if study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                failed.append(t.number)
                optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study._storage.get_trial(t._trial_id))
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker failed it first
    return failed


class TrialTakenOver(Exception):
    """This worker's trial was failed under it (its heartbeat was judged stale) and retried elsewhere."""


# ----------------------------------------------------------------------------------------------------
# The objective

@dataclass
class SearchRun:
    plan: StudyPlan
    spec: StorageSpec
    study: optuna.Study
    store: Store
    data: TokenData
    reporter: RunReporter
    target: int
    checkpoint_root: Path
    pruner: Pruner | None = None
    taken_over: int = 0  # trials failed under this worker by another's sweep

    @property
    def n_layers(self) -> int:
        return self.plan.model.n_layers

    def objective(self, trial: optuna.Trial) -> float | tuple[float, float]:
        if self.spec.kind != "journal":  # RDB: Optuna's own heartbeat thread covers the trial
            return self._objective(trial)
        with journal_heartbeat(self.study, trial._trial_id):
            sweep_stale_journal_trials(self.study, spare=trial._trial_id)
            return self._objective(trial)

    def _objective(self, trial: optuna.Trial) -> float | tuple[float, float]:
        proposed, reuse_map = propose_map(trial, self.n_layers, self.plan.space.search.max_reuse,
                                          self.plan.budget.max_layer_runs(self.plan.model))
        key = format_reuse_map(reuse_map)
        ratio = flops_ratio(self.plan.model, reuse_map_schedule(reuse_map))
        assert self.plan.budget.allows(ratio), (reuse_map, ratio)
        trial.set_user_attr("reuse_map", reuse_map)
        trial.set_user_attr("map_key", key)
        trial.set_user_attr("flops_ratio", ratio)
        trial.set_user_attr("params", param_count(self.plan.model))
        if reuse_map != proposed:
            trial.set_user_attr("proposed_map", proposed)

        earlier = self._result_for(key, trial.number)
        if earlier is None:
            earlier = self._claim_or_wait(key, trial.number)
        if earlier is not None:
            return self._reuse(trial, earlier)
        return self._train(trial, reuse_map, key, ratio)

    def _result_for(self, key: str, exclude: int) -> FrozenTrial | None:
        for t in self.study.get_trials(deepcopy=False):
            if t.number != exclude and t.user_attrs.get("map_key") == key and has_result(t) \
                    and "reused_from" not in t.user_attrs:
                return t
        return None

    def _claim_or_wait(self, key: str, number: int) -> FrozenTrial | None:
        """Claim the map for this trial; if another live trial trains it, wait for its result instead."""
        waited = False
        while True:
            holder = self.store.claim(key, number)
            if holder == number:
                return None
            held = self._trial_by_number(holder)
            if held is None or has_result(held):
                result = self._result_for(key, number)
                if result is not None:
                    return result
            if held is None or (held.state.is_finished() and not has_result(held)):
                if self.store.take_over(key, holder, number):  # the holder died or was interrupted
                    return None
                continue
            if not waited:
                self.reporter.message(f"map {key} is being trained by trial {holder}; waiting for its result")
                waited = True
            time.sleep(min(2.0, heartbeat_interval()))
            self.sweep_stale(spare=self._trial_by_number(number)._trial_id)

    def sweep_stale(self, spare: int | None = None) -> None:
        """Fail (and queue again) the trials of dead workers; never the trial `spare` of this worker."""
        if self.spec.kind == "journal":
            sweep_stale_journal_trials(self.study, spare=spare)
        else:
            optuna.storages.fail_stale_trials(self.study)

    def _trial_by_number(self, number: int) -> FrozenTrial | None:
        return next((t for t in self.study.get_trials(deepcopy=False) if t.number == number), None)

    def _failed_under_me(self, trial: optuna.Trial) -> bool:
        """Another worker's sweep judged this trial stale and failed it (its retry is queued)."""
        return self.study._storage.get_trial(trial._trial_id).state.is_finished()

    def _taken_over(self, trial: optuna.Trial) -> TrialTakenOver:
        self.taken_over += 1
        return TrialTakenOver(f"trial {trial.number} was failed by another worker's stale-trial sweep")

    def _recover(self, trial: optuna.Trial, result: TrainResult, decision: dict[str, Any], key: str,
                 ratio: float) -> None:
        """Keep the result of a trial failed under this worker: a new finished trial with the same map, marked
        `recovered_from`, which takes the map's claim so that the queued retry reuses it instead of training."""
        attrs = dict(self.study._storage.get_trial(trial._trial_id).user_attrs)
        attrs |= self._result_attrs(result, decision) | {"recovered_from": trial.number}
        if result.status == "diverged":
            state, values = TrialState.FAIL, None
        elif decision:
            state, values = TrialState.PRUNED, None
        else:
            state = TrialState.COMPLETE
            values = self._values(result.val_ppl, ratio)
            values = [values] if isinstance(values, float) else list(values)
        self.study.add_trial(optuna.trial.create_trial(state=state, values=values, params=trial.params,
                                                       distributions=trial.distributions, user_attrs=attrs))
        recovered = max(t.number for t in self.study.get_trials(deepcopy=False)
                        if t.user_attrs.get("recovered_from") == trial.number)
        self.store.take_over(key, trial.number, recovered)
        self.reporter.message(f"trial {trial.number} was failed under this worker; its result is kept as trial "
                              f"{recovered}")

    def _reuse(self, trial: optuna.Trial, earlier: FrozenTrial) -> float | tuple[float, float]:
        if self._failed_under_me(trial):
            raise self._taken_over(trial)
        for k in ("val_loss", "val_ppl", "val_bpb", "status", "reason", "pruned_at_step", "curve"):
            if k in earlier.user_attrs:
                trial.set_user_attr(k, earlier.user_attrs[k])
        trial.set_user_attr("reused_from", earlier.number)
        trial.set_user_attr("steps", 0)
        if earlier.state == TrialState.PRUNED:
            raise optuna.TrialPruned(f"map already pruned in trial {earlier.number}")
        if earlier.state == TrialState.FAIL:
            raise TrialDiverged(f"map already diverged in trial {earlier.number}")
        return self._values(earlier.user_attrs["val_ppl"], earlier.user_attrs["flops_ratio"])

    def _values(self, val_ppl: float, ratio: float) -> float | tuple[float, float]:
        return val_ppl if self.plan.space.search.objective == "ppl" else (val_ppl, ratio)

    def _train(self, trial: optuna.Trial, reuse_map: list[int], key: str, ratio: float) -> float | tuple[float, float]:
        steps = self.plan.space.train.steps
        self.reporter.trial_started(trial.number, reuse_map, steps)
        decision: dict[str, Any] = {}

        def on_eval(point: EvalPoint) -> bool:
            self.store.add_curve_point(CurvePoint(trial.number, point.step, point.val_loss, ratio, key), point.tokens)
            if self.pruner is None:
                return False
            verdict = self.pruner.decide(trial, point.step, point.val_loss, ratio, key)
            if verdict is not None:
                decision.update(step=verdict.step, reason=verdict.reason, dominated_by=list(verdict.dominated_by))
                return True
            return False

        checkpoint = self.checkpoint_root / f"{key.replace(',', '-')}.pt" if self.plan.space.train.checkpoint_every else None
        train_cfg = dataclasses.replace(self.plan.space.train, dtype=self.plan.dtype)
        try:
            result = train_proxy(self.plan.model, reuse_map_schedule(reuse_map), self.data, train_cfg,
                                 on_eval=on_eval, on_step=self.reporter.step, checkpoint_path=checkpoint)
        except KeyboardInterrupt:
            # Retry this map on resume (Optuna marks the trial FAIL); then stop the study.
            trial.set_user_attr("reason", "interrupted (Ctrl-C)")
            self.study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            raise
        if self._failed_under_me(trial):
            self._recover(trial, result, decision, key, ratio)
            if checkpoint is not None:
                checkpoint.unlink(missing_ok=True)
            raise self._taken_over(trial)
        self._record(trial, result, decision)
        if checkpoint is not None:  # the trial is over, whatever its outcome
            checkpoint.unlink(missing_ok=True)
        if result.status == "diverged":
            raise TrialDiverged(result.reason)
        if decision:
            raise optuna.TrialPruned(decision["reason"])
        return self._values(result.val_ppl, ratio)

    def _result_attrs(self, result: TrainResult, decision: dict[str, Any]) -> dict[str, Any]:
        attrs = {
            "status": "pruned" if decision else result.status,
            "reason": decision.get("reason", result.reason),
            "steps": result.steps - result.resumed_from_step,
            "resumed_from_step": result.resumed_from_step,
            "val_loss": finite_or_none(result.val_loss), "val_ppl": finite_or_none(result.val_ppl),
            "val_bpb": finite_or_none(result.val_bpb),
            "train_seconds": result.train_seconds, "tokens_per_second": result.tokens_per_second,
            "curve": [[p.step, p.val_loss] for p in result.curve],
        }
        if decision:
            attrs["pruned_at_step"] = decision["step"]
            attrs["steps_saved"] = self.plan.space.train.steps - decision["step"]
        return attrs

    def _record(self, trial: optuna.Trial, result: TrainResult, decision: dict[str, Any]) -> None:
        for k, v in self._result_attrs(result, decision).items():
            trial.set_user_attr(k, v)


# ----------------------------------------------------------------------------------------------------
# Running a study

def open_study(spec: StorageSpec, name: str) -> optuna.Study:
    """An existing study, read-only use; a one-line error if it is not there (nothing is created)."""
    if not spec.exists():
        raise UserInputError(f"no study {name!r}: storage {spec.masked} does not exist yet")
    storage = open_storage(spec, heartbeat=False)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
        hint = f"; studies there: {', '.join(names[:10])}" if names else "; the storage holds no study"
        raise UserInputError(f"no study {name!r} in {spec.masked}{hint}") from None


def default_study(storage: str | None = None) -> tuple[str, str]:
    """(name, why) of the study a command without --study reads: the storage's only study, or else its most
    recently active one."""
    spec = parse_storage(storage)
    if not spec.exists():
        raise UserInputError(f"storage {spec.masked} does not exist yet; run a study first (ilr-search run --budget 1.5x)")
    st = open_storage(spec, heartbeat=False)
    summaries = optuna.get_all_study_summaries(st, include_best_trial=False)
    if not summaries:
        raise UserInputError(f"storage {spec.masked} holds no study; run one first (ilr-search run --budget 1.5x)")
    if len(summaries) == 1:
        return summaries[0].study_name, f"the only study in {spec.masked}"

    def last_active(summary: optuna.study.StudySummary) -> float:
        trials = st.get_all_trials(summary._study_id, deepcopy=False)
        times = [t.datetime_complete or t.datetime_start for t in trials if t.datetime_complete or t.datetime_start]
        return max(times).timestamp() if times else 0.0

    name = max(summaries, key=last_active).study_name
    return name, f"the most recently active of {len(summaries)} studies in {spec.masked}; --study chooses another"


def _adopt_stored_dtype(spec: StorageSpec, plan: StudyPlan) -> StudyPlan:
    """`--dtype auto` resumes a study in the dtype it was made with (made on a GPU in bf16, resumed on a CPU)."""
    if not spec.exists():
        return plan
    try:
        study = optuna.load_study(study_name=plan.name, storage=open_storage(spec, heartbeat=False))
    except KeyError:
        return plan
    stored = study.user_attrs.get(CONFIG_ATTR, {}).get("train", {}).get("dtype")
    if stored is None or stored == plan.dtype:
        return plan
    config = plan.config | {"train": plan.config["train"] | {"dtype": stored}}
    return dataclasses.replace(plan, dtype=stored, config=config)


def search_differences(settings: dict[str, Any], space: SpaceConfig, sampler_flag: str | None,
                       pruner_flag: str | None) -> list[str]:
    """How this run's sampler and pruner settings, from flags or the space's TOML alike, differ from a stored
    study's. A study stored before calibrated pruning existed keeps its rule unless a flag asks for another."""
    diffs = []
    stored_sampler = settings.get("sampler", {}).get("requested")
    if stored_sampler is not None and space.search.sampler != stored_sampler:
        diffs.append(f"sampler: study has {stored_sampler!r}, this run asks for {space.search.sampler!r}")
    if "pruner" not in settings:
        return diffs
    stored = PrunerSettings.from_dict(settings["pruner"])
    wanted = pruner_settings(space)
    if "min_spearman" not in settings["pruner"]:  # a study from before calibration: only a flag is checked
        if pruner_flag is not None and pruner_flag != stored.name:
            diffs.append(f"pruner: study has {stored.name!r}, this run asks for {pruner_flag!r}")
        return diffs
    for field in ("name", "eta", "epsilon", "warmup", "calibration_maps", "min_spearman"):
        a, b = getattr(stored, field), getattr(wanted, field)
        if a != b:
            key = "pruner" if field == "name" else f"prune_{field}"
            diffs.append(f"{key}: study has {a!r}, this run asks for {b!r}")
    return diffs


def _check_resume(spec: StorageSpec, plan: StudyPlan, sampler: str | None, pruner: str | None) -> dict[str, Any] | None:
    """The stored settings of an existing study of that name (None if new); refuses incompatible resumes."""
    if not spec.exists():
        return None
    storage = open_storage(spec, heartbeat=False)
    try:
        study = optuna.load_study(study_name=plan.name, storage=storage)
    except KeyError:
        return None
    stored = study.user_attrs.get(CONFIG_ATTR)
    for _ in range(50):  # another worker may have just created the study and not yet stored its configuration
        if stored is not None or study.trials:
            break
        time.sleep(0.2)
        stored = study.user_attrs.get(CONFIG_ATTR)
    if stored is None:
        raise UserInputError(f"study {plan.name!r} in {spec.masked} was not made by ilr-search; choose another --study")
    diffs = config_differences(stored, _canonical(plan.config))
    settings = study.user_attrs.get(SAMPLER_ATTR, {})
    diffs += search_differences(settings, plan.space, sampler, pruner)
    if diffs:
        raise UserInputError(f"cannot resume study {plan.name!r} with another configuration ({'; '.join(diffs)}); "
                             "rerun with the study's settings or choose a new --study")
    return settings


def run_study(space: SpaceConfig, budget: str, study_name: str | None = None, storage: str | None = None,
              n_trials: int | None = None, timeout: float | None = None, sampler: str | None = None,
              pruner: str | None = None, reporter: RunReporter | None = None,
              checkpoint_dir: str | Path | None = None, enqueue_maps: list[list[int]] | None = None,
              reference_share: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """Run (or resume) a study until it has `n_trials` finished trials; returns the `run --json` summary.

    `sampler`/`pruner` given here override the space's and must match a resumed study's. `enqueue_maps` are
    tried first, after the baseline and the paper-inspired maps (over-budget maps are repaired). A full disk
    ends the run with a StorageFullError; finished trials stay in the storage.
    """
    with disk_full_is_reported():
        return _run_study(space, budget, study_name, storage, n_trials, timeout, sampler, pruner, reporter,
                          checkpoint_dir, enqueue_maps, reference_share)


@dataclass
class PreparedStudy:
    """A study checked, created (or loaded) with its settings and first maps, and its tokens at hand."""
    space: SpaceConfig
    spec: StorageSpec
    plan: StudyPlan
    study: optuna.Study
    settings: dict[str, Any]
    data: TokenData


def prepare_study(space: SpaceConfig, budget: str, study_name: str | None = None, storage: str | None = None,
                  n_trials: int | None = None, timeout: float | None = None, sampler: str | None = None,
                  pruner: str | None = None, enqueue_maps: list[list[int]] | None = None) -> PreparedStudy:
    """Everything `run` does before its first trial: check the input (nothing on disk changes when it is bad),
    tokenize (cached), create or load the study, store its settings and enqueue the first maps. Workers
    started after it find all of this in place."""
    spec = parse_storage(storage)
    if n_trials is not None and n_trials <= 0:
        raise UserInputError(f"--n-trials must be a positive number of trials, got {n_trials}")
    if timeout is not None and timeout <= 0:
        raise UserInputError(f"--timeout must be a positive number of seconds, got {timeout}")
    search = dataclasses.replace(space.search, **{k: v for k, v in (("sampler", sampler), ("pruner", pruner)) if v})
    space = dataclasses.replace(space, search=search)
    validate_space(space)
    plan = plan_study(space, budget, study_name)
    if space.train.dtype == "auto":
        plan = _adopt_stored_dtype(spec, plan)
    stored_settings = _check_resume(spec, plan, sampler, pruner)

    data = load_space_tokens(space)
    storage_obj = open_storage(spec)
    directions = ["minimize"] if space.search.objective == "ppl" else ["minimize", "minimize"]
    settings = stored_settings or {
        "sampler": sampler_settings(space.search.sampler, space.train.seed, plan.model.n_layers, space.search.max_reuse),
        "pruner": pruner_settings(space).to_dict(),
    }
    pruning = PrunerSettings.from_dict(settings["pruner"])
    optuna_pruner = optuna.pruners.MedianPruner(n_startup_trials=pruning.warmup, n_warmup_steps=0) \
        if pruning.name == "median" else optuna.pruners.NopPruner()
    study = optuna.create_study(study_name=plan.name, storage=storage_obj, directions=directions,
                                sampler=optuna.samplers.RandomSampler(), pruner=optuna_pruner, load_if_exists=True)
    if spec.kind == "journal":  # trials of killed workers: failed and queued again (RDB: Optuna's heartbeat)
        sweep_stale_journal_trials(study)
    else:
        optuna.storages.fail_stale_trials(study)
    if CONFIG_ATTR not in study.user_attrs:
        study.set_user_attr(SAMPLER_ATTR, settings)  # first: a worker that sees the configuration sees these too
        study.set_user_attr(CONFIG_ATTR, _canonical(plan.config))
        study.set_metric_names(["val_ppl"] if len(directions) == 1 else ["val_ppl", "flops_ratio"])
    settings = study.user_attrs[SAMPLER_ATTR]

    max_runs = plan.budget.max_layer_runs(plan.model)
    first = seed_maps(plan.model.n_layers, space.search.max_reuse, max_runs) if space.search.enqueue_paper_maps else []
    for m in first + [list(m) for m in enqueue_maps or []]:
        study.enqueue_trial({f"r{i}": r for i, r in enumerate(m)}, skip_if_exists=True)
    open_store(spec, plan.name, storage=storage_obj)  # the project's tables too, before any worker races to create them
    return PreparedStudy(space, spec, plan, study, settings, data)


def _run_study(space: SpaceConfig, budget: str, study_name: str | None = None, storage: str | None = None,
               n_trials: int | None = None, timeout: float | None = None, sampler: str | None = None,
               pruner: str | None = None, reporter: RunReporter | None = None,
               checkpoint_dir: str | Path | None = None, enqueue_maps: list[list[int]] | None = None,
               reference_share: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    reporter = reporter or RunReporter()
    prepared = prepare_study(space, budget, study_name, storage, n_trials, timeout, sampler, pruner, enqueue_maps)
    space, spec, plan, study, settings, data = (prepared.space, prepared.spec, prepared.plan, prepared.study,
                                                prepared.settings, prepared.data)
    store = open_store(spec, plan.name, storage=study._storage)
    # Worker k of the study (k = 0 for the first run, 1 for a resume or a second process...) samples from
    # stream k of the study's seed: reproducible, and concurrent workers do not propose the same maps.
    study.sampler = build_sampler(settings["sampler"], plan.model.n_layers, store.register_worker())
    target = n_trials or space.search.n_trials
    run = SearchRun(plan, spec, study, store, data, reporter, target,
                    Path(checkpoint_dir or "studies/checkpoints") / _safe_name(plan.name),
                    pruner=build_pruner(PrunerSettings.from_dict(settings["pruner"]), store, space.train.steps))
    finished = _n_finished(study)
    reporter.study_started(plan.name, target, finished)
    interrupted = False
    if finished < target:
        def after_trial(st: optuna.Study, ft: FrozenTrial) -> None:
            trials = st.get_trials(deepcopy=False)
            front = save_current_front(store, trials)
            n_done = sum(has_result(t) for t in trials)
            reporter.trial_finished(trial_row(ft), front, n_done)
            if n_done >= target:  # other workers count too
                st.stop()

        started, told = time.monotonic(), False
        while not interrupted:
            seen = run.taken_over
            left = None if timeout is None else timeout - (time.monotonic() - started)
            trials = study.get_trials(deepcopy=False)
            finished = sum(has_result(t) for t in trials)
            running = sum(t.state == TrialState.RUNNING for t in trials)
            if (left is not None and left <= 0) or finished >= target:
                break
            if finished + running >= target:
                # Trials in flight (other workers', or a killed worker's until its heartbeat goes stale)
                # would reach the target: wait for them rather than overshoot it; a failed one is retried.
                if not told:
                    reporter.message(f"waiting for {running} running trial(s) to reach {target}")
                    told = True
                time.sleep(min(2.0, heartbeat_interval()))
                run.sweep_stale()
                continue
            try:
                study.optimize(run.objective, n_trials=1, timeout=left, catch=(TrialDiverged,),
                               callbacks=[after_trial], gc_after_trial=False, show_progress_bar=False)
            except KeyboardInterrupt:
                interrupted = True
            except (TrialTakenOver, ValueError):
                # A trial failed under this worker (Optuna refuses to tell it): its result, if any, was kept
                # as a recovered trial; this worker goes on with the study.
                if run.taken_over == seen:
                    raise
    if not interrupted and _n_finished(study) >= target:
        train_references(run, reference_share)
    save_current_front(store, study.get_trials(deepcopy=False))
    for folder in (run.checkpoint_root, *run.checkpoint_root.parents[:2]):  # checkpoints go when their trials end
        try:
            folder.rmdir()
        except OSError:  # not empty (a trial of another worker), or not there
            break
    summary = summarize(study, spec, store)
    study.set_user_attr(FIDELITY_ATTR, summary["fidelity"])
    summary["interrupted"] = interrupted
    summary["sampler"] = settings["sampler"]
    summary["pruner"] = PrunerSettings.from_dict(settings["pruner"]).name
    return summary


def _disk_full_cause(e: BaseException | None) -> BaseException | None:
    """The ENOSPC / `database or disk is full` error behind `e`, following the chain Optuna and SQLAlchemy wrap."""
    while e is not None:
        if getattr(e, "errno", None) == errno.ENOSPC or "disk is full" in str(e) or "No space left" in str(e):
            return e
        e = e.__cause__ or e.__context__
    return None


@contextmanager
def disk_full_is_reported() -> Iterator[None]:
    try:
        yield
    except (optuna.exceptions.StorageInternalError, sa.exc.SQLAlchemyError, OSError) as e:
        cause = _disk_full_cause(e)
        if cause is None:
            raise
        text = str(getattr(cause, "orig", None) or cause).splitlines()
        raise StorageFullError(f"the disk holding the storage or checkpoints is full ({text[0] if text else 'ENOSPC'}); "
                               "free space, then rerun the same command to resume: finished trials are kept") from None


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _n_finished(study: optuna.Study) -> int:
    """Trials that produced a result for their map: complete, pruned, or diverged (a study of diverging
    proxies still ends)."""
    return sum(has_result(t) for t in study.get_trials(deepcopy=False))


def save_current_front(store: Store, trials: list[FrozenTrial]) -> list[dict[str, Any]]:
    front = study_front(trials)
    store.save_front(sum(t.state == TrialState.COMPLETE for t in trials), front)
    return front


def reference_runs(plan: StudyPlan, trials: list[FrozenTrial]) -> list[tuple[str, list[int], int, list[int] | None]]:
    """(name, schedule, seed, reuse map) of the study's reference runs, trained outside the sampler's view: the
    baseline at extra seeds (its seed-to-seed noise band), the best recurrent map at a second seed (is its
    place real?), and block recurrence K where the budget allows it."""
    n, seed = plan.model.n_layers, plan.space.train.seed
    runs: list[tuple[str, list[int], int, list[int] | None]] = [
        (f"baseline_seed{seed + i}", list(range(n)), seed + i, [1] * n)
        for i in range(1, plan.space.search.noise_seeds + 1)]
    best = best_recurrent(trials) if plan.space.search.noise_seeds else None
    if best is not None:
        runs.append(("second_seed", reuse_map_schedule(best["reuse_map"]), seed + 1, best["reuse_map"]))
    if "block" in plan.space.search.families:
        runs += [(f"block{k}", block_schedule(n, k), seed, None) for k in range(2, plan.space.search.max_reuse + 1)
                 if plan.budget.allows(flops_ratio(plan.model, block_schedule(n, k)))]
    return runs


def train_references(run: SearchRun, share: tuple[int, int] = (0, 1)) -> None:
    """Train the missing reference runs once per study and store them in the study's attributes (the second
    seed is trained again when the best recurrent map changed). With `share` (k, n), worker k of n trains
    the k-th, (k+n)-th, ... of them; whoever runs `run` last trains what is still missing."""
    plan, study = run.plan, run.study
    k, n = share
    for index, (name, schedule, seed, reuse_map) in enumerate(reference_runs(plan, study.get_trials(deepcopy=False))):
        if index % n != k:
            continue
        stored = study.user_attrs.get(f"{REFERENCE_PREFIX}{name}")
        if stored is not None and stored.get("schedule") == schedule:
            continue
        run.reporter.message(f"training reference {name}" + (f" (map {format_reuse_map(reuse_map)}, seed {seed})"
                                                              if name == "second_seed" else ""))
        train_cfg = dataclasses.replace(plan.space.train, dtype=plan.dtype, seed=seed)
        result = train_proxy(plan.model, schedule, run.data, train_cfg, on_step=run.reporter.step)
        study.set_user_attr(f"{REFERENCE_PREFIX}{name}", {
            "schedule": schedule, "seed": seed, "flops_ratio": flops_ratio(plan.model, schedule),
            "reuse_map": reuse_map, "val_ppl": finite_or_none(result.val_ppl),
            "val_bpb": finite_or_none(result.val_bpb), "status": result.status, "steps": result.steps,
            "curve": [[p.step, p.val_loss] for p in result.curve]})


def list_studies(storage: str | None = None) -> list[dict[str, Any]]:
    spec = parse_storage(storage)
    if not spec.exists():
        return []
    st = open_storage(spec, heartbeat=False)
    rows = []
    for summary in optuna.get_all_study_summaries(st, include_best_trial=False):
        study = optuna.load_study(study_name=summary.study_name, storage=st)
        config = study.user_attrs.get(CONFIG_ATTR, {})
        trials = study.get_trials(deepcopy=False)
        ppls = [t.user_attrs["val_ppl"] for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("val_ppl")]
        rows.append({"study": summary.study_name, "n_trials": len(trials),
                     "n_complete": sum(t.state == TrialState.COMPLETE for t in trials),
                     "budget": config.get("budget", {}).get("text"), "layers": config.get("model", {}).get("n_layers"),
                     "best_val_ppl": min(ppls) if ppls else None})
    return rows


def list_trials(study_name: str, storage: str | None = None) -> list[dict[str, Any]]:
    return trials_report(study_name, storage)["trials"]


def trials_report(study_name: str, storage: str | None = None) -> dict[str, Any]:
    """`ilr-search trials`: every trial, and the study's fidelity (how far its proxy can be trusted)."""
    spec = parse_storage(storage)
    study = open_study(spec, study_name)
    trials = study.get_trials(deepcopy=False)
    return {"study": study_name, "trials": [trial_row(t) for t in trials],
            "fidelity": fidelity_of(study, open_store(spec, study_name, read_only=True), trials)}

