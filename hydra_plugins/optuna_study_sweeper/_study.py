"""The search: Optuna's ask/tell over Hydra's launcher, on a study kept in a database.

The study, not this process, holds the progress: a sweep counts the study's finished trials
(complete, or pruned) and launches only what is missing to reach n_trials, so the same command run again after a kill
carries on. Trials a killed sweep left RUNNING stop getting heartbeats (or never got one); once
they are older than the grace period any sweeper of the study fails them and runs their parameters
again. What this takes from Optuna's private API is in _optuna_private.py, and nowhere else.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import queue
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from hydra._internal.core_plugins import basic_launcher
from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override, RangeSweep, Transformer
from hydra.core.utils import JobReturn
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, RetryFailedTrialCallback, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.trial import Trial, TrialState

from config.overrides import check_overrides, last_overrides, schema_type
from config.redact import redact
from config.schema import parse_signals, taken_signals
from errors import ConfigError, Preempted, first_line
from hydra_plugins.optuna_study_sweeper import _optuna_private, _processes, _pruning, _storage
from training.callbacks import Callback
from training.monitor import better_way
from training.preemption import recorded_sweep_resume_command, requeue_or_explain
from training.validation import final_figures

log = logging.getLogger(__name__)

# (overrides of each job, number of the first job) -> one JobReturn per job, in order
Launch = Callable[[list[list[str]], int], Sequence[JobReturn]]
RESULTS = "optimization_results.yaml"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
# The callback a pruned search adds to each trial (_pruning.py), built from the trial's own job:
# the study and pruner from its hydra.sweeper, its trial number from its job's.
PRUNING = "callbacks.optuna_pruning"
PRUNING_OVERRIDE = (
    f"+{PRUNING}={{_target_:{_pruning.__name__}.{_pruning.OptunaPruning.__name__},"
    "storage:${hydra:sweeper.storage},study_name:${hydra:sweeper.study_name},trial:${hydra:job.num},"
    "pruner:${hydra:sweeper.pruner},metric:${optimized_metric}}"
)


class SearchError(Exception):
    """A search that cannot start or go on as asked; the message says what to change."""


def search_space(
    overrides: Sequence[str], config_loader: ConfigLoader | None = None
) -> tuple[dict[str, BaseDistribution], list[str]]:
    """Hydra sweep overrides as Optuna distributions; the plain ones pass to every trial as they are.

    The last override of each key counts (config.overrides.last_overrides): the command line beats
    hparams_search's params. `config_loader` lists a config group's options for glob(...).
    """
    space: dict[str, BaseDistribution] = {}
    fixed: list[str] = []
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(list(overrides))
    for override in last_overrides(parsed):
        if override.is_sweep_override():
            space[override.get_key_element()] = distribution(override)
        else:
            assert override.input_line is not None
            fixed.append(override.input_line)
    return space, fixed


def distribution(override: Override) -> BaseDistribution:
    """choice(...) and a,b,c: categorical; interval(a, b): uniform floats, tag(log, ...) log-uniform;
    range(a, b, step): every step-th value, b excluded as in Hydra's basic sweeper."""
    if getattr(override.value(), "shuffle", False):  # a new order at each parse: the study could not be continued
        raise SearchError(f"{override.input_line}: a search draws its own order, drop shuffle(...)")
    try:
        return _distribution(override)
    except ValueError as e:  # Optuna's own checks: low above high, a log scale from 0
        raise SearchError(f"{override.input_line}: {first_line(e)}") from None


def _distribution(override: Override) -> BaseDistribution:
    value = override.value()
    if override.is_choice_sweep():
        return CategoricalDistribution(list(override.sweep_iterator(transformer=Transformer.encode)))
    if isinstance(value, RangeSweep):
        values = sorted(override.sweep_iterator())  # a descending range(10, 0, -2) holds the same values
        if not values:
            raise SearchError(f"{override.input_line}: the range is empty")
        step = abs(value.step or 1)
        if all(isinstance(v, int) for v in values):
            return IntDistribution(values[0], values[-1], step=int(step))
        return FloatDistribution(float(values[0]), float(values[-1]), step=float(step))
    if isinstance(value, IntervalSweep):  # Hydra reads interval's ends as floats; tag(int, ...) asks for integers
        if "int" in value.tags:
            return IntDistribution(int(value.start), int(value.end), log="log" in value.tags)
        return FloatDistribution(float(value.start), float(value.end), log="log" in value.tags)
    raise SearchError(f"{override.input_line}: use choice(...), interval(a, b), tag(log, interval(a, b)) or range(...)")


def override_of(key: str, value: Any) -> str:
    """A trial's value as an override Hydra reads back as that value: a choice such as 'b,c' escaped."""
    return f"{key}={Transformer.str(value)}"


def open_study(
    name: str,
    storage: str | None,
    direction: str,
    sampler: DictConfig,
    command: dict[str, Any],
    heartbeat_interval: int,
    grace_period: int | None,
) -> tuple[optuna.Study, BaseStorage | None]:
    """Create the study, or load it if the storage holds one of this name run by the same command;
    with the storage it is in, for heartbeats (the study's own handle on it is private)."""
    try:
        opened = _storage.open_storage(storage, heartbeat_interval, grace_period)
    except _storage.StorageError as e:
        raise SearchError(str(e)) from None
    earlier = _trial_count(opened, name)
    try:
        built = instantiate(sampler, **_reseeded(sampler.get("seed"), earlier))
    except Exception as e:  # e.g. another sampler's _target_ with TPESampler's constant_liar still set
        raise SearchError(
            f"hydra.sweeper.sampler: {first_line(e.__cause__ or e)}; drop the keys the sampler does not take "
            "(~hydra.sweeper.sampler.constant_liar)"
        ) from None
    study = optuna.create_study(
        study_name=name, storage=opened, sampler=built, direction=direction, load_if_exists=True
    )
    _check_same_search(study, storage, direction, command)
    return study, opened


def _reseeded(seed: int | None, earlier: int) -> dict[str, int]:
    """The sampler's seed for a run of the study that `earlier` trials came before: the first run's
    seed again would propose the first run's parameters again, and seed + earlier would give two
    machines' runs (seed 1 on an empty study, seed 0 after one trial) the same one."""
    if seed is None or not earlier:
        return {}
    return {"seed": int(np.random.SeedSequence([seed, earlier]).generate_state(1)[0])}


def _trial_count(storage: BaseStorage | None, name: str) -> int:
    if storage is None:
        return 0
    try:
        return len(storage.get_all_trials(storage.get_study_id_from_name(name), deepcopy=False))
    except KeyError:
        return 0


def _check_same_search(study: optuna.Study, storage: str | None, direction: str, command: dict[str, Any]) -> None:
    """One study is one search: continuing it with other overrides would mix two searches' trials."""
    if not study.user_attrs:
        for key, value in command.items():
            study.set_user_attr(key, value)
        return
    stored = {key: study.user_attrs.get(key) for key in command}
    stored_direction = study.direction.name.lower()
    if stored == command and stored_direction == direction:
        return
    then, now = _flatten(stored), _flatten(command)
    if stored_direction != direction:
        then, now = then + [f"direction={stored_direction}"], now + [f"direction={direction}"]
    gone, new = [x for x in then if x not in now], [x for x in now if x not in then]
    raise SearchError(
        f"study {study.study_name} in {where(storage)} ran with {' '.join(gone) or 'nothing more'}, this command has "
        f"{' '.join(new) or 'nothing more'}; run the same search to continue it, or start another with "
        "hydra.sweeper.study_name=NAME"
    )


def where(storage: str | None) -> str:
    """The study's storage as a message names it: a password hidden (a URL given as ${oc.env:...}, as
    secrets are, arrives here resolved), or memory."""
    return redact(storage) if storage else "memory"


def check_new_study_has_its_own_dir(study: optuna.Study, storage: str | None, sweep_dir: Path) -> None:
    """A study with no trials numbers its jobs from 0 again: into the job dirs another search left
    here (a study in memory, a deleted database), each of which would refuse its job."""
    if study.get_trials(deepcopy=False):
        return
    taken = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir() and re.fullmatch(r"\d+(_.*)?", p.name))
    if taken:
        raise SearchError(
            f"{sweep_dir} holds another search's job dirs ({taken[0]}, ...) and study {study.study_name} in "
            f"{where(storage)} has no trials: give this search hydra.sweep.dir of its own, or the storage "
            "that holds its study"
        )


def _flatten(command: dict[str, Any]) -> list[str]:
    """The overrides, then the search space as key=distribution."""
    return [*(command.get("overrides") or []), *(f"{k}={v}" for k, v in (command.get("search_space") or {}).items())]


def check_space_keys(params: list[str], arguments: list[str], config: DictConfig) -> None:
    """The search space's keys (hydra.sweeper.params, from hparams_search's file), checked as the
    command line's are before Hydra composes: a misspelled one failed every trial as Hydra composed
    it, and left a study that refused the corrected search. With the command line's overrides, which
    pick the options (optimizer=adamw) whose keys the space may set."""
    sources = config.hydra.runtime.get("config_sources") or []
    own = bool(config.hydra.get("searchpath")) or any(s.provider not in ("hydra", "main", "schema") for s in sources)
    try:
        check_overrides([*arguments, *params], own_config_dir=own)
    except ConfigError as e:
        raise SearchError(f"hydra.sweeper.params: {e}") from None


def check_whole_numbers(space: dict[str, BaseDistribution]) -> None:
    """interval(a, b) draws floats: on a key the schema types int (trainer.batch_size) every trial
    failed as Hydra merged its value, and left a study that refused the corrected space."""
    for key, drawn in space.items():
        if isinstance(drawn, FloatDistribution) and schema_type(key) is int:
            tags = "log, int" if drawn.log else "int"  # the user's log scale kept
            raise SearchError(
                f"{key} takes whole numbers, and interval(...) draws floats; search it with "
                f"tag({tags}, interval({drawn.low:g}, {drawn.high:g})), or choice(...)"
            )


def check_metric(config: DictConfig, space: dict[str, BaseDistribution]) -> None:
    """optimized_metric names a number every trial's metrics.json holds: a misspelled one trained each
    trial in full and failed it, and left a study that refused the corrected command."""
    metric = config.get("optimized_metric")
    if metric is None:
        return
    ema = config.trainer.get("ema_decay") is not None or "trainer.ema_decay" in space
    try:
        callbacks = [get_class(node._target_) for node in (config.get("callbacks") or {}).values()]
    except Exception:  # a callback that cannot be imported: each trial's pre-flight names it
        return
    # on_train_end may add any figure of its own to metrics.json (EXTENDING.md): no list holds those.
    if any(callback.on_train_end is not Callback.on_train_end for callback in callbacks):
        return
    figures = final_figures(ema, [name for callback in callbacks for name in getattr(callback, "figures", ())])
    if metric in figures:
        return
    close = difflib.get_close_matches(metric, figures, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise SearchError(
        f"optimized_metric={metric}: the trials' metrics.json holds no such figure; {hint}optimise one of "
        f"{', '.join(figures)}"
    )


def check_direction(metric: str, direction: str) -> None:
    """Catch the search that would hunt for the worst model."""
    better = {"min": "minimize", "max": "maximize", None: direction}[better_way(metric)]
    if direction != better:
        raise SearchError(f"hydra.sweeper.direction={direction} for {metric}: {better} it")


def run(
    study: optuna.Study,
    space: dict[str, BaseDistribution],
    fixed: list[str],
    launch: Launch,
    sweep_dir: Path,
    *,
    n_trials: int,
    n_jobs: int,
    heartbeat: BaseStorage | None = None,
    max_failure_rate: float = 0.0,
    poll_s: float = 10.0,
    after_batch: Callable[[], None] = lambda: None,
    parallel: bool = False,
    held: Sequence[int] = (),
) -> None:
    """Launch batches of up to n_jobs trials until the study holds n_trials finished ones (complete, or
    pruned: an answer too); with
    `parallel` (a launcher whose jobs run outside this process) a batch's trials run at once.
    `held`: the signals that stop the search, held while the study asks for trials (_held)."""
    waiting_for = 0
    failed: list[str] = []  # this search's failed trials: what went wrong, first first
    while True:
        _fail_stale(study)  # their retries come back WAITING, and ask() takes those first
        states = [t.state for t in study.get_trials(deepcopy=False)]
        finished = states.count(TrialState.COMPLETE) + states.count(TrialState.PRUNED)
        running = states.count(TrialState.RUNNING)
        if finished >= n_trials:
            return
        size = min(n_jobs, n_trials - finished - running)
        if size <= 0:
            if running != waiting_for:
                log.info(
                    "%d trial(s) RUNNING elsewhere: another sweeper's, or left by a killed one (rerun once it "
                    "misses its heartbeats)",
                    running,
                )
                waiting_for = running
            time.sleep(poll_s)
            continue
        waiting_for = 0
        trials: list[Trial] = []
        try:
            with warnings.catch_warnings(), _held(held):
                # Optuna expects heartbeats from Study.optimize; with ask/tell, _Heartbeat beats instead.
                warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used with Study.optimize")
                for _ in range(size):
                    trials.append(study.ask(space))
        except (KeyboardInterrupt, _Signalled) as e:
            _abandon(study, trials, retry=True)
            signum = e.signum if isinstance(e, _Signalled) else signal.SIGINT
            raise _Signalled(signum, between_trials=True) from None  # no trial was in flight to save
        except BaseException as e:
            _abandon(study, trials, retry=_interrupted(e))
            raise
        failures = _run_batch(study, trials, fixed, launch, sweep_dir, heartbeat, parallel)
        after_batch()
        failed += failures
        if failures and len(failures) / len(trials) > max_failure_rate:
            raise SearchError(
                f"{len(failures)} of {len(trials)} trial(s) launched together failed, more than "
                f"hydra.sweeper.max_failure_rate={max_failure_rate} allows; the first {failures[0]}"
            )
        # Failed trials do not count towards n_trials: a space that always fails must still end.
        if len(failed) >= n_trials:
            raise SearchError(
                f"{len(failed)} trials of this search failed, as many as hydra.sweeper.n_trials={n_trials} (a failed "
                f"trial counts for none); the first {failed[0]}"
            )


def _run_batch(
    study: optuna.Study,
    trials: list[Trial],
    fixed: list[str],
    launch: Launch,
    sweep_dir: Path,
    heartbeat: BaseStorage | None,
    parallel: bool,
) -> list[str]:
    """Launch the trials, tell the study how each went as it ends; what went wrong in those that failed."""
    overrides = [
        [*fixed, *(override_of(k, v) for k, v in trial.params.items()), *_continued(study, trial, sweep_dir)]
        for trial in trials
    ]
    failures: list[str] = []
    told: set[int] = set()
    with _Heartbeat(heartbeat, trials):
        try:
            for i, outcome in _launched(launch, overrides, [t.number for t in trials], parallel):
                error = _tell(study, trials[i], outcome, sweep_dir)
                told.add(i)
                if error is not None:
                    failures.append(error)
        except BaseException as e:
            _abandon(study, [t for i, t in enumerate(trials) if i not in told], retry=_interrupted(e))
            raise
    return failures


def _continued(study: optuna.Study, trial: Trial, sweep_dir: Path) -> list[str]:
    """A retry of a trial cut short (Ctrl-C, a preemption, a sweeper killed) goes on from the last.pt
    its latest try left in its job dir (named by its number, as every job's is), as a run resumed by
    hand would, rather than train again from the start: trainer.resume=<that last.pt>. Not a try
    that finished (its metrics.json; the sweeper was killed before it heard): resumed, it would
    train nothing and write no figure to tell the study, so the retry trains afresh."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # retry_history: experimental since Optuna 2.8
        tries = RetryFailedTrialCallback.retry_history(study.get_trials(deepcopy=False)[trial.number])
    for number in reversed(tries):
        for job in [*sorted(sweep_dir.glob(f"{number}_*")), sweep_dir / str(number)]:
            last = job / "checkpoints" / "last.pt"
            if last.exists() and not (job / "metrics.json").exists():
                # quoted: a job dir's name holds +, ~ and =, which Hydra's grammar reads
                return ["trainer.resume='" + str(last).replace("'", "\\'") + "'"]
    return []


def _launched(
    launch: Launch, overrides: list[list[str]], numbers: list[int], parallel: bool
) -> Iterator[tuple[int, JobReturn | Exception]]:
    """Each trial a launch of its own, its job numbered by the trial (a job's dir stays unique in
    the study when another sweeper's asks interleave with ours): (index, its JobReturn, or what the
    launcher raised for it: a SLURM job killed for memory or time), as they end. One job's failure
    is its trial's alone; launched together, a batch would have failed whole.

    `parallel`: each launch waits in a thread of its own, so that the launcher's jobs (SLURM's,
    submitit's local processes) run at once; else one after another, in this thread."""

    def one(i: int) -> JobReturn | Exception:
        try:
            (ret,) = launch([overrides[i]], numbers[i])
            return ret
        except Exception as e:
            return e

    if not parallel or len(overrides) == 1:
        for i in range(len(overrides)):
            yield i, one(i)
        return
    ended: queue.SimpleQueue[tuple[int, JobReturn | BaseException]] = queue.SimpleQueue()

    def wait_for(i: int) -> None:
        try:
            ended.put((i, one(i)))
        except BaseException as e:  # KeyboardInterrupt, SystemExit: for this thread to raise
            ended.put((i, e))

    for i in range(len(overrides)):
        # Daemons: after Ctrl-C the search ends without waiting for jobs that run elsewhere.
        threading.Thread(target=wait_for, args=(i,), name=f"trial-{numbers[i]}", daemon=True).start()
    for _ in overrides:
        i, outcome = ended.get()
        if not isinstance(outcome, (JobReturn, Exception)):
            raise outcome
        yield i, outcome


def _tell(study: optuna.Study, trial: Trial, ret: JobReturn | Exception, sweep_dir: Path) -> str | None:
    """Tell the study what the job returned (or the launcher raised); if it failed, which job and why."""
    job = None
    if isinstance(ret, JobReturn) and ret.hydra_cfg is not None:
        job = Path(ret.hydra_cfg.hydra.runtime.output_dir)
        trial.set_user_attr("job", os.path.relpath(job, sweep_dir))
    try:
        if isinstance(ret, Exception):
            raise ret
        value = ret.return_value  # re-raises the job's exception if it failed
        if value is None:
            raise ValueError("the job returned no value to optimise")
        value = float(value)
        if not math.isfinite(value):  # Optuna would fail the trial itself, unseen by max_failure_rate
            raise ValueError(f"the job returned {value}")
        pruned = study.get_trials(deepcopy=False)[trial.number].user_attrs.get(_pruning.PRUNED)
    except Exception as e:
        log.warning("trial %d failed: %s: %s", trial.number, type(e).__name__, e)
        study.tell(trial, state=TrialState.FAIL)
        said = " ".join(str(e).split())  # submitit's messages run over lines
        return f"(trial {trial.number}) with {type(e).__name__}: {said}" + (
            f"; its log: {job / 'train.log'}" if job else ""
        )
    if pruned:  # its value: the last figure it reported, as Optuna records a pruned trial's
        log.info("trial %d %s", trial.number, pruned)
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, value)
    return None


class _Signalled(BaseException):
    """A preemption signal (trainer.preempt_signals; Ctrl-C is Python's KeyboardInterrupt) to the
    search while no trial's run in this process watched for it: between trials, or while they run
    in processes of their own."""

    def __init__(self, signum: int, between_trials: bool = False) -> None:
        super().__init__(signum)
        self.signum, self.between_trials = signum, between_trials


def _raise_signalled(signum: int, frame: Any) -> None:
    raise _Signalled(signum)


@contextmanager
def _held(signals: Sequence[int]) -> Iterator[None]:
    """The signals noted, and raised again on leaving: the study records a trial as it asks for it, and
    one whose sweeper stopped before it heard of it would stay RUNNING, the command run again waiting
    a grace period for it to go stale (_optuna_private); heard of, it is queued again at once."""
    noted: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: noted.append(signum)) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if noted:
            signal.raise_signal(noted[0])  # to its own handler, now


def _interrupted(e: BaseException) -> bool:
    """Ctrl-C, a preemption signal, or a job preempted by one (train.py exits 128 + the signal): worth running again."""
    return isinstance(e, (KeyboardInterrupt, _Signalled)) or (
        isinstance(e, SystemExit) and isinstance(e.code, int) and e.code >= 128
    )


def _stopped_by(e: BaseException, trials_apart: bool) -> int | None:
    """The signal that stopped the search, where no trial said how to go on: one that came here,
    or, with `trials_apart` (trials in processes of their own, which leave that to the search),
    one a trial that answered first exited by (train.py exits 128 + it)."""
    if isinstance(e, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(e, _Signalled):
        return e.signum
    if trials_apart and isinstance(e, SystemExit) and isinstance(e.code, int) and e.code > 128:
        return e.code - 128
    return None


def _abandon(study: optuna.Study, trials: list[Trial], retry: bool) -> None:
    for trial in trials:
        study.tell(trial, state=TrialState.FAIL)
        if retry:  # queued as a stale trial's retry is, so both read the same in the study
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ExperimentalWarning)
                RetryHeartbeatStaleTrialCallback()(study, study.get_trials(deepcopy=False)[trial.number])


def _fail_stale(study: optuna.Study) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        fail_stale_trials(study)


class _Heartbeat:
    """Beats for the trials this sweeper runs, so that other sweepers of the study, and this command
    run again after a kill, can tell them from trials whose sweeper is gone."""

    def __init__(self, storage: BaseStorage | None, trials: list[Trial]) -> None:
        self._storage = storage
        self._trial_ids = [_optuna_private.trial_id(trial) for trial in trials]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> None:
        if self._storage is not None:
            self._record()  # before anything can fail: a trial never beaten for is never found stale
            self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        assert self._storage is not None
        while not self._stop.wait(self._storage.get_heartbeat_interval()):
            self._record()

    def _record(self) -> None:
        for trial_id in self._trial_ids:
            self._storage.record_heartbeat(trial_id)


def results(study: optuna.Study, metric: str, n_trials: int) -> dict[str, Any]:
    """What optimization_results.yaml holds: hydra-optuna-sweeper's name/best_params/best_value, and every trial."""
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    summary: dict[str, Any] = {
        "name": "optuna",
        "study_name": study.study_name,
        "metric": metric,
        "direction": study.direction.name.lower(),
        "n_trials": n_trials,
        "complete": len(complete),
        "pruned": sum(t.state == TrialState.PRUNED for t in trials),
    }
    if complete:
        best = study.best_trial
        summary.update(
            best_trial=best.number, best_params=best.params, best_value=best.value, best_job=best.user_attrs.get("job")
        )
    summary["trials"] = [
        {
            "number": t.number,
            "state": t.state.name,
            "value": t.value,
            "params": t.params,
            "job": t.user_attrs.get("job"),
        }
        for t in trials
    ]
    return summary


def write_results(path: Path, summary: dict[str, Any]) -> None:
    """Written after every batch, through a temp file: a report may read it while the search runs."""
    tmp = path.with_name(f".{path.name}.tmp")
    OmegaConf.save(OmegaConf.create(summary), tmp)
    tmp.replace(path)


def _signals(config: DictConfig, key: str) -> list[signal.Signals]:
    """train.py's signals at `key`; none for an app without them (the sweeper runs any Hydra app)."""
    return parse_signals(list(OmegaConf.select(config, key, default=[])), key)


def end_stopped(stopped: Preempted, requeue_on: list[signal.Signals], sweep_dir: Path) -> None:
    """Requeue the SLURM job, or say how to continue the search; exit as the signal would."""
    requeue_or_explain(stopped, requeue_on, recorded_sweep_resume_command(sweep_dir, search=True))
    sys.exit(stopped.exit_code)


def sweep(sweeper: Any, arguments: list[str], sweep_dir: Path) -> dict[str, Any]:
    """The whole search for OptunaStudySweeper.sweep; failures it can name end the process in one line."""
    try:
        return _sweep(sweeper, arguments, sweep_dir)
    except SearchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def check_options(sweeper: Any) -> None:
    if sweeper.direction not in ("maximize", "minimize"):
        raise SearchError(f"hydra.sweeper.direction={sweeper.direction}: choose maximize or minimize")
    check_direction(sweeper.metric, sweeper.direction)
    for key, allowed, use in (
        ("n_jobs", sweeper.n_jobs >= 1, "1 or more trials at once"),
        ("n_trials", sweeper.n_trials >= 0, "0 or more trials"),
        ("max_failure_rate", 0.0 <= sweeper.max_failure_rate <= 1.0, "a share of the trials, 0 to 1"),
    ):
        if not allowed:
            raise SearchError(f"hydra.sweeper.{key}={getattr(sweeper, key)}: use {use}")
    if sweeper.heartbeat_interval < 1:
        raise SearchError(f"hydra.sweeper.heartbeat_interval={sweeper.heartbeat_interval}: give 1 s or more")
    check_pruner(sweeper.pruner, sweeper.storage, sweeper.config.get("optimized_metric"))


def check_pruner(pruner: str, storage: str | None, metric: str | None) -> None:
    """A pruner Optuna has, a study the trials can reach, and a figure each epoch to report."""
    if pruner not in _pruning.PRUNERS:
        raise SearchError(f"hydra.sweeper.pruner={pruner}: choose {', '.join(_pruning.PRUNERS)}")
    if pruner == "none":
        return
    if storage is None:
        raise SearchError(
            f"hydra.sweeper.pruner={pruner} needs a study its trials can reach: a storage, not memory "
            "(drop hydra.sweeper.storage=null)"
        )
    if metric is None or _pruning.epoch_figure(metric) is None:
        raise SearchError(
            f"hydra.sweeper.pruner={pruner}: optimized_metric={metric} has no figure each epoch to compare trials "
            "by; optimise val_loss or an accuracy, or hydra.sweeper.pruner=none"
        )


def _sweep(sweeper: Any, arguments: list[str], sweep_dir: Path) -> dict[str, Any]:
    check_options(sweeper)
    params = [f"{key}={sweep}" for key, sweep in sweeper.params.items()]
    check_space_keys(params, arguments, sweeper.config)
    space, fixed = search_space([*params, *arguments], sweeper.hydra_context.config_loader)
    if not space:
        raise SearchError("nothing to search: give hydra.sweeper.params (or pick one with hparams_search=...)")
    check_whole_numbers(space)
    check_metric(sweeper.config, space)
    command = {"overrides": sorted(fixed), "search_space": {k: repr(d) for k, d in sorted(space.items())}}
    if sweeper.pruner != "none":  # not part of the search: a study goes on with another pruner, or none
        fixed = [*fixed, PRUNING_OVERRIDE]
    sweep_dir.mkdir(parents=True, exist_ok=True)  # the default storage's database is in it
    study, storage = open_study(
        sweeper.study_name,
        sweeper.storage,
        sweeper.direction,
        sweeper.sampler,
        command,
        sweeper.heartbeat_interval,
        sweeper.grace_period,
    )
    check_new_study_has_its_own_dir(study, sweeper.storage, sweep_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)  # metric names: experimental since Optuna 3.2
        study.set_metric_names([sweeper.metric])  # the dashboard's axis says best_val_acc, not "Objective 0"
    # Only now: a refused command leaves the record of the search the dir holds as it was.
    OmegaConf.save(sweeper.config, sweep_dir / "multirun.yaml")
    done = len(study.get_trials(deepcopy=False, states=FINISHED))
    log.info(
        "Study %s (%s %s) in %s: %d of %d trials finished; after a kill, run the same command again to go on",
        study.study_name,
        sweeper.direction,
        sweeper.metric,
        where(sweeper.storage),
        done,
        sweeper.n_trials,
    )

    def launch(batch: list[list[str]], first: int) -> Sequence[JobReturn]:
        sweeper.validate_batch_is_legal(batch)
        return sweeper.launcher.launch(batch, initial_job_idx=first)

    # Hydra's basic launcher runs each job in this process, one at a time: n_jobs of them at once
    # run each in a process of its own. Other launchers' jobs (submitit's) run elsewhere already.
    # The class as the module holds it now: Hydra's plugin scan executes an imported plugin module
    # again, and a BasicLauncher imported before the scan would be another class than the launcher's.
    here = isinstance(sweeper.launcher, basic_launcher.BasicLauncher)
    if sweeper.pruner != "none" and not here and sweeper.storage.startswith("sqlite"):
        log.warning(
            "hydra.sweeper.pruner=%s: trials on other machines will write to SQLite (%s) over a shared filesystem, "
            "whose locks NFS does not keep; give hydra.sweeper.storage=journal:///<shared dir>/optuna.journal or a "
            "database server (docs/sweeps.md)",
            sweeper.pruner,
            where(sweeper.storage),
        )
    if here and sweeper.n_jobs > 1:
        launch = _processes.TrialProcesses(launch, _processes.machine_shares(sweeper.n_jobs))
    path = sweep_dir / RESULTS
    preempt = _signals(sweeper.config, "trainer.preempt_signals")
    # A trial's run in this process takes these signals while it trains (and says how to go on);
    # otherwise they stop the search here, which then says so once, as a run does: the ones a run
    # takes (taken_signals), SIGINT as Python's KeyboardInterrupt, also in a search started with it
    # ignored (a script's `... &`), or one sent between trials would be lost.
    handlers = {sig: signal.default_int_handler if sig == signal.SIGINT else _raise_signalled for sig in preempt}
    previous = {sig: signal.signal(sig, handlers[sig]) for sig in taken_signals(preempt)}
    stopping = sorted({signal.SIGINT, *previous})
    try:
        run(
            study,
            space,
            fixed,
            launch,
            sweep_dir,
            n_trials=sweeper.n_trials,
            n_jobs=sweeper.n_jobs,
            heartbeat=storage,
            max_failure_rate=sweeper.max_failure_rate,
            poll_s=sweeper.heartbeat_interval,
            after_batch=lambda: write_results(path, results(study, sweeper.metric, sweeper.n_trials)),
            parallel=not here or sweeper.n_jobs > 1,
            held=stopping,
        )
    except BaseException as e:
        trials_apart = isinstance(launch, _processes.TrialProcesses)
        signum = _stopped_by(e, trials_apart)
        if signum is None:
            raise
        # Trials in processes of their own got the signal too (a terminal's or SLURM's, to the whole
        # group) and leave it to the search (preemption.explained_by_search): once they have saved,
        # the search alone says how to continue it, or requeues a SLURM job, once. Its trials in
        # flight were queued again; whether there were any is known from where it stopped, since
        # they may have ended, and been joined, before it got here.
        in_flight = not (isinstance(e, _Signalled) and e.between_trials)
        saved = trials_apart and _processes.wait_for_trials(stopping) and in_flight
        requeue_on = _signals(sweeper.config, "trainer.requeue_signals")
        end_stopped(Preempted(signum, saved=saved), requeue_on, sweep_dir)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = results(study, sweeper.metric, sweeper.n_trials)
    write_results(path, summary)
    if "best_params" in summary:
        log.info("Best parameters: %s", " ".join(override_of(k, v) for k, v in summary["best_params"].items()))
        log.info(
            "Best %s: %s (trial %d, %s)",
            sweeper.metric,
            summary["best_value"],
            summary["best_trial"],
            sweep_dir / str(summary["best_job"]),
        )
    log.info("Results: %s", path)
    return summary
