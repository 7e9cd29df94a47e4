"""The one run lifecycle: every MLflow run a command or `DvfsCallback` writes is opened and closed here.

`owned_run(...)` is a context manager around a job's work. It adopts the run `mlflow run` started for the command
($MLFLOW_RUN_ID), or a run it is handed (a point's claim run), or creates one; the run exists, RUNNING, from the start
of the job. Its outcome is mapped to the run's status once, here:

- the block ends normally: FINISHED;
- `KeyboardInterrupt` (SIGINT), SIGTERM or SIGHUP: KILLED. For the run's whole life SIGTERM and SIGHUP raise
  `SystemExit` (`hw.guard.TerminationGuard`, the one a clock session installs too), so a job told to stop between
  sessions unwinds like one told inside a session, instead of dying with its run RUNNING;
- any other exception: FAILED.

A run that does not end FINISHED carries the tag `dvfs.end_reason`, one line: the signal, or the exception's type and
first line. The final status is written with SIGTERM and SIGHUP deferred, so it is never cut in half.

`mlflow run` marks its run FINISHED or FAILED when the command exits, but only while the run is still RUNNING
(`mlflow.projects._maybe_set_run_terminated`): the status written here stands, so a SIGTERM under `mlflow run` leaves
KILLED, not FAILED. `user_run()` is the other way in: the run a user's own script has active (under `DvfsCallback`),
which is logged into and never ended here. Nothing else in the package creates, starts or terminates a run, except the
atomic point claims of `claims.py`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.hw.guard import TerminationGuard
from dvfs_mlops.mlops import schema, tracking

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"
REASON_MAX = 500  # characters of a reason tag


class Record(Protocol):
    """What a run's record can do (`records.RunRecord`): write itself to a run."""

    def log(self, client: MlflowClient, run_id: str) -> None: ...


def outcome(exc: BaseException | None) -> tuple[str, str]:
    """(status, reason) of a job that ended with `exc` (None: normally).

    Returns:
        FINISHED and ''; KILLED and the signal (`SIGINT`, `SIGTERM`, `SIGHUP`, or `exit N` for another exit); FAILED
        and `Type: first line of the message`.
    """
    if exc is None:
        return FINISHED, ""
    if isinstance(exc, KeyboardInterrupt):
        return KILLED, "SIGINT"
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else 0
        try:
            return KILLED, signal.Signals(code - 128).name if code > 128 else f"exit {exc.code}"
        except ValueError:
            return KILLED, f"exit {exc.code}"
    first = (str(exc).strip().splitlines() or [""])[0]
    return FAILED, (f"{type(exc).__name__}: {first}" if first else type(exc).__name__)[:REASON_MAX]


@dataclasses.dataclass
class OwnedRun:
    """A run this process logs into, as `owned_run` or `user_run` hands it out.

    Attributes:
        client: the MLflow client it was opened with.
        run_id: the run.
        experiment_id: the experiment the run is in (under `mlflow run`, the one MLflow chose).
        experiment_name: its name.
        adopted: the run was started elsewhere (`mlflow run`, a claim, the user's script), not created here.
        ends_here: this lifecycle writes its final status (False: the user's own run).
    """

    client: MlflowClient
    run_id: str
    experiment_id: str
    experiment_name: str
    adopted: bool = False
    ends_here: bool = True
    status: str | None = None  # the status it ended with (None while open)

    def log(self, record: Record) -> None:
        """Write a `RunRecord` (params, metrics, tags, series) in as few requests as MLflow allows."""
        record.log(self.client, self.run_id)

    def log_batch(self, *, params: Mapping[str, Any] = {}, metrics: Mapping[str, float | None] = {},
                  tags: Mapping[str, str] = {}) -> None:
        """Params, metrics and tags in one request (`tracking.log_run_batch`)."""
        tracking.log_run_batch(self.client, self.run_id, params=params, metrics=metrics, tags=tags)

    def log_text(self, name: str, text: str) -> None:
        """A small text artifact (`tracking.log_text_artifact`)."""
        tracking.log_text_artifact(self.client, self.run_id, name, text)

    def end(self, status: str, reason: str = "") -> None:
        """End the run now with `status` (and a reason tag), before its block does: a point whose claim was lost ends
        KILLED while its worker goes on. The block's own outcome is then not written again."""
        _terminate(self.client, self.run_id, status, reason)
        self.status = status


def _terminate(client: MlflowClient, run_id: str, status: str, reason: str) -> None:
    if reason:
        client.set_tag(run_id, schema.TAG_END_REASON, " ".join(reason.split())[:REASON_MAX])
    client.set_terminated(run_id, status)


def end_stale(client: MlflowClient, run_id: str, reason: str) -> None:
    """End a run that a dead process left RUNNING (a point's or a sweep parent's) as KILLED, with `reason`."""
    _terminate(client, run_id, KILLED, reason)


def _experiment_name(c: MlflowClient, experiment_id: str) -> str:
    try:
        return str(c.get_experiment(experiment_id).name)
    except Exception:  # noqa: BLE001 - the name is for messages only
        return experiment_id


def _open(c: MlflowClient, experiment: str, experiment_id: str | None, name: str, tags: Mapping[str, str], parent_id: str | None,
          run_id: str | None, adopt: bool) -> OwnedRun:
    """Adopt `run_id`, else $MLFLOW_RUN_ID (a run without a parent, `adopt`), else create the run."""
    given = run_id or (settings.mlflow_run_id() if adopt and parent_id is None else None)
    all_tags = {**tags, **({schema.TAG_PARENT: parent_id} if parent_id else {})}
    if given:
        exp_id, exp_name = experiment_id, experiment
        if exp_id is None:
            try:
                exp_id = c.get_run(given).info.experiment_id
            except Exception as e:  # noqa: BLE001 - a run id that names nothing in this store
                first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                raise DvfsError(f"run {given} (MLFLOW_RUN_ID) does not exist in {tracking.tracking_uri()}: {first}") from None
            exp_name = _experiment_name(c, exp_id)
        if all_tags or name:
            tracking.log_run_batch(c, given, tags={**all_tags, **({schema.TAG_RUN_NAME: name} if name else {})})
        return OwnedRun(c, given, exp_id, exp_name, adopted=True)
    exp_id = experiment_id or tracking.experiment_id(c, experiment)
    created = c.create_run(exp_id, run_name=name or None, tags=all_tags)
    return OwnedRun(c, created.info.run_id, exp_id, experiment)


@contextlib.contextmanager
def owned_run(experiment: str, *, experiment_id: str | None = None, name: str = "", tags: Mapping[str, str] | None = None,
              parent_id: str | None = None, run_id: str | None = None, adopt: bool = True, client: MlflowClient | None = None,
              fluent: bool = False) -> Iterator[OwnedRun]:
    """The run a job logs into, from the job's start to its end, its final status written from how the block ended.

    Args:
        experiment: where a new run goes (a command's experiment, e.g. `schema.FINETUNE_EXPERIMENT`), by name.
        experiment_id: its id where the caller knows it (a sweep's points): nothing is looked up.
        name: the run's name (adopted runs are renamed too).
        tags: tags the run carries from its start.
        parent_id: the parent run of a nested run (a sweep point, an Optuna trial): such a run never adopts
            $MLFLOW_RUN_ID, which is its parent's.
        run_id: a run made already to adopt (a point's claim run, `claims.TrackingClaims`).
        adopt: adopt the run `mlflow run` started for this command ($MLFLOW_RUN_ID) where there is one.
        client: the MLflow client to use (default `tracking.client()`).
        fluent: also make the run MLflow's active run for the block, for calls that log through the fluent API
            (`mlflow.pyfunc.log_model`).

    Yields:
        The `OwnedRun`.

    Raises:
        DvfsError: `run_id` or $MLFLOW_RUN_ID names no run in the store. The block's own exceptions pass through,
            after the run's status is written.
    """
    c = client if client is not None else tracking.client()
    guard = TerminationGuard()
    guard.install()
    try:
        run = _open(c, experiment, experiment_id, name, tags or {}, parent_id, run_id, adopt)
        active = False  # the run is MLflow's active run (`fluent`), to be ended through the fluent API
        try:
            if fluent:
                import mlflow

                mlflow.start_run(run_id=run.run_id, nested=mlflow.active_run() is not None)
                active = True
            yield run
        except BaseException as e:
            _close(run, guard, e, active)
            raise
        _close(run, guard, None, active)
    finally:
        guard.uninstall()


def _close(run: OwnedRun, guard: TerminationGuard, exc: BaseException | None, fluent: bool) -> None:
    """Write the status the block's outcome maps to (`outcome`), once (a fluent run leaves MLflow's active runs with
    it); on a failure path a store that fails too is logged, not raised over the job's own exception."""
    if not run.ends_here:
        return
    status, reason = outcome(exc) if run.status is None else (run.status, "")
    with guard.deferring():
        try:
            if fluent:
                import mlflow

                if reason:
                    run.client.set_tag(run.run_id, schema.TAG_END_REASON, " ".join(reason.split())[:REASON_MAX])
                mlflow.end_run(status)
            elif run.status is None:
                _terminate(run.client, run.run_id, status, reason)
        except Exception as e:  # on a failure path the store may be what failed: the job's error is the one to see
            if exc is None:
                raise
            log.warning("run %s could not be marked %s (%s)", run.run_id, status, " ".join(str(e).split())[:200])
    run.status = status


def user_run(client: MlflowClient | None = None) -> OwnedRun | None:
    """The run the user's own script has active (`mlflow.active_run()`, e.g. Trainer's MLflow integration), to log
    into and never end here; None where no run is active."""
    import mlflow

    active = mlflow.active_run()
    if active is None:
        return None
    c = client if client is not None else tracking.client()
    exp_id = active.info.experiment_id
    return OwnedRun(c, active.info.run_id, exp_id, _experiment_name(c, exp_id), adopted=True, ends_here=False)
