"""Workers that share only an MLflow tracking server (http, no --claims) split one sweep: the claim is the point's run.

A real `mlflow server` on a SQLite store (its own port and folder), workers as separate `dvfs-mlops sweep` processes
on the twin (profile-only points: fast). claims.TrackingClaims is what they use, with no setting.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

from testkit.fakes.pgserver import MlflowServer
from tests.conftest import REPO

MODELS, TASKS, FREQS = ("bert-tiny", "pythia-14m"), ("sst2", "mrpc"), ("510", "816", "1300.5")
EXPECTED = sorted(f"{m}/{t}@{f}#0" for m in MODELS for t in TASKS for f in ("maxn", *FREQS))


@pytest.fixture(scope="module")
def http_server(tmp_path_factory, store_template):
    """`mlflow server` over http on a SQLite store (a copy of the migrated template: no migrations at start)."""
    root = tmp_path_factory.mktemp("tracking-claims-server")
    shutil.copy2(store_template, root / "server.db")
    server = MlflowServer(root, f"sqlite:///{root}/server.db", start_timeout=120)
    yield server
    server.stop()


def _sweep(exp: str, *extra: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "dvfs_mlops", "sweep", "--preset", "smoke", "--models", ",".join(MODELS), "--tasks", ",".join(TASKS),
            "--freqs", ",".join(FREQS), "--steps", "0", "--profile-steps", "20", "--device", "sim", "--experiment", exp, *extra]


def _env(uri: str) -> dict[str, str]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("DVFS_CLAIMS_URI", None)  # no claims setting: the tracking server alone
    return env


def _runs(uri: str, exp: str, deleted: bool = False) -> list:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    e = c.get_experiment_by_name(exp)
    view = ViewType.ALL if deleted else ViewType.ACTIVE_ONLY
    return c.search_runs([e.experiment_id], filter_string="tags.`dvfs.point` != ''", run_view_type=view, max_results=5000)


def _finished_once(runs: list) -> Counter:
    finished = Counter(r.data.tags["dvfs.point"] for r in runs if r.info.status == "FINISHED")
    assert sorted(finished) == EXPECTED and set(finished.values()) == {1}, finished  # every point, each exactly once
    return Counter(r.data.tags["dvfs.claim_worker"] for r in runs if r.info.status == "FINISHED")


def _claims(uri: str, exp: str, sweep: str):
    """A TrackingClaims of its own (its own client, as another worker has), bound to `sweep` in `exp`."""
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.mlops.claims import ClaimTarget, TrackingClaims

    c = MlflowClient(tracking_uri=uri)
    exp_id = (e.experiment_id if (e := c.get_experiment_by_name(exp)) else c.create_experiment(exp))
    store = TrackingClaims()
    store.bind(ClaimTarget(c, exp_id, sweep, parent_id=""))
    return store, c


def test_concurrent_claims_through_the_server_let_at_most_one_worker_in(http_server):
    """12 workers claim one point at the same instant through the server: at most one gets it (each wrote before it
    read); the losers' runs are deleted; asked again one after another, exactly one holds it."""
    import threading

    from dvfs_mlops.mlops.claims import Claim

    exp, sweep, key = f"race-{uuid.uuid4().hex[:6]}", "s-race", "m/t@816#0"
    stores = [_claims(http_server.uri, exp, sweep)[0] for _ in range(12)]
    barrier = threading.Barrier(len(stores), timeout=60)
    got: list[Claim] = [Claim.HELD] * len(stores)

    def go(i: int) -> None:
        barrier.wait()
        got[i] = stores[i].claim(sweep, key, f"w{i}", 30)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert Counter(got)[Claim.TAKEN] <= 1 and set(got) <= {Claim.TAKEN, Claim.HELD}, got
    for i, store in enumerate(stores):  # in turn: the first free ask wins, every later one is held
        if got[i] is not Claim.TAKEN:
            got[i] = store.claim(sweep, key, f"w{i}", 30)
    assert Counter(got) == {Claim.TAKEN: 1, Claim.HELD: 11}, got
    live = [r for r in _runs(http_server.uri, exp)]
    assert len(live) == 1 and live[0].info.status == "RUNNING" and live[0].data.tags["dvfs.claim_worker"] == f"w{got.index(Claim.TAKEN)}"
    assert sum(s.stats.backoffs for s in stores) == len(_runs(http_server.uri, exp, deleted=True)) - 1


def test_a_claim_whose_heartbeat_stands_still_is_taken_over(http_server):
    """The holder beats (renew) and is held; once its beat stands still for its lease, as another worker sees it by
    its own clock, the point is taken over: the old run FAILED (lease expired), the old holder's renew says lost; a
    FINISHED point answers DONE; a claim that never ran its point is deleted on release."""
    from dvfs_mlops.mlops.claims import Claim

    exp, sweep, key = f"lease-{uuid.uuid4().hex[:6]}", "s-lease", "m/t@510#0"
    (a, client), (b, _c) = _claims(http_server.uri, exp, sweep), _claims(http_server.uri, exp, sweep)
    assert a.claim(sweep, key, "a", 1.0) is Claim.TAKEN  # claimed by this (live) process: judged by its beat alone
    assert a.claim(sweep, key, "a", 1.0) is Claim.TAKEN  # its own claim again
    assert b.claim(sweep, key, "b", 30) is Claim.HELD
    for _ in range(4):  # a beats every 0.4 s: b keeps seeing a new beat, a 1 s lease never runs out
        time.sleep(0.4)
        assert a.renew(sweep, key, "a", 1.0) is True
        assert b.claim(sweep, key, "b", 30) is Claim.HELD
    time.sleep(1.2)  # a stopped beating (b saw its last beat at most 0.4 s after a made it)
    assert b.claim(sweep, key, "b", 30) is Claim.TAKEN
    old = a.run_of(sweep, key)
    assert old is not None and client.get_run(old).info.status == "FAILED" and client.get_run(old).data.tags["dvfs.claim_lost"] == "lease expired"
    assert a.renew(sweep, key, "a", 1.0) is False
    assert a.run_of(sweep, key) is None and a.claim(sweep, key, "a", 1.0) is Claim.HELD  # lost: b's claim holds it now
    assert b.stats.takeovers == 1
    client.set_terminated(b.run_of(sweep, key), "FINISHED")
    c, _ = _claims(http_server.uri, exp, sweep)
    assert c.claim(sweep, key, "c", 30) is Claim.DONE
    other = "m/t@816#0"
    assert c.claim(sweep, other, "c", 30) is Claim.TAKEN
    mine = c.run_of(sweep, other)
    c.release(sweep, other, "c", done=False)  # its workload failed to load: free at once
    assert client.get_run(mine).info.lifecycle_stage == "deleted"
    assert b.claim(sweep, other, "b", 30) is Claim.TAKEN


@pytest.mark.slow
def test_three_workers_split_a_sweep_through_the_tracking_server_alone(http_server, warm):
    exp = f"split-{uuid.uuid4().hex[:6]}"
    procs = [subprocess.Popen(_sweep(exp, python=warm.python), cwd=REPO, env=_env(http_server.uri), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "points claimed in tracking" in err and "claims through the tracking server:" in err
        assert "WARNING" not in err
    runs = _runs(http_server.uri, exp)
    by_worker = _finished_once(runs)
    assert len(by_worker) >= 2, by_worker  # the work was split
    assert len(runs) == len(EXPECTED)  # a claim backed off from is deleted: no live run besides the points'
    ran = sum(int(out.split("ran ")[1].split(" points")[0]) for out, _err in outs)
    assert ran == len(EXPECTED)  # what the workers say they ran adds up to the sweep


@pytest.mark.slow
@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_a_worker_killed_mid_point_loses_it_to_another(http_server, where):
    """Three workers, a 3 s lease; one is killed (SIGKILL) while its point is RUNNING: another worker finds the claim's
    process gone from this machine (here), or, where the claim says it ran on another board (elsewhere: its process
    record rewritten before the kill), sees its heartbeat stand still for the lease; it marks that run FAILED (claimant
    gone, lease expired) and measures the point itself."""
    import json

    from mlflow.tracking import MlflowClient

    exp = f"killed-{uuid.uuid4().hex[:6]}"
    procs = [subprocess.Popen(_sweep(exp, "--claim-ttl-s", "3"), cwd=REPO, env=_env(http_server.uri), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    victim = procs[0]
    c = MlflowClient(tracking_uri=http_server.uri)
    killed = None
    try:
        deadline = time.monotonic() + 240
        while killed is None and victim.poll() is None and time.monotonic() < deadline:
            e = c.get_experiment_by_name(exp)
            runs = c.search_runs([e.experiment_id], "attributes.status = 'RUNNING'", max_results=100) if e is not None else []
            mine = [r for r in runs if r.data.tags.get("dvfs.claim_worker", "").endswith(f":{victim.pid}")]
            if mine:
                victim.send_signal(signal.SIGSTOP)  # frozen where it is; killed if its point is still RUNNING
                if c.get_run(mine[0].info.run_id).info.status == "RUNNING":
                    if where == "elsewhere":  # as a board on another machine would have written it
                        c.set_tag(mine[0].info.run_id, "dvfs.claim_process",
                                  json.dumps({"machine": "another-boot|pid:[4026531836]", "pid": 1, "pid_start": "1"}))
                    victim.kill()
                    killed = mine[0]
                else:
                    victim.send_signal(signal.SIGCONT)
            time.sleep(0.02)
        outs = [p.communicate(timeout=300) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        victim.communicate()
    assert killed is not None, "the victim finished before it was seen holding a point"
    for p, (_out, err) in zip(procs[1:], outs):
        assert p.returncode == 0, err[-3000:]
    assert sum("1 stale claim(s) taken over" in err for _out, err in outs) == 1
    runs = _runs(http_server.uri, exp)
    _finished_once(runs)
    dead = c.get_run(killed.info.run_id)
    assert dead.info.status == "FAILED"
    assert dead.data.tags["dvfs.claim_lost"] == {"here": "claimant gone", "elsewhere": "lease expired"}[where]
    point = killed.data.tags["dvfs.point"]
    finisher = next(r for r in runs if r.data.tags["dvfs.point"] == point and r.info.status == "FINISHED")
    assert finisher.data.tags["dvfs.claim_worker"] != killed.data.tags["dvfs.claim_worker"]  # taken over, not lost


@pytest.mark.slow
def test_one_worker_per_gpu_splits_a_sweep_on_a_two_gpu_server(http_server, tmp_path):
    """A multi-GPU server runs one worker per GPU (`--gpu-index N` each, the same sweep): each point is run on one GPU
    (its run's dvfs.device_id is that GPU's UUID), the points split between the GPUs, both GPUs restored. The GPUs are
    a fake 2-GPU NVML shared by the processes through a state file (testkit/fakes/fake_pynvml.py); training on the CPU."""
    from dvfs_mlops.hw.guard import SYSTEM_JOURNAL_DIR, list_journals
    from testkit.fakes.fake_pynvml import SHARED_STATE_ENV, SHIM_DIR, FakeGPU, read_shared_state, write_shared_state

    state = str(tmp_path / "nvml.json")
    write_shared_state(state, [FakeGPU(power_mw=100_000), FakeGPU(power_mw=200_000)])
    exp = f"gpus-{uuid.uuid4().hex[:6]}"
    cmd = [sys.executable, "-m", "dvfs_mlops", "sweep", "--preset", "smoke", "--models", "bert-tiny,pythia-14m", "--tasks", "sst2",
           "--freqs", "900,1200", "--steps", "1", "--train-size", "16", "--dev-size", "16", "--device", "nvml", "--assume-unlocked",
           "--experiment", exp]
    env = {**_env(http_server.uri), SHARED_STATE_ENV: state, "PYTHONPATH": os.pathsep.join([SHIM_DIR, str(REPO)])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs = [subprocess.Popen([*cmd, "--gpu-index", str(i)], cwd=REPO, env={**env, "DVFS_SYSTEM_STATE_PREFIX": str(tmp_path / f"state{i}")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    after = read_shared_state(state)
    uuids = [g["uuid"] for g in after["gpus"]]
    assert [g["locked"] for g in after["gpus"]] == [None, None]  # both GPUs restored
    assert all(list_journals(tmp_path / f"state{i}" / SYSTEM_JOURNAL_DIR) == [] for i in range(2))
    runs = _runs(http_server.uri, exp)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    keys = sorted(r.data.tags["dvfs.point"] for r in finished)
    assert keys == sorted(f"{m}/sst2@{f}#0" for m in ("bert-tiny", "pythia-14m") for f in ("maxn", "900", "1200"))  # each once
    on = Counter(r.data.tags["dvfs.device_id"] for r in finished)
    assert set(on) == set(uuids), (on, uuids)  # every point on one GPU, and both GPUs did some
