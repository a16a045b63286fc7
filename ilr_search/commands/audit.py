"""`ilr-search audit`: retrain chosen maps of a study `factor` times longer, everything else equal, and say how
far the study's proxy ranking holds.

The runs are stored in the study's own database (table ilr_audit, curves included), so the audit resumes:
the same command skips what is done and takes over what a dead worker left. Each (factor, seed, map) is
claimed before it is trained, as trials claim maps, so concurrent audit workers never train one twice.
"""

from __future__ import annotations

import math
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from ilr_search.config import AuditSettings, DataConfig, ModelConfig, SearchConfig, SpaceConfig, TrainConfig
from ilr_search.data.tokenizers import check_vocab, model_config
from ilr_search.data.tokens import load_space_tokens
from ilr_search.errors import UserInputError
from ilr_search.analysis.fidelity import audit_report
from ilr_search.knobs import with_knobs
from ilr_search.analysis.results import Curves, curves_by_trial, is_baseline_key, study_front, trained_trials
from ilr_search.search.plan import CONFIG_ATTR, RESULT_TRAIN_FIELDS, safe_name
from ilr_search.search.progress import RunReporter
from ilr_search.search.race import (FINAL_STATES, ClaimedRun, fusable, is_finished, longer_train_config, run_checkpoint,
                                    train_run, train_runs_fused)
from ilr_search.search.run import check_fuse, disk_full_is_reported
from ilr_search.search.studies import open_study
from ilr_search.storage import study_storage, AuditJob, Store, grace_period, heartbeat_interval, open_store, parse_storage


AUTO_MAPS = 8  # the default selection aims at this many maps with a complete proxy result
NEAR_FRONT_PRUNED = 2


def check_settings(settings: AuditSettings) -> tuple[str, int]:
    """(kind, K) of the map selection; bad values raise before anything is opened."""
    if not (isinstance(settings.factor, (int, float)) and math.isfinite(settings.factor)) or settings.factor < 1:
        raise UserInputError(f"--factor must be at least 1 (the audit retrains maps factor x longer), got {settings.factor}")
    if settings.seeds < 1:
        raise UserInputError(f"--seeds must be at least 1, got {settings.seeds}")
    text = settings.maps.strip()
    if text in ("auto", "front", "all"):
        return text, 0
    if text.startswith("top:"):
        try:
            k = int(text[4:])
        except ValueError:
            k = 0
        if k >= 1:
            return "top", k
    raise UserInputError(f"unknown --maps {settings.maps!r}; use auto, front, top:K (e.g. top:5) or all")


def select_maps(trials: list[FrozenTrial], curves: Curves, kind: str, k: int, seed: int) -> list[FrozenTrial]:
    """The trials whose maps the audit retrains, in a fixed order (the same study gives the same choice).

    - auto: the proxy front, the baseline, the best pruned maps near the front (smallest lead of a no-dearer
      map at their pruning rung), and random complete maps until AUTO_MAPS maps have a complete proxy result;
    - front: the proxy front; top:K: the K best complete maps by proxy perplexity; all: every trained map.
    """
    trained = trained_trials(trials)
    complete = sorted((t for t in trained if t.state == TrialState.COMPLETE and t.user_attrs.get("val_ppl")),
                      key=lambda t: (t.user_attrs["val_ppl"], t.number))
    front_numbers = [p["trial"] for p in study_front(trials)]
    by_number = {t.number: t for t in trained}
    if kind == "all":
        return sorted(trained, key=lambda t: t.number)
    if kind == "top":
        return complete[:k]
    chosen = [by_number[n] for n in front_numbers]
    if kind == "front":
        return chosen
    baseline = next((t for t in complete if is_baseline_key(t.user_attrs["map_key"])), None)
    if baseline is not None and baseline not in chosen:
        chosen.append(baseline)
    chosen += _pruned_near_front(trained, curves)[:NEAR_FRONT_PRUNED]
    rest = [t for t in complete if t not in chosen]
    random.Random(seed).shuffle(rest)
    while rest and sum(t.state == TrialState.COMPLETE for t in chosen) < AUTO_MAPS:
        chosen.append(rest.pop())
    return chosen


def _pruned_near_front(trained: list[FrozenTrial], curves: Curves) -> list[FrozenTrial]:
    """Pruned trials ordered by how close they were, at their pruning rung, to the best loss of a no-dearer map."""
    curves = {t.number: curves.get(t.number, {}) for t in trained}
    scored = []
    for t in trained:
        step = t.user_attrs.get("pruned_at_step")
        if t.state != TrialState.PRUNED or step not in curves[t.number]:
            continue
        mine = curves[t.number][step]
        rivals = [curves[o.number][step] for o in trained if o is not t and step in curves[o.number]
                  and o.user_attrs["flops_ratio"] <= t.user_attrs["flops_ratio"]]
        gap = mine - min(rivals) if rivals else 0.0
        scored.append((gap, t.number, t))
    return [t for _, _, t in sorted(scored, key=lambda x: x[:2])]


def stored_space(study: optuna.Study, steps: int) -> SpaceConfig:
    """The study's own configuration (as stored at creation), with `steps` training steps."""
    config = study.user_attrs[CONFIG_ATTR]
    train = {k: v for k, v in config["train"].items() if k in RESULT_TRAIN_FIELDS}
    train |= {"eval_fractions": tuple(train["eval_fractions"]), "steps": steps,
              "dtype": config["train"].get("dtype", "fp32"), "checkpoint_every": max(1, steps // 8)}
    search = config.get("search", {})
    return SpaceConfig(model=ModelConfig(**config["model"]), data=DataConfig(**config["data"]),
                       train=TrainConfig(**train),
                       search=SearchConfig(max_reuse=search.get("max_reuse", 4), knobs=tuple(search.get("knobs", ()))))


def run_audit(study_name: str, storage: str | None = None, settings: AuditSettings = AuditSettings(),
              reporter: RunReporter | None = None, checkpoint_dir: str | Path | None = None,
              fuse: int = 1) -> dict[str, Any]:
    """Retrain the chosen maps at settings.factor x the proxy's steps (settings.seeds seeds each, the study's
    seed first), store every run, and return the audit report (`audit --json`). `fuse` K > 1: up to K runs of
    one model train at once, fused (how the audit runs, not what it is: its results are the same)."""
    with disk_full_is_reported():
        return _run_audit(study_name, storage, settings, reporter or RunReporter(), checkpoint_dir, fuse)


def _run_audit(study_name: str, storage: str | None, settings: AuditSettings, reporter: RunReporter,
               checkpoint_dir: str | Path | None, fuse: int = 1) -> dict[str, Any]:
    check_fuse(fuse)
    kind, k = check_settings(settings)
    spec = parse_storage(storage)
    study = open_study(spec, study_name)
    if CONFIG_ATTR not in study.user_attrs:
        raise UserInputError(f"study {study_name!r} was not made by ilr-search; nothing to audit")
    trials = study.get_trials(deepcopy=False)
    if not any(t.state == TrialState.COMPLETE for t in trials):
        raise UserInputError(f"study {study_name!r} has no complete trial yet; run it first "
                             f"(ilr-search run ... --study {study_name})")
    proxy_steps = int(study.user_attrs[CONFIG_ATTR]["train"]["steps"])
    steps = max(1, round(settings.factor * proxy_steps))
    space = stored_space(study, steps)
    init_depth = int(study.user_attrs[CONFIG_ATTR]["search"].get("init_depth", 0))  # for the depth_init knob
    base_seed = space.train.seed
    curves = curves_by_trial(open_store(spec, study_name, read_only=True, storage=study_storage(study)).curve_points())
    chosen = select_maps(trials, curves, kind, k, base_seed)
    if not chosen:
        raise UserInputError(f"--maps {settings.maps} selects no map of study {study_name!r}")
    jobs = [(AuditJob(settings.factor_key, base_seed + s, t.user_attrs["map_key"]), t) for t in chosen
            for s in range(settings.seeds)]

    store = open_store(spec, study_name, storage=study_storage(study))
    worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    checkpoints = Path(checkpoint_dir or "studies/checkpoints") / safe_name(study_name) / "audit"
    reporter.study_started(f"{study_name} audit at {settings.factor_key}x ({steps} steps)", len(jobs),
                           _n_done(store, jobs))
    data = None
    trained_here = 0
    waiting_said = False
    while True:
        pending = [(job, t) for job, t in jobs if not is_finished(store, job)]
        if not pending:
            break
        progressed = False
        while pending:
            claimed, pending = _claim_group(store, pending, worker, space, steps, checkpoints, init_depth, fuse)
            if not claimed:
                break
            if data is None:
                data = load_space_tokens(space)
            for run in claimed:
                check_vocab(run.model, data.vocab_size)
            if len(claimed) == 1:
                run = claimed[0]
                train_run(store, run.job, worker, run.reuse_map, run.model, run.train_cfg, data, reporter,
                          run.checkpoint, run.number)
            else:
                reporter.message("audit: " + "; ".join(f"map {r.job.map_key}, seed {r.job.seed}" for r in claimed)
                                 + " (fused)")
                train_runs_fused(store, claimed, worker, data, reporter)
            trained_here += len(claimed)
            progressed = True
            for run in claimed:
                reporter.trial_finished(_row(store, run.job, run.trial), [], _n_done(store, jobs))
        if not progressed:  # the rest is held by live workers: wait for them (or for them to go stale)
            if not waiting_said:
                reporter.message("the remaining audit runs are being trained by other workers; waiting")
                waiting_said = True
            time.sleep(min(2.0, heartbeat_interval()))
    for folder in (checkpoints, checkpoints.parent):
        try:
            folder.rmdir()
        except OSError:
            break
    report = audit_report(trials, store.audit_rows(), settings.factor_key)
    if report is None:
        raise UserInputError(f"no audited map of study {study_name!r} finished: every run diverged at "
                             f"{settings.factor_key}x (see the study's audit rows)")
    return {"study": study_name, "factor": settings.factor, "steps": steps, "proxy_steps": proxy_steps,
            "maps_spec": settings.maps, "seeds": settings.seeds, "runs": len(jobs), "trained_by_this_worker": trained_here,
            **{k: v for k, v in report.to_dict().items() if k not in ("factor", "steps")}}


def _n_done(store: Store, jobs: list[tuple[AuditJob, FrozenTrial]]) -> int:
    done = {r.job for r in store.audit_rows() if r.state in FINAL_STATES}
    return sum(job in done for job, _ in jobs)


def _row(store: Store, job: AuditJob, t: FrozenTrial) -> dict[str, Any]:
    row = next(r for r in store.audit_rows() if r.job == job)
    return {"trial": t.number, "state": "COMPLETE" if row.state == "complete" else "FAIL",
            "reuse_map": t.user_attrs["reuse_map"], "flops_ratio": row.flops_ratio, "val_ppl": row.val_ppl,
            "reason": row.reason or f"seed {job.seed}, proxy ppl {t.user_attrs.get('val_ppl')}"}


@dataclass(frozen=True)
class AuditRun(ClaimedRun):
    """A claimed audit run, with the trial whose map it retrains."""
    trial: FrozenTrial | None = None


def _claim_group(store: Store, pending: list[tuple[AuditJob, FrozenTrial]], worker: str, space: SpaceConfig,
                 steps: int, checkpoints: Path, init_depth: int, fuse: int
                 ) -> tuple[list[AuditRun], list[tuple[AuditJob, FrozenTrial]]]:
    """Claim up to `fuse` pending runs of one model (one, where the model cannot be fused); returns them and
    the pending runs not yet looked at. Runs held by other workers are passed over."""
    claimed: list[AuditRun] = []
    for i, (job, t) in enumerate(pending):
        model = with_knobs(model_config(space), t.user_attrs.get("knobs", {}), init_depth)
        if claimed and (len(claimed) >= fuse or model != claimed[0].model or not fusable(model)):
            return claimed, pending[i:]
        if not store.audit_claim(job, worker, float(t.user_attrs["flops_ratio"]), steps, stale_after=grace_period()):
            continue
        claimed.append(AuditRun(job, list(t.user_attrs["reuse_map"]), model,
                                longer_train_config(space.train, space.train.steps, job.seed),
                                run_checkpoint(checkpoints, job), t.number, t))
    return claimed, []
