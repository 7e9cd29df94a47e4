"""Point claims: several workers given the same sweep split its points, each point run by one of them.

MLflow's REST API has no compare-and-set; a claim lives in what the fleet already has:
- `PostgresClaims` (`--claims postgresql://...`, `$DVFS_CLAIMS_URI`, or a `postgresql://` tracking store): one row per
  point in the table `dvfs_point_claims`. A claim is one `INSERT ... ON CONFLICT DO UPDATE ... WHERE` statement, which
  PostgreSQL runs under the row's lock: of two workers only one gets the row back.
- `FileClaims` (a `sqlite:///` or file tracking store: workers on one machine): a JSON table beside the store,
  read and written under an exclusive `flock`.
- `TrackingClaims` (an http(s) tracking server, or any other store, and no claims URI; `--claims tracking`): the
  claim is the point's run itself, written and then read back through the tracking API (an optimistic claim: a
  worker that finds another live claim of the point backs off). Boards that reach only the tracking server split
  a sweep with no settings.
- `NoClaims` (`--claims none`): every claim succeeds, so nothing keeps two workers off one point; safe only for
  workers given disjoint sweeps (said once, at WARNING).

A claim is a lease: it expires `ttl_s` after its last renewal. The worker renews it from a heartbeat thread while
the point runs, so only a worker that died (or lost its network for a whole TTL) loses it; another worker then
takes the point over. `FileClaims` need not wait: its workers share one machine, so a claim whose process is gone
(`kill -9`, a crash) is taken over at once. A finished point is marked done, and a done point is never claimed again.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import fcntl
import functools
import json
import logging
import math
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError, TrackingStoreError
from dvfs_mlops.mlops import schema
from dvfs_mlops.mlops.tracking import without_password

if TYPE_CHECKING:
    import psycopg
    from mlflow.entities import Run
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 120.0
T = TypeVar("T")


class Claim(enum.Enum):
    """What a claim attempt found: TAKEN (the point is now this worker's), HELD (a live worker has it), DONE."""

    TAKEN = "taken"
    HELD = "held"
    DONE = "done"

    def __bool__(self) -> bool:
        return self is Claim.TAKEN


class PointClaims(Protocol):
    kind: str

    def claim(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> Claim: ...

    def renew(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> bool:
        """Extend this worker's lease; False when the point is no longer this worker's (it expired and was taken)."""
        ...

    def release(self, sweep_id: str, point_key: str, worker: str, done: bool) -> None:
        """done: the point is finished for good; else it is free again at once (the point failed here)."""
        ...

    def forget(self, sweep_id: str, point_key: str) -> None:
        """Drop a point's claim whatever its state: its done mark outlived its run (a run deleted from the store)."""
        ...

    def bind(self, target: ClaimTarget) -> None:
        """The sweep this store is asked about, once its parent run exists (used by `TrackingClaims` only)."""
        ...

    def run_of(self, sweep_id: str, point_key: str) -> str | None:
        """The MLflow run that is this worker's claim of the point (`TrackingClaims`), which the point then logs into;
        None where a claim is no run (the point creates its own)."""
        ...

    def close(self) -> None: ...


def claim_scope(sweep_id: str, experiment_id: str, tracking_uri: str) -> str:
    """What a claim's sweep is: the same sweep id in another store or experiment is another set of points."""
    return f"{sweep_id}|{experiment_id}|{without_password(tracking_uri)}"


def default_worker(device_id: str = "") -> str:
    """Who holds a claim: the board, the host and the process (a log reader can find it)."""
    host = socket.gethostname()
    return f"{device_id or host}@{host}:{os.getpid()}"


class NoClaims:
    """No claim store: every point is this worker's (workers must be given disjoint sweeps)."""

    kind = "none"

    def claim(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> Claim:
        return Claim.TAKEN

    def renew(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> bool:
        return True

    def release(self, sweep_id: str, point_key: str, worker: str, done: bool) -> None:
        pass

    def forget(self, sweep_id: str, point_key: str) -> None:
        pass

    def bind(self, target: ClaimTarget) -> None:
        pass

    def run_of(self, sweep_id: str, point_key: str) -> str | None:
        return None

    def close(self) -> None:
        pass


class FileClaims:
    """Claims of workers on one machine: `<store>.claims.json`, read-modify-written under `flock`."""

    kind = "file"

    def __init__(self, path: Path):
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")

    @contextlib.contextmanager
    def _table(self) -> Iterator[dict[str, dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                table = json.loads(self.path.read_text()) if self.path.exists() else {}
            except (OSError, ValueError):
                log.warning("point claims %s unreadable; starting it afresh", self.path)
                table = {}
            before = json.dumps(table, sort_keys=True)
            yield table
            if json.dumps(table, sort_keys=True) != before:
                tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(table))
                os.replace(tmp, self.path)

    def claim(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> Claim:
        now = time.time()
        with self._table() as t:
            row = t.get(f"{sweep_id}|{point_key}")
            if row and row.get("done"):
                return Claim.DONE
            if row and row["worker"] != worker and row["expires_at"] > now:
                if not process_gone(row):
                    return Claim.HELD
                log.info("point %s: its worker %s is gone from this machine; taking the point over", point_key, row["worker"])
            t[f"{sweep_id}|{point_key}"] = {"worker": worker, "expires_at": now + ttl_s, "done": False, **this_process()}
            return Claim.TAKEN

    def renew(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> bool:
        with self._table() as t:
            row = t.get(f"{sweep_id}|{point_key}")
            if not row or row["worker"] != worker or row.get("done"):
                return False
            row["expires_at"] = time.time() + ttl_s
            return True

    def release(self, sweep_id: str, point_key: str, worker: str, done: bool) -> None:
        with self._table() as t:
            key = f"{sweep_id}|{point_key}"
            row = t.get(key)
            if row and row["worker"] == worker:
                if done:
                    row["done"], row["expires_at"] = True, 0.0
                else:
                    del t[key]

    def forget(self, sweep_id: str, point_key: str) -> None:
        with self._table() as t:
            t.pop(f"{sweep_id}|{point_key}", None)

    def bind(self, target: ClaimTarget) -> None:
        pass

    def run_of(self, sweep_id: str, point_key: str) -> str | None:
        return None

    def close(self) -> None:
        pass


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first; the start time is index 19, field 22 of
    proc(5)); None where /proc has no answer. A pid and its start name one process for good: a reused pid has another."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@functools.cache
def _machine() -> str | None:
    """Which kernel and pid namespace this process sees: the boot id and /proc/self/ns/pid. Two containers that share
    a host name (host networking, boards cloned from one image) differ here, so neither judges the other's pids.
    None where /proc cannot say (not Linux): such claims are never judged, only waited out."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}|{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def this_process() -> dict[str, Any]:
    """This process, as another one on the same machine can check it (`process_gone`): machine, pid and the pid's start
    (a claim's holder, a sweep's parent run)."""
    pid = os.getpid()
    stat = _proc_stat(pid)
    return {"machine": _machine(), "pid": pid, "pid_start": stat[19] if stat else None}


def process_gone(row: dict[str, Any]) -> bool:
    """A process (`this_process`: a claim's holder, a parent run's) that ran on this machine (same kernel boot, same pid
    namespace) and is gone (kill -9, a crash): nobody renews its claim, so waiting out its lease would only stall the
    worker started in its place, and nobody will end its run.
    Anything this process cannot be sure of (another machine, a row without the claimant, no /proc) counts as alive."""
    machine, pid, started = row.get("machine"), row.get("pid"), row.get("pid_start")
    if machine is None or machine != _machine() or not isinstance(pid, int) or started is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    stat = _proc_stat(pid)
    return stat is not None and (stat[0] == "Z" or stat[19] != started)  # a zombie, or a pid the kernel gave another process


@dataclasses.dataclass(frozen=True)
class ClaimTarget:
    """The sweep whose points a claim store is asked about, as the tracking store has it (what `TrackingClaims` writes
    its claim runs into; the other stores need only the scope string)."""

    client: MlflowClient
    experiment_id: str
    sweep_id: str
    parent_id: str


@dataclasses.dataclass
class ClaimStats:
    """What one worker's tracking claims cost it: claims it backed off from, the seconds those attempts took (write,
    read back, withdraw), and stale claims it took over."""

    backoffs: int = 0
    backoff_s: float = 0.0
    takeovers: int = 0


@dataclasses.dataclass
class _Sighting:
    beat: str | None
    since: float  # time.monotonic() when this worker first saw the run at this heartbeat


class TrackingClaims:
    """Claims through the MLflow tracking API alone (an http(s) server that the fleet shares, any store): the claim IS
    the point's run.

    A claim writes before it reads: the worker creates the point's run (RUNNING, tagged with the point, itself, its
    lease and a heartbeat counter), then searches the point's runs. Another live claim (a FINISHED run, or a RUNNING
    one of another worker that is not stale) makes it back off: its own run is deleted, the point answered HELD (or
    DONE). Of two workers claiming at once, the one whose search ran second sees the first one's run, so at most one
    proceeds (both may back off: the point is asked again later). A store that reads its own writes is needed (MLflow's
    SQL stores, behind one server or many: a run and its tags are one transaction, committed before the request
    returns: `SqlAlchemyStore.create_run`).

    A lease is judged without trusting another board's clock: the holder bumps its run's `dvfs.claim_beat` every
    third of its TTL; a RUNNING run whose beat this worker has seen unchanged for the run's own TTL (`dvfs.claim_ttl_s`,
    by this worker's monotonic clock) is stale, and so is one whose claiming process ran on this machine and is gone
    (`dvfs.claim_process`, judged as `FileClaims` judges its rows: a worker restarted after `kill -9` need not wait
    out its own old lease): the taker claims the point anew and, once it won, marks the stale run
    FAILED (tag `dvfs.claim_lost` = `lease expired` or `claimant gone`). A RUNNING point run with no claim tags (a worker without claims, a
    crash) is judged the same way. The holder's heartbeat finds its run no longer RUNNING, or the point FINISHED by
    another, and gives the point up (`Lease.lost`; `still_mine` before FINISHED)."""

    kind = "tracking"

    def __init__(self) -> None:
        self.target: ClaimTarget | None = None
        self.stats = ClaimStats()
        self._mine: dict[str, str] = {}  # point key -> this worker's claim run
        self._beats: dict[str, int] = {}
        self._seen: dict[str, _Sighting] = {}  # another worker's RUNNING claim run -> its heartbeat as last seen
        self._lock = threading.Lock()

    def bind(self, target: ClaimTarget) -> None:
        self.target = target

    def _t(self) -> ClaimTarget:
        if self.target is None:
            raise RuntimeError("TrackingClaims used before bind(ClaimTarget)")
        return self.target

    def _call(self, fn: Callable[[], T]) -> T:
        """An MLflow call; a store that fails is a TrackingStoreError (the runner rides out a transient one)."""
        from mlflow.exceptions import MlflowException

        from dvfs_mlops.mlops import tracking

        try:
            return fn()
        except (MlflowException, OSError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            raise TrackingStoreError(f"the tracking store {without_password(tracking.tracking_uri())} failed while claiming a point "
                                     f"({first}); no clock was left changed; re-run the same sweep to resume",
                                     cause=first, transient=tracking.is_store_outage(e)) from None

    def _runs(self, point_key: str) -> list[Run]:
        t = self._t()
        filt = f"tags.`{schema.TAG_SWEEP}` = '{t.sweep_id}' and tags.`{schema.TAG_POINT}` = '{point_key}'"
        return self._call(lambda: t.client.search_runs([t.experiment_id], filter_string=filt, max_results=1000))

    def _stale(self, run: Run, ttl_s: float) -> str | None:
        """Why a RUNNING run of another worker is no live claim: its heartbeat this worker has seen unchanged for the
        run's own TTL ("lease expired"), or its process ran on this machine and is gone ("claimant gone"); None: live."""
        now = time.monotonic()
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            if process_gone(json.loads(run.data.tags.get(schema.TAG_CLAIM_PROCESS) or "{}")):
                return "claimant gone"  # kill -9 on this machine: nobody will beat it again
        beat = run.data.tags.get(schema.TAG_CLAIM_BEAT)
        seen = self._seen.get(run.info.run_id)
        if seen is None or seen.beat != beat:
            self._seen[run.info.run_id] = _Sighting(beat, now)
            return None
        try:
            lease = float(run.data.tags.get(schema.TAG_CLAIM_TTL, ttl_s))
        except ValueError:
            lease = ttl_s
        return "lease expired" if now - seen.since >= lease else None

    def _others(self, point_key: str, worker: str, ttl_s: float) -> tuple[Claim | None, dict[str, str]]:
        """(DONE or HELD when another claim counts, else None; the stale RUNNING runs of others, and why)."""
        stale: dict[str, str] = {}
        held = False
        for r in self._runs(point_key):
            if r.info.status == "FINISHED":
                return Claim.DONE, {}
            if r.info.status not in ("RUNNING", "SCHEDULED") or r.data.tags.get(schema.TAG_CLAIM_WORKER) == worker:
                continue
            if why := self._stale(r, ttl_s):
                stale[r.info.run_id] = why
            else:
                held = True
        return (Claim.HELD if held else None), stale

    def claim(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> Claim:
        t = self._t()
        if point_key in self._mine:  # its own claim again
            return Claim.TAKEN
        seen, _ = self._others(point_key, worker, ttl_s)  # cheap: no run written for a point that is done or held
        if seen is not None:
            return seen
        started = time.monotonic()
        tags = {schema.TAG_SWEEP: t.sweep_id, schema.TAG_POINT: point_key, schema.TAG_PARENT: t.parent_id,
                schema.TAG_CLAIM_WORKER: worker, schema.TAG_CLAIM_TTL: f"{ttl_s:g}", schema.TAG_CLAIM_BEAT: "0",
                schema.TAG_CLAIM_PROCESS: json.dumps(this_process())}
        run_id = self._call(lambda: t.client.create_run(t.experiment_id, run_name=point_key, tags=tags)).info.run_id
        try:
            seen, stale = self._others(point_key, worker, ttl_s)  # written, now read: who else claims it
        except BaseException:
            with contextlib.suppress(Exception):
                t.client.delete_run(run_id)
            raise
        if seen is not None:
            self._call(lambda: t.client.delete_run(run_id))  # backed off: not a live claim any more
            self.stats.backoffs += 1
            self.stats.backoff_s += time.monotonic() - started
            log.debug("point %s: another worker's claim counts (%s); backed off", point_key, seen.value)
            return seen
        for old, why in stale.items():
            log.info("point %s: claim run %s is stale (%s); taking the point over", point_key, old, why)
            self._call(functools.partial(t.client.set_tag, old, schema.TAG_CLAIM_LOST, why))
            self._call(functools.partial(t.client.set_terminated, old, "FAILED"))
            self.stats.takeovers += 1
        with self._lock:
            self._mine[point_key], self._beats[point_key] = run_id, 0
        return Claim.TAKEN

    def run_of(self, sweep_id: str, point_key: str) -> str | None:
        return self._mine.get(point_key)

    def renew(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> bool:
        t = self._t()
        run_id = self._mine.get(point_key)
        if run_id is None:
            return False
        run = self._call(lambda: t.client.get_run(run_id))
        if run.info.status != "RUNNING" or run.data.tags.get(schema.TAG_CLAIM_LOST) \
                or any(r.info.status == "FINISHED" for r in self._runs(point_key)):
            with self._lock:  # lost for good: a later claim of the point is a new run, not this one
                if self._mine.get(point_key) == run_id:
                    del self._mine[point_key]
                    self._beats.pop(point_key, None)
            return False
        with self._lock:
            self._beats[point_key] = beat = self._beats.get(point_key, 0) + 1
        self._call(lambda: t.client.set_tag(run_id, schema.TAG_CLAIM_BEAT, str(beat)))
        return True

    def release(self, sweep_id: str, point_key: str, worker: str, done: bool) -> None:
        """done: the run FINISHED is the mark; else a claim run that never started its point is deleted (a run the
        point left FAILED or KILLED stays, as the record of what happened)."""
        with self._lock:
            run_id = self._mine.pop(point_key, None)
            self._beats.pop(point_key, None)
        if done or run_id is None:
            return
        t = self._t()
        run = self._call(lambda: t.client.get_run(run_id))
        if run.info.status in ("RUNNING", "SCHEDULED"):
            self._call(lambda: t.client.delete_run(run_id))

    def forget(self, sweep_id: str, point_key: str) -> None:
        pass  # a point is done only while its FINISHED run exists

    def close(self) -> None:
        pass


_PG_SCHEMA = """CREATE TABLE IF NOT EXISTS dvfs_point_claims (
    sweep_id text NOT NULL, point_key text NOT NULL, worker text NOT NULL,
    expires_at timestamptz NOT NULL, done boolean NOT NULL DEFAULT false, claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sweep_id, point_key))"""

# One statement: PostgreSQL takes the row's lock for the conflict update, so two workers cannot both get a row back.
_PG_CLAIM = """INSERT INTO dvfs_point_claims AS c (sweep_id, point_key, worker, expires_at)
VALUES (%(s)s, %(p)s, %(w)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (sweep_id, point_key) DO UPDATE SET worker = EXCLUDED.worker, expires_at = EXCLUDED.expires_at, claimed_at = now()
WHERE NOT c.done AND (c.expires_at < now() OR c.worker = EXCLUDED.worker)
RETURNING worker"""


def _pg_dsn(uri: str) -> str:
    """`postgresql+psycopg2://...` (SQLAlchemy's spelling, as MLflow and Optuna take it) -> libpq's `postgresql://...`."""
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme == "postgres":
        scheme = "postgresql"
    return urllib.parse.urlunsplit(parts._replace(scheme=scheme))


class PostgresClaims:
    """Claims in the fleet's PostgreSQL. A connection that drops (a database restart) is reopened and the statement
    retried for up to `retry_s`: every statement is idempotent for its worker."""

    kind = "postgresql"

    def __init__(self, uri: str, retry_s: float = 90.0, first_retry_s: float = 5.0):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise DvfsError("point claims on PostgreSQL need the psycopg driver: pip install 'dvfs-mlops[fleet]'") from None
        self.dsn = _pg_dsn(uri)
        self.retry_s = retry_s
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()  # the heartbeat thread and the sweep share the connection
        self._run(lambda cur: cur.execute(_PG_SCHEMA), first_retry_s)  # a database that is down: said before any clock is touched

    def _connect(self, timeout_s: float) -> psycopg.Connection:
        import psycopg

        # libpq's connect_timeout: whole seconds, at least 2 (libpq's own floor: PostgreSQL docs, libpq-connect.html)
        return psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(2, min(10, math.ceil(timeout_s))))

    def _run(self, fn: Callable[[psycopg.Cursor], T], retry_s: float | None = None) -> T:
        import psycopg

        window_s = self.retry_s if retry_s is None else retry_s
        deadline = time.monotonic() + window_s
        delay = 0.5
        with self._lock:
            while True:
                try:
                    if self._conn is None or self._conn.closed:
                        self._conn = self._connect(deadline - time.monotonic())
                    with self._conn.cursor() as cur:
                        return fn(cur)
                except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject, psycopg.errors.DuplicateTable):
                    continue  # two first CREATE TABLE IF NOT EXISTS at once: the other one won, the retry sees its table
                except psycopg.OperationalError as e:
                    with contextlib.suppress(Exception):
                        self._conn.close()  # type: ignore[union-attr]  # None: suppressed like any other failure
                    self._conn = None
                    left_s = deadline - time.monotonic()
                    if left_s <= 0:
                        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
                        raise DvfsError(f"the point-claims database {without_password(self.dsn)} is unreachable (tried for "
                                        f"{window_s:g} s: {first}); start it, or give --claims (${settings.CLAIMS_ENV}) another store") from None
                    log.info("point claims: database unreachable (%s); retrying in %.1f s", str(e).strip()[:120], min(delay, left_s))
                    time.sleep(min(delay, left_s))  # the last try at the deadline, not after it
                    delay = min(delay * 2, 5.0)

    def claim(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> Claim:
        def go(cur: psycopg.Cursor) -> Claim:
            cur.execute(_PG_CLAIM, {"s": sweep_id, "p": point_key, "w": worker, "ttl": float(ttl_s)})
            if cur.fetchone() is not None:
                return Claim.TAKEN
            cur.execute("SELECT done FROM dvfs_point_claims WHERE sweep_id = %s AND point_key = %s", (sweep_id, point_key))
            row = cur.fetchone()
            return Claim.DONE if row and row[0] else Claim.HELD

        return self._run(go)

    def renew(self, sweep_id: str, point_key: str, worker: str, ttl_s: float) -> bool:
        def go(cur: psycopg.Cursor) -> bool:
            cur.execute("UPDATE dvfs_point_claims SET expires_at = now() + make_interval(secs => %s) "
                        "WHERE sweep_id = %s AND point_key = %s AND worker = %s AND NOT done", (float(ttl_s), sweep_id, point_key, worker))
            return cur.rowcount == 1

        return self._run(go)

    def release(self, sweep_id: str, point_key: str, worker: str, done: bool) -> None:
        if done:
            sql = "UPDATE dvfs_point_claims SET done = true WHERE sweep_id = %s AND point_key = %s AND worker = %s"
        else:
            sql = "DELETE FROM dvfs_point_claims WHERE sweep_id = %s AND point_key = %s AND worker = %s AND NOT done"
        self._run(lambda cur: cur.execute(sql, (sweep_id, point_key, worker)))

    def forget(self, sweep_id: str, point_key: str) -> None:
        self._run(lambda cur: cur.execute("DELETE FROM dvfs_point_claims WHERE sweep_id = %s AND point_key = %s", (sweep_id, point_key)))

    def bind(self, target: ClaimTarget) -> None:
        pass

    def run_of(self, sweep_id: str, point_key: str) -> str | None:
        return None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None


def open_claims(claims_uri: str | None, tracking_uri: str) -> PointClaims:
    """The claim store for a sweep: `claims_uri` (else $DVFS_CLAIMS_URI), else one beside the tracking store.

    `postgresql://...` and `file://...` name a store; `tracking` claims through the tracking API; `none` claims
    nothing (said once, at WARNING: workers given the same sweep then run the same points). Unset: the tracking
    store's PostgreSQL database, a file beside a SQLite or file store, else (an http(s) server, any other store) the
    tracking API itself (`TrackingClaims`)."""
    uri = claims_uri or settings.claims_uri()
    if uri.lower() == "none":
        log.warning("point claims off (--claims none / %s=none): workers given the same sweep will run the same points; "
                    "give each worker its own workloads, or drop the setting to split the sweep", settings.CLAIMS_ENV)
        return NoClaims()
    if uri.lower() == "tracking":
        return TrackingClaims()
    if uri:
        scheme = urllib.parse.urlsplit(uri).scheme.split("+", 1)[0]
        if scheme in ("postgresql", "postgres"):
            return PostgresClaims(uri)
        if scheme == "file":
            return FileClaims(Path(urllib.parse.unquote(urllib.parse.urlsplit(uri).path)))
        raise DvfsError(f"--claims {without_password(uri)}: give a postgresql:// URL, a file:// path, 'tracking' or 'none'")
    scheme = urllib.parse.urlsplit(tracking_uri).scheme.split("+", 1)[0]
    if scheme in ("postgresql", "postgres"):
        return PostgresClaims(tracking_uri)
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        return FileClaims(db.with_name(db.name + ".claims.json"))
    if scheme == "file" or not scheme or len(scheme) == 1:
        path = Path(urllib.parse.unquote(urllib.parse.urlsplit(tracking_uri).path)) if scheme == "file" else Path(tracking_uri)
        return FileClaims(path / "dvfs-claims.json")
    return TrackingClaims()


@dataclasses.dataclass
class Lease:
    """A claimed point, renewed every ttl/3 by a daemon thread until `stop`; `lost` once another worker has it."""

    claims: PointClaims
    sweep_id: str
    point_key: str
    worker: str
    ttl_s: float
    lost: bool = False
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        if self.claims.kind != "none":
            self._thread = threading.Thread(target=self._beat, name=f"claim {self.point_key}", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not self.claims.renew(self.sweep_id, self.point_key, self.worker, self.ttl_s):
                    self.lost = True
                    log.warning("claim on %s lost: another worker took it over", self.point_key)
                    return
            except Exception as e:  # noqa: BLE001 - the next beat retries; `still_mine` decides at the end
                log.info("claim on %s not renewed (%s)", self.point_key, e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def still_mine(self) -> bool:
        """Renew once more, right before the point's result is committed: False when another worker took it over.
        The heartbeat keeps beating until `stop`: committing the result can itself outlast a TTL (MLflow's client
        retrying through a server or database restart), and a lease let lapse there would let another worker kill
        this run and measure the point again while the late commit still marks this one FINISHED."""
        if self.lost:
            return False
        return self.claims.renew(self.sweep_id, self.point_key, self.worker, self.ttl_s)
