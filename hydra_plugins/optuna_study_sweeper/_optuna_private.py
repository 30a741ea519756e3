"""Everything the sweeper takes from Optuna's private API, and only that: what to read again when
requirements.txt's optuna pin moves. Each use names the release it was read from."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

import optuna
from optuna.storages import RDBStorage
from optuna.storages._heartbeat import BaseHeartbeat  # optuna 5.0.0: what fail_stale_trials asks a storage for
from optuna.storages._rdb import models  # optuna 5.0.0: the SQLAlchemy tables, TrialHeartbeatModel among them
from optuna.storages._rdb.storage import _create_scoped_session  # optuna 5.0.0: a session, committed on exit
from optuna.trial import FrozenTrial, Trial, TrialState


class HeartbeatStorage(RDBStorage):
    """Optuna's RDB storage, whose stale trials also include those asked for and never beaten for.

    A sweeper killed between study.ask and its first heartbeat leaves a RUNNING trial with no heartbeat
    row, which RDBStorage never finds stale: the same command run again would wait for it forever.
    """

    # optuna 5.0.0: BaseHeartbeat._get_stale_trial_ids, which optuna.storages.fail_stale_trials calls.
    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        stale = super()._get_stale_trial_ids(study_id)
        # datetime_start is the asking process's local clock (RDBStorage.create_new_trial). optuna 5.0.0:
        # RDBStorage.__init__ keeps grace_period and heartbeat_interval as attributes, as given.
        asked_before = datetime.now() - timedelta(seconds=self.grace_period or 2 * self.heartbeat_interval)
        running = self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
        old = [trial_id(t) for t in running if t.datetime_start is not None and t.datetime_start < asked_before]
        if not old:
            return stale
        heartbeat = models.TrialHeartbeatModel
        # optuna 5.0.0: RDBStorage.scoped_session, the sessionmaker its own queries use.
        with _create_scoped_session(self.scoped_session) as session:
            beaten = {i for (i,) in session.query(heartbeat.trial_id).filter(heartbeat.trial_id.in_(old))}
        return stale + [trial_id for trial_id in old if trial_id not in beaten]


class JournalHeartbeatStorage(optuna.storages.JournalStorage, BaseHeartbeat):
    """Optuna's journal storage, with the heartbeats it lacks: each a study system attribute,
    heartbeat:<trial id>, holding the beating process's clock (time.time()).

    Not a trial's own attribute: RetryHeartbeatStaleTrialCallback copies the failed trial's into its
    retry, which would then look as stale as the trial it replaces. A trial never beaten for is stale
    once it was started a grace period ago (as HeartbeatStorage's RDB trials are).
    """

    def __init__(
        self,
        backend: optuna.storages.journal.BaseJournalBackend,
        heartbeat_interval: int | None,
        grace_period: int | None,
        heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None],
    ) -> None:
        super().__init__(backend)
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self._stale_trial_callback = heartbeat_stale_trial_callback

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_study_system_attr(self._study_of(trial_id), f"{HEARTBEAT}{trial_id}", time.time())

    # optuna 5.0.0: BaseHeartbeat._get_stale_trial_ids, which optuna.storages.fail_stale_trials calls.
    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        beats = self.get_study_system_attrs(study_id)
        before = time.time() - (self.grace_period or 2 * self.heartbeat_interval)
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            last = beats.get(f"{HEARTBEAT}{trial_id(trial)}")
            if last is None and trial.datetime_start is not None:
                last = trial.datetime_start.timestamp()
            if last is not None and last < before:
                stale.append(trial_id(trial))
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None]:
        return self._stale_trial_callback

    def _study_of(self, trial_id: int) -> int:
        # optuna 5.0.0: JournalStorageReplayResult keeps each trial's study in _trial_id_to_study_id.
        with self._thread_lock:
            return self._replay_result._trial_id_to_study_id[trial_id]


HEARTBEAT = "heartbeat:"


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The id that addresses a trial in its storage (its number counts within the study only);
    optuna 5.0.0: Trial._trial_id and FrozenTrial._trial_id, which ask/tell exposes under no public name."""
    return trial._trial_id
