"""`ilr-search audit`: retrain chosen maps of a study `factor` times longer, everything else equal, and say how
far the study's proxy ranking holds.

The runs are stored in the study's own database as race runs (table ilr_race_runs, curves included, which the
race reads as its own), so the audit resumes: the same command skips what is done and takes over what a dead
worker left. Each (factor, seed, map) is claimed before it is trained, as trials claim maps, so concurrent audit
workers never train one twice.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from ilr_search.analysis.fidelity import AuditReport, audit_report
from ilr_search.analysis.results import Curves, curves_by_trial, study_front, trained_trials
from ilr_search.config import SIZE_MAXIMA, SpaceConfig, factor_key
from ilr_search.data.tokenizers import check_vocab, model_config
from ilr_search.data.tokens import TokenData, load_space_tokens
from ilr_search.errors import UserInputError
from ilr_search.knobs import with_knobs
from ilr_search.options import AuditSettings
from ilr_search.records import record_json
from ilr_search.search.plan import CONFIG_ATTR, StoredConfig, safe_name, stored_config
from ilr_search.search.progress import RunReporter, StudyStarted
from ilr_search.search.race import (
    RaceRunPlan,
    claim_train_wait,
    drop_finished_checkpoints,
    finished_jobs,
    longer_train_config,
    new_worker,
    race_checkpoints,
    run_checkpoint,
    runs_changed,
    train_claimed,
)
from ilr_search.search.run import check_fuse, disk_full_is_reported
from ilr_search.search.studies import open_study
from ilr_search.storage import (
    RunJob,
    Store,
    grace_period,
    open_store,
    parse_storage,
    study_storage,
)
from ilr_search.storage.trials import TrialRecord, study_trials, trained_results
from ilr_search.training.jobs import fusable
from ilr_search.training.schedule import is_baseline_key

AUTO_MAPS = 8  # the default selection aims at this many maps with a complete proxy result
NEAR_FRONT_PRUNED = 2


def check_settings(settings: AuditSettings) -> tuple[str, int]:
    """(kind, K) of the map selection; bad values raise before anything is opened."""
    if not (isinstance(settings.factor, (int, float)) and math.isfinite(settings.factor)) or settings.factor < 1:
        raise UserInputError(
            f"--factor must be at least 1 (the audit retrains maps factor x longer), got {settings.factor}"
        )
    if not 1 <= settings.seeds <= SIZE_MAXIMA["search", "max_seeds"]:
        raise UserInputError(f"--seeds must be 1 to {SIZE_MAXIMA['search', 'max_seeds']:,}, got {settings.seeds}")
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


def select_maps(trials: Sequence[TrialRecord], curves: Curves, kind: str, k: int, seed: int) -> list[TrialRecord]:
    """The trials whose maps the audit retrains, in a fixed order (the same study gives the same choice).

    - auto: the proxy front, the baseline, the best pruned maps near the front (smallest lead of a no-dearer
      map at their pruning rung), and random complete maps until AUTO_MAPS maps have a complete proxy result;
    - front: the proxy front; top:K: the K best complete maps by proxy perplexity; all: every trained map.
    """
    trained = trained_trials(trials)
    complete = sorted(trained_results(trials), key=lambda t: (t.val_ppl, t.number))
    front_numbers = [p.trial for p in study_front(trials) if p.trial is not None]  # a proxy point is a trial's
    by_number = {t.number: t for t in trained}
    if kind == "all":
        return sorted(trained, key=lambda t: t.number)
    if kind == "top":
        return complete[:k]
    chosen = [by_number[n] for n in front_numbers]
    if kind == "front":
        return chosen
    baseline = next((t for t in complete if t.map_key is not None and is_baseline_key(t.map_key)), None)
    if baseline is not None and baseline not in chosen:
        chosen.append(baseline)
    chosen += _pruned_near_front(trained, curves)[:NEAR_FRONT_PRUNED]
    rest = [t for t in complete if t not in chosen]
    random.Random(seed).shuffle(rest)
    while rest and sum(t.state == TrialState.COMPLETE for t in chosen) < AUTO_MAPS:
        chosen.append(rest.pop())
    return chosen


def _pruned_near_front(trained: list[TrialRecord], curves: Curves) -> list[TrialRecord]:
    """Pruned trials ordered by how close they were, at their pruning rung, to the best loss of a no-dearer map."""
    curves = {t.number: curves.get(t.number, {}) for t in trained}
    scored = []
    for t in trained:
        step = t.pruned_at_step
        if t.state != TrialState.PRUNED or step is None or step not in curves[t.number]:
            continue
        mine = curves[t.number][step]
        ratio = t.flops_ratio
        assert ratio is not None  # trained trials have their FLOPs ratios
        rivals = [
            curves[o.number][step]
            for o in trained
            if o is not t and step in curves[o.number] and o.flops_ratio is not None and o.flops_ratio <= ratio
        ]
        gap = mine - min(rivals) if rivals else 0.0
        scored.append((gap, t.number, t))
    return [t for _, _, t in sorted(scored, key=lambda x: x[:2])]


def stored_space(study: optuna.Study, steps: int) -> SpaceConfig:
    """The study's own configuration (as stored at creation, read by SpaceConfig.from_dict whatever its schema
    version), with `steps` training steps and a checkpoint every eighth of them."""
    config = stored_config(study.user_attrs)
    if config is None:
        raise UserInputError(f"study {study.study_name!r} was not made by ilr-search; it has no stored settings")
    space = config.space
    return dataclasses.replace(
        space, train=dataclasses.replace(space.train, steps=steps, checkpoint_every=max(1, steps // 8))
    )


@dataclass(frozen=True)
class StudyAudit:
    """What `ilr-search audit` did: the study, the factor and steps (the proxy's beside them), the map selection
    as given, seeds per map, the runs it asked for and those this worker trained, and the audit's findings. to_json
    is `audit --json`."""

    study: str
    factor: float
    steps: int
    proxy_steps: int
    maps_spec: str
    seeds: int
    runs: int
    trained_by_this_worker: int
    report: AuditReport

    def to_json(self) -> dict[str, Any]:
        return record_json(self, omit=("report",)) | {
            k: v for k, v in self.report.to_dict().items() if k not in ("factor", "steps")
        }


def run_audit(
    study_name: str,
    storage: str | None = None,
    settings: AuditSettings = AuditSettings(),
    reporter: RunReporter | None = None,
    checkpoint_dir: str | Path | None = None,
    fuse: int = 1,
) -> StudyAudit:
    """Retrain the chosen maps at settings.factor x the proxy's steps (settings.seeds seeds each, the study's
    seed first), store every run, and return the audit report (`audit --json`). `fuse` K > 1: up to K runs of
    one model train at once, fused (how the audit runs, not what it is: its results are the same)."""
    with disk_full_is_reported():
        return _run_audit(study_name, storage, settings, reporter or RunReporter(), checkpoint_dir, fuse)


def _run_audit(
    study_name: str,
    storage: str | None,
    settings: AuditSettings,
    reporter: RunReporter,
    checkpoint_dir: str | Path | None,
    fuse: int = 1,
) -> StudyAudit:
    check_fuse(fuse)
    kind, k = check_settings(settings)
    spec = parse_storage(storage)
    study = open_study(spec, study_name)
    if CONFIG_ATTR not in study.user_attrs:
        raise UserInputError(f"study {study_name!r} was not made by ilr-search; nothing to audit")
    stored = open_store(spec, study_name, read_only=True, storage=study_storage(study))
    trials = study_trials(study, stored.runs())
    if not any(t.state == TrialState.COMPLETE for t in trials):
        raise UserInputError(
            f"study {study_name!r} has no complete trial yet; run it first (ilr-search run ... --study {study_name})"
        )
    config = StoredConfig.from_dict(study.user_attrs[CONFIG_ATTR])
    proxy_steps = config.space.train.steps
    steps = max(1, round(settings.factor * proxy_steps))
    if steps > SIZE_MAXIMA["train", "steps"]:
        raise UserInputError(
            f"--factor {settings.factor:g} retrains at {steps:,} steps ({proxy_steps} a proxy), above "
            f"the most steps a run takes, {SIZE_MAXIMA['train', 'steps']:,}"
        )
    space = stored_space(study, steps)
    init_depth = config.init_depth  # for the depth_init knob
    base_seed = space.train.seed
    curves = curves_by_trial(stored.curve_points())
    chosen = select_maps(trials, curves, kind, k, base_seed)
    if not chosen:
        raise UserInputError(f"--maps {settings.maps} selects no map of study {study_name!r}")
    factor = factor_key(settings.factor)
    jobs: list[tuple[RunJob, TrialRecord]] = []
    for t in chosen:
        assert t.map_key is not None  # select_maps chooses trials that trained their map
        jobs += [(RunJob(factor, base_seed + s, t.map_key), t) for s in range(settings.seeds)]

    store = open_store(spec, study_name, storage=study_storage(study))
    worker = new_worker()
    checkpoints = race_checkpoints(Path(checkpoint_dir or "studies/checkpoints") / safe_name(study_name))
    done = finished_jobs(store)
    title = f"{study_name} audit at {factor}x ({steps} steps)"
    reporter.on(StudyStarted(title, len(jobs), sum(job in done for job, _ in jobs)))
    data: TokenData | None = None
    trained_here = 0

    def claim() -> list[RaceRunPlan] | None:
        done = finished_jobs(store)
        pending = [(job, t) for job, t in jobs if job not in done]
        if not pending:
            return None
        return _claim_group(store, pending, worker, space, steps, checkpoints, init_depth, fuse)

    def train(runs: Sequence[RaceRunPlan]) -> None:
        nonlocal data, trained_here
        if data is None:
            data = load_space_tokens(space)
        for run in runs:
            check_vocab(run.model, data.vocab_size)
        train_claimed(store, runs, worker, data, reporter, kind="audit", fuse=fuse)
        trained_here += len(runs)

    claim_train_wait(
        claim,
        train,
        reporter,
        "the remaining audit runs are being trained by other workers; waiting",
        runs_changed(store),
    )
    drop_finished_checkpoints(store, checkpoints)
    try:
        checkpoints.parent.rmdir()
    except OSError:  # not empty, or not there
        pass
    report = audit_report(trials, store.race_runs(), factor)
    if report is None:
        raise UserInputError(
            f"no audited map of study {study_name!r} finished: every run diverged at "
            f"{factor}x (see the study's race runs: trials --json)"
        )
    return StudyAudit(
        study_name, settings.factor, steps, proxy_steps, settings.maps, settings.seeds, len(jobs), trained_here, report
    )


def _claim_group(
    store: Store,
    pending: list[tuple[RunJob, TrialRecord]],
    worker: str,
    space: SpaceConfig,
    steps: int,
    checkpoints: Path,
    init_depth: int,
    fuse: int,
) -> list[RaceRunPlan]:
    """Claim up to `fuse` pending runs of one model (one, where the model cannot be fused), the first ones
    of `pending` that it can; runs held by other workers are passed over (none claimed: all are held)."""
    claimed: list[RaceRunPlan] = []
    for job, t in pending:
        model = with_knobs(model_config(space), dict(t.knobs), init_depth)
        if claimed and (len(claimed) >= fuse or model != claimed[0].model or not fusable(model)):
            return claimed
        assert t.reuse_map is not None and t.flops_ratio is not None  # the audit's trials trained their maps
        if not store.claim_run("race", job, worker, t.flops_ratio, steps, stale_after=grace_period()):
            continue
        claimed.append(
            RaceRunPlan(
                job,
                list(t.reuse_map),
                model,
                longer_train_config(space.train, space.train.steps, job.seed),
                run_checkpoint(checkpoints, job),
                t.number,
                t.flops_ratio,
                t.schedule,
            )
        )
    return claimed
