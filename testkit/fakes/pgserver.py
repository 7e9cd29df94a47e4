"""A throwaway PostgreSQL (Debian's `postgresql` package) and an MLflow tracking server on it, for the fleet tests.

`initdb` refuses root, so as root the cluster belongs to the `postgres` user (Debian's package makes it) and every
PostgreSQL process runs as that user; otherwise as the current user. Both listen on 127.0.0.1 on a free port, in a
temporary folder, and can be restarted in place (same port, same data) for fault tests.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path | None:
    """The folder of Debian's PostgreSQL binaries (initdb, postgres), newest first; None when not installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(which).parent if which else None


def postgres_missing() -> str | None:
    """Why the PostgreSQL tests cannot run here (None: they can)."""
    if postgres_bin() is None:
        return "PostgreSQL is not installed (Debian: apt-get install postgresql; .ci/run does it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to own the cluster (initdb refuses root)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "the PostgreSQL driver is missing: pip install 'psycopg[binary]' (in the dev and fleet extras)"
    return None


class Postgres:
    """One cluster in `root`, database `mlflow`, user `dvfs` (trust auth on 127.0.0.1 only)."""

    def __init__(self, port: int | None = None):
        self.bin = postgres_bin()
        assert self.bin is not None
        # its own folder straight under the temp dir: the `postgres` user (as root) cannot enter pytest's 0700 folders
        self.root = Path(tempfile.mkdtemp(prefix="dvfs-pg-"))
        os.chmod(self.root, 0o755)
        self.data = self.root / "pgdata"
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._user = "postgres" if os.geteuid() == 0 else None
        self.data.mkdir()
        (self.root / "sock").mkdir()
        if self._user:
            for p in (self.root, self.data, self.root / "sock"):
                shutil.chown(p, self._user)
        subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "dvfs", "--auth=trust", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, user=self._user, timeout=120)
        self.start()
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE mlflow")
            conn.execute("CREATE DATABASE optuna")  # MLflow and Optuna both keep an alembic_version table: one database each

    def close(self) -> None:
        """Stop it and remove its folder."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, db: str = "mlflow") -> str:
        return f"postgresql://dvfs@127.0.0.1:{self.port}/{db}"

    @property
    def uri(self) -> str:
        return self.dsn()

    def start(self) -> None:
        log = open(self.root / "postgres.log", "ab")
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port), "-k", str(self.root / "sock"),
             "-F", "-c", "max_connections=200"],
            stdout=log, stderr=log, user=self._user, start_new_session=True)
        deadline = time.monotonic() + 60
        import psycopg

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.root / 'postgres.log').read_text()[-2000:]}")
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                time.sleep(0.2)
        raise RuntimeError(f"postgres did not start: {(self.root / 'postgres.log').read_text()[-2000:]}")

    def stop(self, mode: signal.Signals = signal.SIGINT) -> None:
        """SIGINT: PostgreSQL's fast shutdown (open connections are cut)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(mode)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)

    def restart(self) -> None:
        self.stop()
        self.start()


# MLflow 3's server starts a Huey job runner beside its workers (eight more Python processes, each importing mlflow)
# for GenAI jobs (scorers, trace roll-ups) that dvfs-mlops never submits: the test servers run without it.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class MlflowServer:
    """`mlflow server` on a backend store, with a local artifact destination served through the server."""

    def __init__(self, root: Path, backend_uri: str, port: int | None = None, workers: int = 2, start_timeout: float = 180):
        self.root = root
        self.backend_uri = backend_uri
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(start_timeout)

    def start(self, timeout: float = 180) -> None:
        mlflow_bin = str(Path(sys.executable).parent / "mlflow")
        self.proc = subprocess.Popen(
            [mlflow_bin, "server", "--backend-store-uri", self.backend_uri, "--artifacts-destination", str(self.root / "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)],
            stdout=subprocess.DEVNULL, stderr=open(self.root / "server.log", "ab"), start_new_session=True, cwd=self.root,
            env={**os.environ, **SERVER_ENV})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"mlflow server did not start: {(self.root / 'server.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def restart(self) -> None:
        self.stop()
        self.start()
