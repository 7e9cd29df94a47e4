"""A fleet on a real database: point claims, boards sharing one sweep, device ids (PostgreSQL + `mlflow server`).

The PostgreSQL tests skip, saying why, where Debian's `postgresql` package or psycopg is missing (`.ci/run` installs both).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from dvfs_mlops.mlops.claims import Claim, FileClaims, NoClaims, PostgresClaims, TrackingClaims, claim_scope, open_claims
from tests.conftest import REPO, run_cli


def _race(make, n: int = 12) -> list[Claim]:
    """n claimers, each with its own store handle, claim one point at the same moment."""
    barrier = threading.Barrier(n, timeout=30)  # a claimer that fails breaks it: no hang
    results: list[Claim] = [Claim.HELD] * n

    def go(i: int) -> None:
        store = make()
        barrier.wait()
        results[i] = store.claim("s1", "bert-tiny/sst2@816#0", f"w{i}", 30)
        store.close()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def _lifecycle(store, key: str) -> None:
    """Claimed once; a second worker is refused while the lease lives, takes it over once it expires; the old holder
    can no longer renew; a done point is never claimed again; a failed point is free at once."""
    assert store.claim("s1", key, "a", 0.6) is Claim.TAKEN
    assert store.claim("s1", key, "a", 0.6) is Claim.TAKEN  # its own claim again: renewed
    assert store.claim("s1", key, "b", 30) is Claim.HELD
    time.sleep(0.9)
    assert store.claim("s1", key, "b", 30) is Claim.TAKEN  # a's lease expired: taken over
    assert store.renew("s1", key, "a", 30) is False
    assert store.renew("s1", key, "b", 30) is True
    store.release("s1", key, "b", done=True)
    assert store.claim("s1", key, "c", 30) is Claim.DONE
    assert store.claim("s2", key, "c", 30) is Claim.TAKEN  # another sweep, another point
    store.release("s2", key, "c", done=False)
    assert store.claim("s2", key, "d", 30) is Claim.TAKEN
    store.forget("s1", key)  # a done mark whose run was deleted from the store
    assert store.claim("s1", key, "e", 30) is Claim.TAKEN


def test_file_claims_one_winner_expiry_and_done(tmp_path):
    results = _race(lambda: FileClaims(tmp_path / "claims.json"))
    assert Counter(results) == {Claim.TAKEN: 1, Claim.HELD: 11}
    _lifecycle(FileClaims(tmp_path / "other.json"), "m/t@510#0")


_CLAIM_AND_EXIT = "import sys; from pathlib import Path; from dvfs_mlops.mlops.claims import FileClaims; " \
                  "print(FileClaims(Path(sys.argv[1])).claim('s1', sys.argv[2], 'board@somewhere:1', 300).value, flush=True)"


def _claim_in_a_child(path: Path, key: str) -> subprocess.Popen:
    """Another worker process claims `key` and exits (not reaped: a zombie until the caller waits for it)."""
    child = subprocess.Popen([sys.executable, "-c", _CLAIM_AND_EXIT, str(path), key], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "taken"
    return child


def test_a_file_claim_whose_process_is_gone_is_taken_over_at_once(tmp_path):
    """One machine: a worker killed with -9 renews nothing, and its pid says so; the next worker takes its points
    without waiting out the lease. A live claimant, or one this process cannot judge (another machine or pid
    namespace, a row without the claimant), still holds."""
    import json

    path = tmp_path / "claims.json"
    store = FileClaims(path)
    zombie = _claim_in_a_child(path, "p-zombie")  # exited, not yet reaped: dead all the same
    for _ in range(600):  # up to 30 s on a loaded machine; most often well under 1 s
        if Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    assert store.claim("s1", "p-zombie", "me", 300) is Claim.TAKEN
    zombie.wait()
    gone = _claim_in_a_child(path, "p-gone")
    gone.wait()
    elsewhere = _claim_in_a_child(path, "p-elsewhere")
    elsewhere.wait()
    unknown = _claim_in_a_child(path, "p-unknown")
    unknown.wait()
    table = json.loads(path.read_text())
    table["s1|p-elsewhere"]["machine"] = "another-boot|pid:[4026531836]"  # same host name, another container or board
    for field in ("machine", "pid", "pid_start"):
        table["s1|p-unknown"].pop(field)  # written by a version that did not record its claimant
    path.write_text(json.dumps(table))
    assert store.claim("s1", "p-gone", "me", 300) is Claim.TAKEN
    assert store.claim("s1", "p-elsewhere", "me", 300) is Claim.HELD
    assert store.claim("s1", "p-unknown", "me", 300) is Claim.HELD
    assert store.claim("s1", "p-live", "a", 300) is Claim.TAKEN
    assert FileClaims(path).claim("s1", "p-live", "b", 300) is Claim.HELD  # its claimant (this process) is alive
    table = json.loads(path.read_text())
    table["s1|p-live"]["pid_start"] = "1"  # the same pid, another start: the kernel gave the pid to a new process
    path.write_text(json.dumps(table))
    assert store.claim("s1", "p-live", "b", 300) is Claim.TAKEN


def test_claims_follow_the_tracking_store(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("DVFS_CLAIMS_URI", raising=False)
    store = open_claims(None, f"sqlite:///{tmp_path}/mlflow.db")
    assert isinstance(store, FileClaims) and store.path == tmp_path / "mlflow.db.claims.json"
    assert isinstance(open_claims(None, "http://127.0.0.1:5000"), TrackingClaims)  # boards that reach only the server
    assert isinstance(open_claims("tracking", f"sqlite:///{tmp_path}/mlflow.db"), TrackingClaims)
    with caplog.at_level(logging.WARNING, logger="dvfs_mlops.mlops.claims"):
        assert isinstance(open_claims("none", f"sqlite:///{tmp_path}/mlflow.db"), NoClaims)
    assert [r.levelname for r in caplog.records if "will run the same points" in r.message] == ["WARNING"]
    monkeypatch.setenv("DVFS_CLAIMS_URI", f"file://{tmp_path}/c.json")
    assert isinstance(open_claims(None, "http://127.0.0.1:5000"), FileClaims)


def test_postgres_claims_one_winner_expiry_done_and_restart(fleet_pg):
    results = _race(lambda: PostgresClaims(fleet_pg.uri), n=16)
    assert Counter(results) == {Claim.TAKEN: 1, Claim.HELD: 15}
    store = PostgresClaims(fleet_pg.uri.replace("postgresql://", "postgresql+psycopg2://"))  # SQLAlchemy's spelling too
    _lifecycle(store, f"m/t@510#{uuid.uuid4().hex[:6]}")
    key = f"m/t@816#{uuid.uuid4().hex[:6]}"
    assert store.claim("s3", key, "a", 60) is Claim.TAKEN
    fleet_pg.restart()  # the connection drops: reopened, the statement retried
    assert store.renew("s3", key, "a", 60) is True
    assert store.claim("s3", key, "b", 60) is Claim.HELD
    store.close()


def _sweep(python: str, exp: str, *extra: str) -> list[str]:
    return [python, "-m", "dvfs_mlops", "sweep", "--preset", "smoke", "--models", "bert-tiny,pythia-14m", "--tasks", "sst2",
            "--freqs", "510,816,1300.5", "--steps", "0", "--profile-steps", "20", "--device", "sim", "--experiment", exp, *extra]


def _point_runs(uri: str, exp: str) -> list:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    e = c.get_experiment_by_name(exp)
    return c.search_runs([e.experiment_id], filter_string="tags.`dvfs.point` != ''", max_results=5000)


EXPECTED = sorted(f"{m}/sst2@{f}#0" for m in ("bert-tiny", "pythia-14m") for f in ("maxn", "510", "816", "1300.5"))


@pytest.mark.slow
def test_a_dead_workers_claim_expires_and_is_taken_over(fleet_server, fleet_pg, warm):
    """A worker died holding a point (its claim, its RUNNING run): the next worker waits out the claim, kills the run,
    and runs the point itself. The claim is kept alive (renewed, as its live worker would) until the new worker has
    run every other point, however slow its start-up, and then left to expire: the worker's death."""
    from mlflow.tracking import MlflowClient

    exp, sid = f"fleet-{uuid.uuid4().hex[:6]}", f"sweep-dead-{uuid.uuid4().hex[:6]}"
    c = MlflowClient(tracking_uri=fleet_server.uri)
    exp_id = c.create_experiment(exp)
    key = "bert-tiny/sst2@816#0"
    dead = c.create_run(exp_id, run_name=key, tags={"dvfs.sweep_id": sid, "dvfs.point": key})
    scope, holder = claim_scope(sid, exp_id, fleet_server.uri), "dead-board@gone:1"
    store = PostgresClaims(fleet_pg.uri)
    assert store.claim(scope, key, holder, 5) is Claim.TAKEN
    died = threading.Event()
    lapses: list[float] = []  # a renewal that failed (asserted below: a thread's own assert fails nothing)

    def heartbeat() -> None:
        while not died.wait(1.0):
            if not store.renew(scope, key, holder, 5):
                lapses.append(time.monotonic())

    beating = threading.Thread(target=heartbeat)
    beating.start()
    env = {**os.environ, "MLFLOW_TRACKING_URI": fleet_server.uri, "DVFS_CLAIMS_URI": fleet_pg.uri}
    proc = subprocess.Popen(_sweep(warm.python, exp, "--sweep-id", sid, "--claim-ttl-s", "4"), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    err = []
    try:
        for line in proc.stderr:
            err.append(line)
            if line.startswith("[7/8]"):  # every point but the held one is done: the holder dies now
                died.set()
                beating.join()
        out = proc.stdout.read()
        proc.wait(timeout=300)
    finally:
        died.set()
        beating.join()
        store.close()
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(err)
    assert lapses == []  # the claim was held, alive, until the holder "died"
    assert proc.returncode == 0, stderr[-3000:]
    assert "ran 8 points" in out
    assert "waiting for 1 point(s) other workers hold" in stderr
    runs = _point_runs(fleet_server.uri, exp)
    assert sorted(x.data.tags["dvfs.point"] for x in runs if x.info.status == "FINISHED") == EXPECTED
    assert c.get_run(dead.info.run_id).info.status == "KILLED"


@pytest.mark.slow
def test_two_workers_split_one_sweep_on_sqlite(tmp_path, empty_store, warm):
    """A local SQLite store: the claims are a locked file beside it, no configuration."""
    exp = "local-fleet"
    env = {**os.environ, "MLFLOW_TRACKING_URI": empty_store}
    env.pop("DVFS_CLAIMS_URI", None)
    procs = [subprocess.Popen(_sweep(warm.python, exp), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    runs = _point_runs(empty_store, exp)
    assert sorted(r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED") == EXPECTED
    assert len(runs) == len(EXPECTED)
    assert Path(empty_store[len("sqlite:///"):] + ".claims.json").exists()


@pytest.mark.slow
def test_train_learns_from_a_fleets_sweeps_and_shares_one_study(fleet_server, fleet_pg, warm):
    """Two boards, two sweeps, one governor (never across device profiles unless told); two `train` processes on one
    Optuna study in the same PostgreSQL split its trials."""
    import optuna

    from dvfs_mlops.model.governor.search import storage_url

    exp = f"fleet-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": fleet_server.uri, "DVFS_CLAIMS_URI": fleet_pg.uri}
    base = ["sweep", "--preset", "smoke", "--tasks", "sst2,mrpc", "--freqs", "510,816,1300.5", "--steps", "0", "--profile-steps", "20",
            "--device", "sim", "--experiment", exp]
    boards = [("orin-a", ["--models", "bert-tiny,pythia-14m"]), ("orin-b", ["--models", "bert-mini,pythia-31m"]),
              ("orin-m", ["--models", "bert-tiny", "--twin-profile", "sim-orin-measured"])]
    procs = [subprocess.Popen([warm.python, "-m", "dvfs_mlops", *base, *extra, "--device-id", board], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for board, extra in boards]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    runs = _point_runs(fleet_server.uri, exp)
    sweep_of = {r.data.tags["dvfs.device_id"]: r.data.tags["dvfs.sweep_id"] for r in runs}
    assert len(set(sweep_of.values())) == 3

    mixed = run_cli("train", "--experiment", exp, "--sweep-id", f"{sweep_of['orin-a']},{sweep_of['orin-m']}", "--trials", "2",
                 "--no-register", env=env)
    assert mixed.returncode == 2 and "mix 2 device profiles" in mixed.stderr and "Traceback" not in mixed.stderr, mixed.stderr[-2000:]

    storage = fleet_pg.dsn("optuna")  # the Optuna study lives in the fleet's PostgreSQL too (its own database)
    study = f"fleet-study-{uuid.uuid4().hex[:6]}"
    args = ["train", "--experiment", exp, "--sweeps-filter", "params.device_profile = 'sim-orin'", "--trials", "4", "--outer-trials", "2",
            "--no-register", "--storage", storage, "--study-name", study, "--cv-split", "workload"]
    trainers = [subprocess.Popen([warm.python, "-m", "dvfs_mlops", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in trainers:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert "training on 2 sweeps" in err and "8 training workloads" in err, err[-2000:]
        assert "held-out regret" in out
    trials = optuna.load_study(study_name=study, storage=storage_url(storage)).trials
    assert len(trials) == 8 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trials}) >= 5  # each process samples its own trials

    # one database for the fleet: the study in the MLflow server's own PostgreSQL database (its schema `optuna`)
    beside = run_cli(*args[:args.index("--storage")], "--trials", "2", "--outer-trials", "2", "--storage", fleet_pg.dsn("mlflow"),
                     "--study-name", study, env=env)
    assert beside.returncode == 0 and "Traceback" not in beside.stderr, beside.stderr[-3000:]
    beside_trials = optuna.load_study(study_name=study, storage=storage_url(fleet_pg.dsn("mlflow"))).trials
    done = [t for t in beside_trials if t.state == optuna.trial.TrialState.COMPLETE]
    # --trials 2 runs two of the search's enqueued warm starts (fixed clocks, the published tree); the rest stay WAITING
    assert len(done) == 2 and all(t.state == optuna.trial.TrialState.WAITING for t in beside_trials if t not in done)
    assert len(_point_runs(fleet_server.uri, exp)) == len(runs)  # the server still reads its own tables


def test_optuna_storage_on_the_mlflow_database_gets_its_own_schema(fleet_server, fleet_pg):
    """MLflow's and Optuna's tables both include `alembic_version`: a study in the MLflow server's database goes in the
    schema `optuna` (Optuna's own error otherwise: "... no longer compatible with the table schema"); a database that
    holds a study in `public` already keeps it there; a URL with its own `options` is left alone."""
    import optuna
    import psycopg

    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.model.governor.search import storage_url
    from testkit.fakes.pgserver import free_port

    url = storage_url(fleet_pg.dsn("mlflow"))  # migrated by the server: MLflow's alembic_version in public
    assert url.endswith("?options=-csearch_path%3Doptuna")
    name = f"beside-mlflow-{uuid.uuid4().hex[:6]}"
    optuna.create_study(storage=url, study_name=name).optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    assert len(optuna.load_study(study_name=name, storage=storage_url(fleet_pg.dsn("mlflow"))).trials) == 2
    with psycopg.connect(fleet_pg.dsn("mlflow")) as conn:
        assert conn.execute("SELECT to_regclass('optuna.studies') IS NOT NULL, to_regclass('public.studies') IS NULL").fetchone() == (True, True)
    with psycopg.connect(fleet_pg.dsn("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE old_study")
    old = fleet_pg.dsn("old_study")
    optuna.create_study(storage=old.replace("postgresql://", "postgresql+psycopg://"), study_name="made-before")  # in public
    assert "options=" not in storage_url(old)
    assert optuna.load_study(study_name="made-before", storage=storage_url(old)).study_name == "made-before"
    assert storage_url(old + "?options=-csearch_path%3Dmine").endswith("?options=-csearch_path%3Dmine")
    with pytest.raises(DvfsError, match="unreachable") as e:
        storage_url(f"postgresql://dvfs:secret@127.0.0.1:{free_port()}/x")
    assert "secret" not in str(e.value) and "\n" not in str(e.value)
    assert storage_url("sqlite:///optuna.db") == "sqlite:///optuna.db"


def _readme_fleet_recipe() -> list[str]:
    """The command lines of the fleet page's recipe (docs/fleet.md, its first bash block), as written (comments dropped)."""
    text = (REPO / "docs" / "fleet.md").read_text()
    section = text[text.index("# Fleet"):]
    start = section.index("```bash\n") + len("```bash\n")
    block = section[start:section.index("```", start)]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.slow
def test_readme_fleet_recipe_runs_as_written_on_fake_boards(fleet_server, fleet_pg, tmp_path, warm):
    """The recipe's server side is the fixtures' (PostgreSQL with the two databases, `mlflow server` on it); its board
    commands run as written on two fake AGX Orins, with a small workload list appended (the last --models etc. win).
    The two boards are given the same sweep: they share its id, claim its points in PostgreSQL and run each once."""
    import shlex

    from dvfs_mlops.hw.guard import SYSTEM_JOURNAL_DIR, list_journals
    from testkit.fakes.sysfs import make_orin_tree

    lines = _readme_fleet_recipe()
    assert lines[0].startswith("createdb mlflow && createdb optuna")
    server = shlex.split(lines[1])
    assert server[:2] == ["mlflow", "server"] and server[server.index("--backend-store-uri") + 1].startswith("postgresql://")
    assert "--artifacts-destination" in server  # as the fixture starts it: artifacts served through the server

    def ours(line: str) -> str:
        return (line.replace("postgresql://lab:***@db/mlflow", fleet_pg.dsn("mlflow")).replace("postgresql://lab:***@db/optuna", fleet_pg.dsn("optuna"))
                .replace("http://tracking-host:5000", fleet_server.uri))

    env = dict(os.environ)
    env.pop("DVFS_CLAIMS_URI", None)
    for line in lines[2:]:
        if line.startswith("export "):
            k, v = line[len("export "):].split("=", 1)
            env[k] = ours(v)
    assert env["MLFLOW_TRACKING_URI"] == fleet_server.uri and env["DVFS_CLAIMS_URI"] == fleet_pg.dsn("mlflow")
    sweep_line = next(line for line in lines if "dvfs-mlops sweep" in line)
    train_line = next(line for line in lines if "dvfs-mlops train" in line)
    assert sweep_line.startswith("dvfs-mlops sweep --preset paper --steps ")  # as yourself (clockd); hardware trains: steps > 0
    small = ["--models", "bert-tiny,pythia-14m", "--tasks", "sst2,mrpc", "--freqs", "816", "--steps", "2", "--train-size", "32",
             "--dev-size", "16"]
    cli = [warm.python, "-m", "dvfs_mlops"]
    boards = []
    for i in range(2):
        fake = make_orin_tree(tmp_path / f"board{i}", jetpack=6)
        (fake.root / "proc/device-tree/serial-number").write_text(f"14210230{i:05d}\x00")  # as the device tree has it
        boards.append((fake, tmp_path / f"state{i}"))
    procs = [subprocess.Popen(cli + shlex.split(sweep_line, comments=True)[1:] + small, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**env, "DVFS_SYSFS_ROOT": str(fake.root), "DVFS_SYSTEM_STATE_PREFIX": str(state)})
             for fake, state in boards]
    for p in procs:
        _out, err = p.communicate(timeout=400)
        assert p.returncode == 0, err[-3000:]
        assert "points claimed in postgresql" in err
    for fake, state in boards:  # every board's clocks are back where they were
        assert fake.range_hz == (306000000, 1300500000) and list_journals(state / SYSTEM_JOURNAL_DIR) == []
    runs = _point_runs(fleet_server.uri, "dvfs-sweep")
    expected = sorted(f"{m}/{t}@{f}#0" for m in ("bert-tiny", "pythia-14m") for t in ("sst2", "mrpc") for f in ("maxn", "816"))
    assert sorted(r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED") == expected  # each point once
    assert len(runs) == len(expected)  # and no second run of any point, whatever its state
    assert len({r.data.tags["dvfs.sweep_id"] for r in runs}) == 1  # the device id is not the sweep's identity
    assert {r.data.tags["dvfs.device_id"] for r in runs} <= {"1421023000000", "1421023000001"}
    r = run_cli(*shlex.split(ours(train_line))[1:], "--trials", "3", "--outer-trials", "2", "--no-register", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "held-out regret" in r.stdout


def _finished(uri: str, exps: list[str]) -> int:
    from mlflow.tracking import MlflowClient

    try:
        c = MlflowClient(tracking_uri=uri)
        ids = [e.experiment_id for name in exps if (e := c.get_experiment_by_name(name)) is not None]
        return len(c.search_runs(ids, filter_string="tags.`dvfs.point` != '' and attributes.status = 'FINISHED'", max_results=5000)) if ids else 0
    except Exception:  # noqa: BLE001 - the server is restarting
        return -1


@pytest.mark.slow
def test_load_and_faults_eight_workers_two_profiles_server_and_database_restarted(fleet_server, fleet_pg, tmp_path, warm):
    """8 workers (4 on the twin, 4 on fake AGX Orins: two device profiles, two sweeps, each shared by 4) against the
    PostgreSQL-backed server; the tracking server is restarted once and PostgreSQL once while they run. Every point ends
    FINISHED exactly once, nothing is lost, every fake board's clocks are restored."""
    from dvfs_mlops.hw.guard import SYSTEM_JOURNAL_DIR, list_journals
    from testkit.fakes.sysfs import make_orin_tree

    exps = [f"load-sim-{uuid.uuid4().hex[:6]}", f"load-orin-{uuid.uuid4().hex[:6]}"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": fleet_server.uri, "DVFS_CLAIMS_URI": fleet_pg.uri,
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "6", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}  # a restart: ~10 s
    cli = [warm.python, "-m", "dvfs_mlops", "sweep", "--preset", "smoke", "--models", "bert-tiny,pythia-14m",
           "--freqs", "510,816,1300.5", "--train-size", "16", "--dev-size", "16", "--claim-ttl-s", "30"]
    sim = [*cli, "--tasks", "sst2,mrpc,rte", "--steps", "0", "--profile-steps", "20", "--device", "sim", "--experiment", exps[0]]
    orin = [*cli, "--tasks", "sst2", "--steps", "1", "--device", "jetson", "--experiment", exps[1]]
    boards, procs = [], []
    t0 = time.monotonic()
    for i in range(8):
        wenv = {**env, "DVFS_SYSTEM_STATE_PREFIX": str(tmp_path / f"state{i}")}
        if i % 2:
            fake = make_orin_tree(tmp_path / f"board{i}", jetpack=6)
            (fake.root / "proc/device-tree/serial-number").write_text(f"fake-orin-{i}\x00")
            boards.append((fake, tmp_path / f"state{i}"))
            wenv["DVFS_SYSFS_ROOT"] = str(fake.root)
            cmd = orin
        else:
            cmd = [*sim, "--device-id", f"fake-twin-{i}"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=wenv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    lines: list[list[str]] = [[] for _ in range(8)]
    started = [threading.Event() for _ in range(8)]  # past its start-up checks: it said "sweep <id>: N points, ..."

    def read(i: int) -> None:
        for line in procs[i].stdout:
            lines[i].append(line)
            if line.startswith("sweep ") and " points, " in line:
                started[i].set()
        started[i].set()  # ended (the assertions below say how)

    readers = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for t in readers:
        t.start()

    def wait_for(n: int) -> int:
        while (got := _finished(fleet_server.uri, exps)) < n and any(p.poll() is None for p in procs):
            time.sleep(0.5)
        return got

    # Mid-run: every worker is past its start-up (a worker that starts while the server is down stops at its reachability
    # check before touching a clock, by design: test_sweep.py::test_unreachable_tracking_checked_before_clocks).
    for event in started:
        event.wait(timeout=300)
    at_server = wait_for(8)
    t_server = time.monotonic() - t0
    fleet_server.restart()  # kill -9 and start again: requests in flight are cut
    t_back = time.monotonic() - t0
    at_db = wait_for(at_server + 8)
    t_db = time.monotonic() - t0
    fleet_pg.restart()  # fast shutdown: every connection (the server's pool, the claims) is cut
    for p in procs:
        p.wait(timeout=400)
    for t in readers:
        t.join(timeout=30)
    wall = time.monotonic() - t0
    outs = ["".join(x) for x in lines]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    expected = {exps[0]: sorted(f"{m}/{t}@{f}#0" for m in ("bert-tiny", "pythia-14m") for t in ("sst2", "mrpc", "rte")
                                for f in ("maxn", "510", "816", "1300.5")),
                exps[1]: sorted(f"{m}/sst2@{f}#0" for m in ("bert-tiny", "pythia-14m") for f in ("maxn", "510", "816", "1300.5"))}
    statuses: Counter = Counter()
    for exp, keys in expected.items():
        runs = _point_runs(fleet_server.uri, exp)
        assert sorted(r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED") == keys  # each exactly once
        statuses.update(r.info.status for r in runs)
        assert len({r.data.tags["dvfs.sweep_id"] for r in runs}) == 1
    for fake, state in boards:  # every fake board's clocks are back where they were
        assert fake.range_hz == (306000000, 1300500000) and list_journals(state / SYSTEM_JOURNAL_DIR) == []
    print(f"\nload/fault: 8 workers, {sum(map(len, expected.values()))} points in {wall:.0f} s; tracking server restarted after "
          f"{at_server} finished points (at {t_server:.0f} s, back at {t_back:.0f} s), PostgreSQL after {at_db} (at {t_db:.0f} s); "
          f"run statuses {dict(statuses)}")


def test_bad_or_unreachable_claims_are_one_line_errors(empty_store):
    from testkit.fakes.pgserver import free_port

    env = {"MLFLOW_TRACKING_URI": empty_store}
    base = ["sweep", "--preset", "smoke", "--models", "bert-tiny", "--tasks", "sst2", "--freqs", "816", "--steps", "0", "--device", "sim"]
    for claims, words in (("mysql://db/x", "give a postgresql:// URL"),
                          (f"postgresql://nobody@127.0.0.1:{free_port()}/x", "unreachable (tried for 5 s: ")):
        r = run_cli(*base, "--claims", claims, env=env)
        errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
        assert r.returncode == 2 and len(errors) == 1 and words in errors[0] and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert "[1/" not in r.stderr  # nothing ran


def test_mlflows_own_per_run_lines_are_off_against_a_tracking_server(fleet_server):
    """Against an http tracking server MLflow prints "View run"/"View experiment" for every run it ends; a command ends
    with its own link instead (MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT, set if unset; a user's value wins)."""
    env = {"MLFLOW_TRACKING_URI": fleet_server.uri}
    quiet = run_cli("registry", "bootstrap", env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert "View run" not in quiet.stdout + quiet.stderr and "View experiment" not in quiet.stdout + quiet.stderr
    chatty = run_cli("registry", "bootstrap", env={**env, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "false"})
    assert chatty.returncode == 0 and "View run bootstrap paper-mlg at: " in chatty.stdout  # the control: MLflow's own line
