"""A worker's trials, in ask/tell groups (`run --fuse K`; a group of one at K = 1): the worker asks Optuna for up
to K trials at once; each proposes a map, claims it (or reuses or waits for its result); the claimed maps train
together (one fused group where the model allows, training/jobs.py) under the pruner; each result is recorded and
told. A trial that trains a map claims the map's run (kind "trial") in the store, by the protocol of the race's
runs; the worker's one heartbeat beats its registration and the runs it holds, and stale-trial sweeps fail (and
queue again) the running trials of workers whose heartbeat went stale, on every storage.

The guarantees of one trial hold per trial in a group: a map already finished is reused, one whose run another
live worker holds is waited for, and one proposed twice within the group is trained once (the second trial
reuses the first's result); each trial is alive while its worker beats, is pruned by its own evaluations,
checkpoints on its own, and on Ctrl-C is failed and queued again. The sampler sees the group's trials as
running (the constant liar of the samplers that use it)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

from ilr_search.analysis.results import finite_or_none
from ilr_search.config import ModelConfig, TrainConfig
from ilr_search.knobs import KnobValue, acting_knobs, config_key, format_knobs, knob_choices
from ilr_search.search.maps import fit_map, propose_knobs, propose_trial_map
from ilr_search.search.plan import StudyPlan, safe_name
from ilr_search.search.progress import Message, RunReporter, TrialStarted, step_callback
from ilr_search.search.pruners import Pruner, PruningDecision
from ilr_search.storage import (
    CurvePoint,
    Heartbeat,
    RunJob,
    Store,
    TrainCurvePoint,
    grace_period,
    heartbeat_interval,
    new_worker,
    set_trial_user_attrs,
    study_storage,
    trial_id,
)
from ilr_search.storage.store import ENDED_STATES, worker_job
from ilr_search.storage.trials import TrialAttr, TrialRecord, TrialResultAttrs, study_trials, told_trials
from ilr_search.training.flops import flops_ratio, map_param_count
from ilr_search.training.jobs import Job, train_jobs
from ilr_search.training.schedule import map_text
from ilr_search.training.train import EvalPoint, TrainResult

if TYPE_CHECKING:  # torch is loaded only to train or evaluate: reading a race loads none
    from ilr_search.training.frozen import EvalData

WORKER_ATTR = "ilr:worker"  # a running trial's system attribute: the worker that runs it (Store.register_worker)


class TrialDiverged(Exception):
    """The proxy's loss became non-finite: the trial ends FAIL with its reason, the study goes on."""


def sweep_stale_trials(
    study: optuna.Study, store: Store, worker: str | None = None, stale_after: float | None = None
) -> list[int]:
    """Fail the running trials whose worker's heartbeat (its registration's run) is older than `stale_after` seconds
    (the grace period by default) and queue their retry; a trial's start counts as a beat (a retry inherits its dead
    predecessor's system attributes, its worker included, until its own worker names itself). `worker`: the calling
    worker, whose trials are never failed."""
    failed = []
    now, grace = time.time(), grace_period() if stale_after is None else stale_after
    beats = store.worker_beats()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        held_by = str(t.system_attrs.get(WORKER_ATTR, ""))
        start = t.datetime_start.timestamp() if t.datetime_start else now
        if (worker is not None and held_by == worker) or now - max(start, beats.get(held_by, 0.0)) <= grace:
            continue
        try:
            if study_storage(study).set_trial_state_values(trial_id(t), state=TrialState.FAIL):
                failed.append(t.number)
                optuna.storages.RetryHeartbeatStaleTrialCallback()(study, study_storage(study).get_trial(trial_id(t)))
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker failed it first
    return failed


class SurplusTrial(Exception):
    """The trials asked before this one (results, and trials in flight) already make the study's n_trials: another
    worker counted at the same moment. It trains nothing and ends FAIL, marked surplus (listings leave it out)."""


class TrialTakenOver(Exception):
    """This worker's trial was failed under it (its worker's heartbeat was judged stale) and retried elsewhere."""


@dataclass
class Proposal:
    """A trial's map, knobs, map key and FLOPs ratio; `earlier`: the finished trial whose result it reuses."""

    reuse_map: list[int]
    knobs: dict[str, KnobValue]
    key: str
    ratio: float
    schedule: list[int]  # the map's layer order (a block's is not its counts')
    parts: tuple[str, ...] = ()  # which branch each layer repeats (Map.parts)
    earlier: TrialRecord | None = None
    behind_own: bool = False  # the map is one this worker is about to train: reuse its result afterwards


@dataclass
class Training:
    """A claimed proposal ready to train, and the pruner's decision once on_eval receives one."""

    proposal: Proposal
    model: ModelConfig
    train_cfg: TrainConfig
    checkpoint: Path | None
    on_eval: Callable[[EvalPoint], bool]
    decisions: list[PruningDecision]
    group_size: int = 1  # the maps it trains with in one group, itself included

    @property
    def job(self) -> Job:
        return Job(self.model, self.proposal.schedule, self.train_cfg, self.on_eval, self.checkpoint)


TrialReport = Callable[[optuna.Study, FrozenTrial], object]  # called with each trial once it is told


@dataclass
class GroupTrial:
    trial: optuna.Trial
    proposal: Proposal
    training: Training | None = None  # None: the trial reuses a result (a finished trial's, or the group's)
    told: bool = False


@dataclass
class SearchRun:
    plan: StudyPlan
    study: optuna.Study
    store: Store
    data: EvalData
    reporter: RunReporter
    n_trials: int  # finished trials the study goes to
    checkpoint_root: Path
    pruner: Pruner | None = None
    lanes: int = 1  # threads that train a group's maps side by side (training/jobs.py)
    fuse: int = 1  # the study's K: with K > 1 every fusable map trains through the fused trainer (jobs.py)
    taken_over: int = 0  # trials failed under this worker by another's sweep
    worker: str = dataclasses.field(default_factory=new_worker)  # the name this worker claims runs under
    worker_number: int | None = None  # its registration (Store.register_worker), beaten while its trials run
    held: set[str] = dataclasses.field(default_factory=set)  # the maps whose trial runs this worker holds

    def refuse_surplus(self, trial: optuna.Trial) -> None:
        """Workers count the study's trials and then ask for one, two steps another worker can fall between: a
        trial whose predecessors already make the study's n_trials raises SurplusTrial before it proposes a map. Trial
        numbers are given in order by the storage, so of two trials asked at once exactly the later one stops."""
        ahead = sum(
            t.number < trial.number and (t.has_result or t.state == TrialState.RUNNING) for t in told_trials(self.study)
        )
        if ahead >= self.n_trials:
            set_trial_user_attrs(trial, {TrialAttr.SURPLUS: True})
            raise SurplusTrial(f"trial {trial.number}: {ahead} trials before it make the study's {self.n_trials}")

    def propose(self, trial: optuna.Trial, in_hand: Collection[str] = ()) -> Proposal:
        """The trial's map and knobs, recorded on it; deduplicated against finished trials and claimed (or the
        finished trial whose result it reuses, after waiting for a live trial that trains the same map).
        `in_hand`: map keys this worker has claimed and is about to train; a trial proposing one of them is
        neither claimed nor waited for (it would wait on this worker), but returned `behind_own`."""
        search = self.plan.space.search
        costs, routed = self.plan.budget.pass_costs(self.plan.model), False
        if "capacity" in search.knobs:  # a routed pass costs about C of a layer: the map repaired at its capacity
            capacity = float(cast(float, trial.suggest_categorical("capacity", knob_choices("capacity"))))
            routed = capacity < 1
            if routed:
                costs = self.plan.budget.pass_costs(self.plan.trial_model({"capacity": capacity}))
        chosen, proposed = propose_trial_map(
            trial,
            self.plan.model.n_layers,
            search.max_reuse,
            self.plan.budget.max_layer_runs(self.plan.model),
            search.families,
            search.parts,
            costs,
            by_costs=routed,
        )
        knobs = acting_knobs(propose_knobs(trial, search.knobs, search.damping_choices), chosen.schedule())
        model = self.plan.trial_model(knobs, chosen.parts)
        if model.adapter_rank:  # adapters add FLOPs to every extra pass: the map repaired by what its passes cost
            chosen = fit_map(chosen, self.plan.budget.pass_costs(model))
            knobs = acting_knobs(knobs, chosen.schedule())
            model = self.plan.trial_model(knobs, chosen.parts)
        reuse_map, schedule = list(chosen.counts), chosen.schedule()
        key = config_key(chosen.key, knobs)
        ratio = flops_ratio(model, schedule)
        assert self.plan.budget.allows(ratio), (chosen.key, ratio)
        attrs: dict[str, Any] = {
            TrialAttr.REUSE_MAP: reuse_map,
            TrialAttr.MAP_KEY: key,
            TrialAttr.FLOPS_RATIO: ratio,
            TrialAttr.PARAMS: map_param_count(model, schedule),
        }
        if knobs:
            attrs[TrialAttr.KNOBS] = knobs
        if proposed is not None:
            attrs[TrialAttr.PROPOSED_MAP] = list(proposed)
        set_trial_user_attrs(trial, attrs)

        proposal = Proposal(reuse_map, knobs, key, ratio, schedule, chosen.parts, self._result_for(key, trial.number))
        if proposal.earlier is None and key in in_hand:
            proposal.behind_own = True
        elif proposal.earlier is None:
            proposal.earlier = self._claim_or_wait(key, trial.number, ratio)
        return proposal

    def _result_for(self, key: str, exclude: int) -> TrialRecord | None:
        """The trial other than `exclude` that trained map `key` to a result: the one its run names (Run.trial), its
        result read from the run where Optuna holds none (failed under its worker, or not yet told)."""
        job, runs = self._run_job(key), self.store.runs()
        run = next(
            (
                r
                for r in runs
                if r.kind == "trial" and r.job == job and r.state in ENDED_STATES and r.trial not in (None, exclude)
            ),
            None,
        )
        if run is None:
            return None
        return next(r for r in study_trials(self.study, runs) if r.number == run.trial)

    def _run_job(self, key: str) -> RunJob:
        """The job of the trial run of map `key`: the proxy's length (factor 1) at its seed."""
        return RunJob("1", self.plan.space.train.seed, key)

    def _claim_or_wait(self, key: str, number: int, ratio: float) -> TrialRecord | None:
        """Claim the map's trial run for this trial (None); if another live worker holds it, wait for its result
        (the trial that trained it)."""
        waited = False
        while (result := self._result_for(key, number)) is None:
            steps = self.plan.space.train.steps
            if self.store.claim_run("trial", self._run_job(key), self.worker, ratio, steps, grace_period()):
                self.held.add(key)
                return None
            if not waited:
                self.reporter.on(Message(f"map {key} is being trained by another worker; waiting for its result"))
                waited = True
            time.sleep(min(2.0, heartbeat_interval()))
            self.sweep_stale()
        return result

    def sweep_stale(self) -> None:
        """Fail (and queue again) the trials of dead workers; never this worker's."""
        sweep_stale_trials(self.study, self.store, worker=self.worker)

    def _release(self, key: str, number: int | None = None, result: TrialResultAttrs | None = None) -> None:
        """End this worker's hold on map `key`'s trial run: with trial `number`'s `result` (written before the trial
        is told, so that a told trial always has its run finished), or free for another trial (interrupted)."""
        if key not in self.held:
            return
        self.held.discard(key)
        job = self._run_job(key)
        if result is None:
            self.store.finish_run("trial", job, self.worker, "interrupted", None, None, None, (), None, None)
            return
        status = result.get(TrialAttr.STATUS)
        state = {"diverged": "failed", "pruned": "pruned"}.get(str(status), "complete")
        losses: tuple[float | None, float | None, float | None] = (None, None, None)
        if state == "complete":
            losses = (result.get(TrialAttr.VAL_LOSS), result.get(TrialAttr.VAL_PPL), result.get(TrialAttr.VAL_BPB))
        seconds, reason = result.get(TrialAttr.TRAIN_SECONDS), result.get(TrialAttr.REASON)
        self.store.finish_run("trial", job, self.worker, state, *losses, (), seconds, reason, trial=number)

    def _beat(self) -> bool:
        """One heartbeat of this worker: its registration and the trial runs it holds."""
        if self.worker_number is not None:
            self.store.beat_run("worker", worker_job(self.worker_number), self.worker)
        for key in list(self.held):
            self.store.beat_run("trial", self._run_job(key), self.worker)
        return True

    def _failed_under_me(self, trial: optuna.Trial) -> bool:
        """Another worker's sweep judged this trial stale and failed it (its retry is queued)."""
        return study_storage(self.study).get_trial(trial_id(trial)).state.is_finished()

    def _taken_over(self, trial: optuna.Trial) -> TrialTakenOver:
        self.taken_over += 1
        return TrialTakenOver(f"trial {trial.number} was failed by another worker's stale-trial sweep")

    def _store_curve(self, number: int, result: TrainResult, key: str, ratio: float) -> None:
        """The points of `result`'s curve that the store does not hold for trial `number` (the curve lives there
        only, not in the trial's attributes)."""
        stored = {p.step for p in self.store.curve_points() if p.trial_number == number}
        for point in result.curve:
            if point.step not in stored:
                self.store.add_curve_point(CurvePoint(number, point.step, point.val_loss, ratio, key), point.tokens)

    def _store_train_curve(self, number: int, result: TrainResult, key: str) -> None:
        """The training loss of `result` as trial `number`'s curve of kind "train", in one write."""
        self.store.add_train_curve([TrainCurvePoint(number, p.step, p.tokens, p.loss, key) for p in result.train_curve])

    def _reuse(self, trial: optuna.Trial, earlier: TrialRecord) -> float | tuple[float, float]:
        if self._failed_under_me(trial):
            raise self._taken_over(trial)
        set_trial_user_attrs(
            trial, earlier.reused_result() | {TrialAttr.REUSED_FROM: earlier.number, TrialAttr.STEPS: 0}
        )
        if earlier.state == TrialState.PRUNED:
            raise optuna.TrialPruned(f"map already pruned in trial {earlier.number}")
        if earlier.state == TrialState.FAIL:
            raise TrialDiverged(f"map already diverged in trial {earlier.number}")
        assert earlier.val_ppl is not None and earlier.flops_ratio is not None  # complete: it has its result
        return self._values(earlier.val_ppl, earlier.flops_ratio)

    def _values(self, val_ppl: float, ratio: float) -> float | tuple[float, float]:
        return val_ppl if self.plan.space.search.objective == "ppl" else (val_ppl, ratio)

    def start_training(self, trial: optuna.Trial, proposal: Proposal) -> Training:
        """What training a claimed proposal needs: its model, schedule, config, checkpoint and on_eval (which
        stores the curve and asks the pruner)."""
        steps = self.plan.space.train.steps
        key, ratio = proposal.key, proposal.ratio
        self.reporter.on(
            TrialStarted(trial.number, proposal.reuse_map, steps, format_knobs(proposal.knobs), map=map_text(key))
        )
        decisions: list[PruningDecision] = []  # the pruner's decision, once it prunes

        def on_eval(point: EvalPoint) -> bool:
            self.store.add_curve_point(CurvePoint(trial.number, point.step, point.val_loss, ratio, key), point.tokens)
            # Optuna's intermediate values too (what optuna-dashboard plots): through the storage, since a
            # multi-objective trial may not call Trial.report.
            try:
                study_storage(self.study).set_trial_intermediate_value(trial_id(trial), point.step, point.val_loss)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass  # failed under this worker by a stale-trial sweep: the store keeps the curve
            if self.pruner is None:
                return False
            decision = self.pruner.decide(trial, point.step, point.val_loss, ratio, key)
            if decision is not None:
                decisions.append(decision)
                return True
            return False

        checkpoint = (
            self.checkpoint_root / f"{safe_name(key.replace(',', '-'))}.pt"
            if self.plan.space.train.checkpoint_every
            else None
        )
        train_cfg = dataclasses.replace(self.plan.space.train, dtype=self.plan.dtype)
        return Training(
            proposal,
            self.plan.trial_model(proposal.knobs, proposal.parts),
            train_cfg,
            checkpoint,
            on_eval,
            decisions,
        )

    def interrupted(self, trial: optuna.Trial) -> None:
        """Ctrl-C during training: retry this map on resume (Optuna marks the trial FAIL); the study then stops."""
        trial.set_user_attr(TrialAttr.REASON, "interrupted (Ctrl-C)")
        self.study.enqueue_trial(trial.params, user_attrs={TrialAttr.RETRY_OF: trial.number})

    def finish_training(
        self, trial: optuna.Trial, training: Training, result: TrainResult
    ) -> float | tuple[float, float]:
        """Record a trained proposal's result; its values, or TrialDiverged / TrialPruned / TrialTakenOver."""
        key, ratio, checkpoint = training.proposal.key, training.proposal.ratio, training.checkpoint
        decision = training.decisions[0] if training.decisions else None
        if (
            result.resumed_from_step
        ):  # resumed from a dead predecessor's checkpoint: its early points go under this trial
            self._store_curve(trial.number, result, key, ratio)
        self._store_train_curve(trial.number, result, key)
        attrs = self._result_attrs(result, decision, training.group_size)
        self._release(key, trial.number, attrs)  # the map's run holds the result before the trial is told
        if checkpoint is not None:  # the trial is over, whatever its outcome
            checkpoint.unlink(missing_ok=True)
        try:  # failed under this worker (before or while its result is written): the result is on the run
            if self._failed_under_me(trial):
                raise optuna.exceptions.UpdateFinishedTrialError(f"trial {trial.number} is finished")
            set_trial_user_attrs(trial, attrs)
        except optuna.exceptions.UpdateFinishedTrialError:
            raise self._taken_over(trial) from None
        if result.status == "diverged":
            raise TrialDiverged(result.reason)
        if decision is not None:
            raise optuna.TrialPruned(decision.reason)
        return self._values(result.val_ppl, ratio)

    def _result_attrs(self, result: TrainResult, decision: PruningDecision | None, group_size: int) -> TrialResultAttrs:
        attrs: TrialResultAttrs = {
            TrialAttr.FUSED_GROUP: group_size,
            TrialAttr.STATUS: "pruned" if decision is not None else result.status,
            TrialAttr.REASON: decision.reason if decision is not None else result.reason,
            TrialAttr.STEPS: result.steps - result.resumed_from_step,
            TrialAttr.RESUMED_FROM_STEP: result.resumed_from_step,
            TrialAttr.VAL_LOSS: finite_or_none(result.val_loss),
            TrialAttr.VAL_PPL: finite_or_none(result.val_ppl),
            TrialAttr.VAL_BPB: finite_or_none(result.val_bpb),
            TrialAttr.TRAIN_SECONDS: result.train_seconds,
            TrialAttr.TOKENS_PER_SECOND: result.tokens_per_second,
        }
        if result.route_fractions:
            attrs[TrialAttr.ROUTE_FRACTIONS] = result.route_fractions
        if result.realised_flops_ratio is not None:
            attrs[TrialAttr.REALISED_FLOPS_RATIO] = result.realised_flops_ratio
        if decision is not None:
            attrs[TrialAttr.PRUNED_AT_STEP] = decision.step
            attrs[TrialAttr.STEPS_SAVED] = self.plan.space.train.steps - decision.step
        return attrs

    def run_group(self, n: int, report: TrialReport) -> None:
        """The one way trials run: ask for up to `n` trials, train the claimed maps together, tell every trial;
        re-raises Ctrl-C after failing the group's unfinished trials and queuing their maps again. A trial asked
        once the trials before it make the study's n_trials (other workers asked at the same time) ends the
        asking (refuse_surplus). Trials of dead workers are failed (and queued again) first, as Optuna's
        study.optimize does before each trial; the worker beats while the group runs."""
        group: list[GroupTrial] = []
        self.sweep_stale()
        with Heartbeat(self._beat):
            try:
                for _ in range(n):
                    trial = self.study.ask()
                    study_storage(self.study).set_trial_system_attr(trial_id(trial), WORKER_ATTR, self.worker)
                    try:
                        self.refuse_surplus(trial)
                    except SurplusTrial:
                        self.study.tell(trial, state=TrialState.FAIL)
                        break
                    member = GroupTrial(trial, Proposal([], {}, "", 0.0, []))
                    group.append(member)
                    in_hand = {g.proposal.key for g in group if g.training is not None}
                    member.proposal = self.propose(trial, in_hand)
                    if member.proposal.earlier is not None:
                        self._tell(member, partial(self._reuse, member.trial, member.proposal.earlier), report)
                    elif not member.proposal.behind_own:
                        member.training = self.start_training(trial, member.proposal)
                training = [(g, g.training) for g in group if g.training is not None]
                for _, t in training:  # how the trial was trained: in a group of this many maps
                    t.group_size = len(training)
                results = self._train_trainings([t for _, t in training])
                for (member, t), result in zip(training, results, strict=True):
                    self._tell(member, partial(self.finish_training, member.trial, t, result), report)
                for member in group:  # proposed a map the group trained: its result now exists
                    if not member.told:
                        self._tell(member, partial(self._reuse_own, member), report)
            except BaseException as e:
                self._abandon(group, interrupted=isinstance(e, KeyboardInterrupt))
                raise

    def _reuse_own(self, member: GroupTrial) -> float | tuple[float, float]:
        earlier = self._result_for(member.proposal.key, member.trial.number)
        if earlier is None:  # the group's trial of this map left no result (taken over without one): train it
            earlier = self._claim_or_wait(member.proposal.key, member.trial.number, member.proposal.ratio)
            if earlier is None:
                member.training = self.start_training(member.trial, member.proposal)
                (result,) = self._train_trainings([member.training])
                return self.finish_training(member.trial, member.training, result)
        return self._reuse(member.trial, earlier)

    def _train_trainings(self, trainings: list[Training]) -> list[TrainResult]:
        """Train the trainings fused, one group per model (searched knobs change it); a model the fused trainer
        does not support trains its maps one at a time, as the objective does."""
        return train_jobs(
            [t.job for t in trainings],
            self.data,
            fuse=max(self.fuse, len(trainings)),
            on_step=step_callback(self.reporter),
            lanes=self.lanes,
        )

    def _tell(
        self, member: GroupTrial, outcome: Callable[[], float | tuple[float, float]], report: TrialReport
    ) -> None:
        """Tell Optuna how a trial ended, as study.optimize would for an objective's value or exception; an
        exception of another kind (Ctrl-C included) leaves the trial untold, for _abandon."""
        state: TrialState | None
        values: float | tuple[float, float] | None
        try:
            values = outcome()
        except optuna.TrialPruned:
            state, values = TrialState.PRUNED, None
        except TrialDiverged:
            state, values = TrialState.FAIL, None
        except TrialTakenOver:
            member.told = True
            return  # failed under this worker by another's sweep: its result, if any, is on its map's run
        else:
            state = None
        member.told = True
        # skip_if_finished: a trial failed under this worker after its outcome was read is left as it is, and the
        # rest of the group is still told
        told = self.study.tell(member.trial, values, state=state, skip_if_finished=True)
        report(self.study, told)

    def _abandon(self, group: list[GroupTrial], interrupted: bool) -> None:
        """Fail the group's untold trials (as Optuna fails a trial whose objective raised); on Ctrl-C the maps
        being trained are queued again; the maps' runs this worker still holds are freed."""
        for member in group:
            if member.told:
                continue
            member.told = True
            if interrupted and member.training is not None:
                self.interrupted(member.trial)
            self.study.tell(member.trial, state=TrialState.FAIL, skip_if_finished=True)
        for key in list(self.held):
            self._release(key)
