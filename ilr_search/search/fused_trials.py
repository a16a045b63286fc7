"""Fused trials (`run --fuse K`): a worker asks Optuna for up to K trials at once, proposes and claims
each map as the objective does, trains the claimed maps in one fused group (fused.py), and tells each result.

The guarantees of one trial at a time hold per trial: a map already finished is reused, one claimed by another
live worker is waited for, and one proposed twice within the group is trained once (the second trial reuses
the first's result); each trial beats while it runs (journal heartbeats, or Optuna's RDB heartbeat thread),
is pruned by its own evaluations, checkpoints on its own, and on Ctrl-C is failed and queued again. The
sampler sees the group's trials as running (the constant liar of the samplers that use it).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import optuna
from optuna.trial import FrozenTrial, TrialState

from ilr_search.analysis.trials import TrialAttr
from ilr_search.search.objective import (
    Proposal,
    SearchRun,
    SurplusTrial,
    Training,
    TrialDiverged,
    TrialTakenOver,
    journal_heartbeat,
    sweep_stale_journal_trials,
)
from ilr_search.search.progress import step_callback
from ilr_search.storage import heartbeat_thread, study_storage, trial_id
from ilr_search.training.jobs import train_jobs
from ilr_search.training.train import TrainResult

TrialReport = Callable[[optuna.Study, FrozenTrial], object]  # called with each trial once it is told


@dataclass
class GroupTrial:
    trial: optuna.Trial
    proposal: Proposal
    training: Training | None = None  # None: the trial reuses a result (a finished trial's, or the group's)
    told: bool = False


class FusedSearchRun(SearchRun):
    """A SearchRun that can also run a group of trials fused (`run_group`); `objective` stays the one-trial path."""

    def run_group(self, n: int, report: TrialReport) -> None:
        """Ask for up to `n` trials, train the claimed maps fused, tell every trial; re-raises Ctrl-C after failing
        the group's unfinished trials and queuing their maps again. A trial asked once the trials before it
        make the study's n_trials (other workers asked at the same time) ends the asking (refuse_surplus)."""
        group: list[GroupTrial] = []
        with ExitStack() as beats:
            try:
                for _ in range(n):
                    with warnings.catch_warnings():  # Optuna warns that its heartbeat expects optimize(): it runs here
                        warnings.filterwarnings("ignore", message="Heartbeat of storage")
                        trial = self.study.ask()
                    try:
                        self.refuse_surplus(trial)
                    except SurplusTrial:
                        self.study.tell(trial, state=TrialState.FAIL)
                        break
                    if self.spec.kind == "journal":
                        beats.enter_context(journal_heartbeat(self.study, trial_id(trial)))
                        sweep_stale_journal_trials(self.study, spare=trial_id(trial))
                    else:
                        beats.enter_context(heartbeat_thread(trial_id(trial), study_storage(self.study)))
                    member = GroupTrial(trial, Proposal([], {}, "", 0.0, None))
                    group.append(member)
                    in_hand = {g.proposal.key for g in group if g.training is not None}
                    member.proposal = self.propose(trial, in_hand)
                    if member.proposal.earlier is not None:
                        self._tell(member, partial(self._reuse, member.trial, member.proposal.earlier), report)
                    elif not member.proposal.behind_own:
                        member.training = self.start_training(trial, member.proposal)
                training = [(g, g.training) for g in group if g.training is not None]
                for member, _ in training:  # how the trial was trained: in a group of this many maps
                    member.trial.set_user_attr(TrialAttr.FUSED_GROUP, len(training))
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
            earlier = self._claim_or_wait(member.proposal.key, member.trial.number)
            if earlier is None:
                return self._train(member.trial, member.proposal)
        return self._reuse(member.trial, earlier)

    def _train_trainings(self, trainings: list[Training]) -> list[TrainResult]:
        """Train the trainings fused, one group per model (searched knobs change it); a model the fused trainer
        does not support trains its maps one at a time, as the objective does."""
        return train_jobs(
            [t.job for t in trainings],
            self.data,
            fuse=max(1, len(trainings)),
            on_step=step_callback(self.reporter),
            lanes=self.lanes,
        )

    def _tell(
        self, member: GroupTrial, outcome: Callable[[], float | tuple[float, float]], report: TrialReport
    ) -> None:
        """Tell Optuna how a trial ended, as study.optimize would for the objective's value or exception."""
        member.told = True
        state: TrialState | None
        values: float | tuple[float, float] | None
        try:
            values = outcome()
        except optuna.TrialPruned:
            state, values = TrialState.PRUNED, None
        except TrialDiverged:
            state, values = TrialState.FAIL, None
        except TrialTakenOver:
            return  # failed under this worker by another's sweep: its result was kept as a recovered trial
        else:
            state = None
        # skip_if_finished: a trial failed under this worker after its outcome was read is left as it is (the
        # one-trial path sees Optuna refuse such a tell), and the rest of the group is still told
        report(self.study, self.study.tell(member.trial, values, state=state, skip_if_finished=True))

    def _abandon(self, group: list[GroupTrial], interrupted: bool) -> None:
        """Fail the group's untold trials (as Optuna fails a trial whose objective raised); on Ctrl-C the maps
        being trained are queued again, as the objective queues its one."""
        for member in group:
            if member.told:
                continue
            member.told = True
            if interrupted and member.training is not None:
                self.interrupted(member.trial)
            self.study.tell(member.trial, state=TrialState.FAIL, skip_if_finished=True)
