"""MLflow plumbing shared by the sweep, the governor and the launcher.

Tracking URI: $MLFLOW_TRACKING_URI, else `sqlite:///mlflow.db` in the working directory. The store
is checked before any clock is touched. Point runs are written with `MlflowClient.log_batch`
(one round trip for params, metrics and tags) to keep the per-point overhead low; transient HTTP
errors are retried by MLflow's own client (bounded retries with backoff).
"""
from __future__ import annotations

import dataclasses
import shlex
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# MLflow error codes of a store that failed to answer (a 5xx, a restarting database), not of a refused request.
TRANSIENT_ERROR_CODES = frozenset({"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "DEADLINE_EXCEEDED",
                                   "ABORTED", "IO_ERROR"})


def _is_mlflow_exception(e: BaseException) -> bool:
    """By class name, so that asking imports nothing of mlflow."""
    return any(cls.__name__ == "MlflowException" for cls in type(e).__mro__)


def is_connection_failure(e: BaseException) -> bool:
    """MLflow's client gave up on an HTTP request (connection refused or cut): the server is down, not a bug here."""
    text = str(e)
    return _is_mlflow_exception(e) and text.startswith("API request to ") and " failed with exception " in text


def outage_line(e: BaseException) -> str | None:
    """The one line a command ends with when MLflow's client gave up on the tracking server (`is_connection_failure`);
    None for any other exception."""
    if not is_connection_failure(e):
        return None
    return (f"the MLflow tracking store {tracking_uri()} stopped answering ({str(e).strip().splitlines()[0][:200]}); "
            "start it again, then re-run the same command (a sweep resumes; the clocks were restored)")


def is_store_outage(e: BaseException) -> bool:
    """The tracking store did not answer (connection refused or cut, a 5xx after MLflow's retries, a database that is
    restarting or locked), as opposed to refusing the request (a bad value, a missing run): only the first is worth
    trying again."""
    if isinstance(e, OSError) or is_connection_failure(e):  # OSError: requests' connection errors
        return True
    if not _is_mlflow_exception(e):
        return False
    text = str(e)
    return (text.startswith("API request to ") and " failed with error code 5" in text) \
        or getattr(e, "error_code", None) in TRANSIENT_ERROR_CODES or "database is locked" in text


def tracking_uri() -> str:
    """The tracking store's URI (`settings.tracking_uri`)."""
    return settings.tracking_uri()


def client() -> MlflowClient:
    import mlflow
    from mlflow.tracking import MlflowClient

    settings.set_defaults(settings.MLFLOW_HTTP_DEFAULTS)
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    return MlflowClient(tracking_uri=uri)


def check_reachable() -> MlflowClient:
    """A client for the tracking store, or a clear error if it cannot be reached."""
    uri = tracking_uri()
    with settings.overridden({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}):  # fail in seconds
        try:
            c = client()
            c.search_experiments(max_results=1)
        except Exception as e:  # noqa: BLE001 - any failure here means "not usable"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DvfsError(f"MLflow tracking store {uri} is unreachable ({first[:200]}); start it or set MLFLOW_TRACKING_URI") from None
    return c


def experiment_id(c: MlflowClient, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        # MLflow 3's UI opens "model training" experiments on their runs table, not the GenAI overview
        return c.create_experiment(name, tags={"mlflow.experimentKind": "custom_model_development"})
    except Exception:
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def log_run_batch(c: MlflowClient, run_id: str, params: Mapping[str, Any] = {}, metrics: Mapping[str, float | None] = {},
                  tags: Mapping[str, str] = {}, series: Mapping[str, Sequence[float]] = {}) -> None:
    """Params, metrics, tags and metric series in as few requests as MLflow allows (1000 per batch)."""
    import time

    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    ms = [Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None]
    for k, values in series.items():
        ms += [Metric(k, float(v), now, i) for i, v in enumerate(values)]
    ps = [Param(k, str(v)) for k, v in params.items()]
    ts = [RunTag(k, str(v)) for k, v in tags.items()]
    first = True
    while first or ms:
        chunk, ms = ms[:900], ms[900:]
        c.log_batch(run_id, metrics=chunk, params=ps if first else [], tags=ts if first else [])
        first = False


def log_text_artifact(c: MlflowClient, run_id: str, name: str, text: str) -> None:
    """A small text file (board.json, predicted.csv, refine.csv) as an artifact of the run."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_text(text)
        c.log_artifact(run_id, str(path))


# Deep links into the MLflow UI (MLflow 3's routes; the UI is a hash router). `workflowType=machine_learning`
# opens an experiment on its runs table in "Model training" mode rather than the GenAI overview, even in a
# browser whose last visit left the toggle on GenAI.
LOCAL_UI = "http://127.0.0.1:5000"  # where `mlflow ui` listens by default
ML_WORKFLOW = "workflowType=machine_learning"


@dataclasses.dataclass(frozen=True)
class UiLink:
    """Where to look at what a command wrote: `url`, and `start`, the command that serves it when the store is
    local (SQLite, a file store, a database without a server): None when the tracking URI is a server already."""

    url: str
    start: str | None = None


def _is_server(uri: str) -> bool:
    return urllib.parse.urlsplit(uri).scheme in ("http", "https")


def without_password(uri: str) -> str:
    """`uri` with its password, if any, shown as *** (for messages, logs and keys)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def ui_store_uri(uri: str | None = None) -> str:
    """The tracking URI as `mlflow ui --backend-store-uri` takes it from any directory (SQLite and file paths made
    absolute, a password masked)."""
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///"):]
        if path and not path.startswith("/") and path != ":memory:":
            return "sqlite:///" + str(Path(path).resolve())
        return uri
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme == "file":
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(uri).path)).resolve().as_uri()
    if not scheme or len(scheme) == 1:  # a plain path (a drive letter is no scheme)
        return Path(uri).resolve().as_uri()
    return without_password(uri)


def ui_base(uri: str | None = None) -> tuple[str, str | None]:
    """(base URL of the UI, command that starts it or None): the server itself for an http(s) tracking URI,
    else `mlflow ui` on 127.0.0.1:5000 over the local store."""
    uri = uri or tracking_uri()
    if _is_server(uri):
        parts = urllib.parse.urlsplit(uri)
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        if parts.hostname and ":" in parts.hostname:  # IPv6 literal
            netloc = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port else "")
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", "")), None
    return LOCAL_UI, f"mlflow ui --backend-store-uri {shlex.quote(ui_store_uri(uri))}"


def experiment_link(experiment_id: str, uri: str | None = None) -> UiLink:
    """The experiment's runs table."""
    base, start = ui_base(uri)
    return UiLink(f"{base}/#/experiments/{urllib.parse.quote(str(experiment_id), safe='')}/runs?{ML_WORKFLOW}", start)


def run_link(run_id: str, experiment_id: str | None = None, uri: str | None = None) -> UiLink:
    """One run's page (the experiment is looked up when not given)."""
    if experiment_id is None:
        experiment_id = client().get_run(run_id).info.experiment_id
    base, start = ui_base(uri)
    exp = urllib.parse.quote(str(experiment_id), safe="")
    return UiLink(f"{base}/#/experiments/{exp}/runs/{urllib.parse.quote(run_id, safe='')}?{ML_WORKFLOW}", start)


def model_version_link(name: str, version: str | int, uri: str | None = None) -> UiLink:
    """A registered model version's page (its aliases, tags, source run and schema)."""
    base, start = ui_base(uri)
    path = f"/#/models/{urllib.parse.quote(name, safe='')}/versions/{urllib.parse.quote(str(version), safe='')}"
    return UiLink(f"{base}{path}?{ML_WORKFLOW}", start)


def model_version_link_by_alias(name: str, alias: str, uri: str | None = None) -> UiLink | None:
    """The link of the version that `alias` points at now; None when no version has it."""
    try:
        mv = client().get_model_version_by_alias(name, alias)
    except Exception:  # noqa: BLE001 - no such alias (or model)
        return None
    return model_version_link(name, mv.version, uri)
