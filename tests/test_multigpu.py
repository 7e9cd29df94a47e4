"""Several GPUs of one job: `dvfs-mlops run` pins, meters and restores the GPUs the command uses (CUDA_VISIBLE_DEVICES's,
--all-gpus every one, else those NVML lists its processes on), and DvfsCallback
under `torchrun` runs every rank at one clock on its own GPU and logs one MLflow run (tests on a fake 2-GPU NVML shared
by the processes through a state file: testkit/fakes/fake_pynvml.py, `shared_module`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dvfs_mlops.hw.guard import list_journals
from testkit.fakes.fake_pynvml import FakeGPU, read_shared_state, shared_module, write_shared_state
from tests.conftest import REPO, run_cli

FREQ = 900


@pytest.fixture
def two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, object]:
    """A fake 2-GPU NVML (100 W and 200 W) every process of the test shares; this process imports it as `pynvml`."""
    path = str(tmp_path / "nvml.json")
    write_shared_state(path, [FakeGPU(power_mw=100_000), FakeGPU(power_mw=200_000)])
    module = shared_module(path)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return path, module


# The command `run` starts: it opens a compute context on each GPU of USES in turn (the fake NVML then lists its PID
# there) and waits until `run` pinned that GPU, copies the fake's state as it sees it, and ends a little later.
_CHILD = """
import json, shutil, sys, time
sys.path.insert(0, sys.argv[4])
from testkit.fakes.fake_pynvml import read_shared_state, use_gpu
state, seen, uses = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
time.sleep(0.05)
for index in uses:
    use_gpu(state, index)
    t0 = time.monotonic()
    while read_shared_state(state)["gpus"][index]["locked"] is None and time.monotonic() - t0 < 20:
        time.sleep(0.01)
time.sleep(0.3)
shutil.copy(state, seen)
time.sleep(0.1)
"""


def _run(state: str, tmp_path: Path, *options: str, env: dict | None = None, uses: tuple[int, ...] = ()):
    """`dvfs-mlops run --device nvml --freq 900 --assume-unlocked OPTIONS -- python (open a context on each GPU of
    `uses`, then copy the fake's state)`: the CLI's result and the state file as the command saw it while it ran."""
    seen = tmp_path / "seen.json"
    child = [sys.executable, "-c", _CHILD, state, str(seen), json.dumps(list(uses)), str(REPO)]
    r = run_cli("run", "--device", "nvml", "--freq", str(FREQ), "--assume-unlocked", "--sample-hz", "20", *options, "--", *child,
                env=env)
    return r, (json.loads(seen.read_text()) if seen.exists() else None)


def _uuids(module) -> list[str]:
    return [g.uuid for g in module._gpus]


def host_name() -> str:
    from dvfs_mlops.hw.multi import host_name

    return host_name()


def test_all_gpus_pins_meters_and_restores_every_gpu(two_gpus, tmp_path):
    state, module = two_gpus
    r, seen = _run(state, tmp_path, "--all-gpus")
    assert r.returncode == 0, r.stderr
    assert [g["locked"] for g in seen["gpus"]] == [[FREQ, FREQ], [FREQ, FREQ]]  # both pinned while the command ran
    after = read_shared_state(state)
    assert [g["locked"] for g in after["gpus"]] == [None, None]  # both restored
    assert [(c["gpu"], c["call"][0]) for c in after["calls"]] == [(0, "lock"), (1, "lock"), (1, "reset"), (0, "reset")]
    lines = r.stderr.strip().splitlines()
    uuids = _uuids(module)
    host = host_name()
    assert lines[-3].startswith(f"GPU 0 ({host}/{uuids[0]}): ") and lines[-2].startswith(f"GPU 1 ({host}/{uuids[1]}): ")
    assert lines[-1].startswith("sum of 2 GPUs: energy: ") and lines[-1].endswith("exit code 0")
    per_gpu = [float(line.split("): ", 1)[1].split(" J")[0]) for line in lines[-3:-1]]
    total = float(lines[-1].split("energy: ")[1].split(" J")[0])
    watts = [float(line.split("avg ")[1].split(" W")[0]) for line in lines[-3:-1]]
    assert total == pytest.approx(sum(per_gpu), abs=0.02) and watts == pytest.approx([100, 200], rel=0.05)  # each GPU's own draw


def test_run_json_holds_each_gpu_and_the_sum(two_gpus, tmp_path):
    state, module = two_gpus
    r, _ = _run(state, tmp_path, "--all-gpus", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["gpu_count"] == 2 and [g["index"] for g in out["gpus"]] == [0, 1] and [g["uuid"] for g in out["gpus"]] == _uuids(module)
    assert [g["key"] for g in out["gpus"]] == [f"{host_name()}/{u}" for u in _uuids(module)]
    assert out["energy_j"] == pytest.approx(sum(g["energy_j"] for g in out["gpus"]))
    assert out["energy_total_j"] == pytest.approx(sum(g["energy_total_j"] for g in out["gpus"]))
    assert out["duration_s"] == pytest.approx(max(g["duration_s"] for g in out["gpus"]))
    assert all(g["energy_j"] > 0 and g["clock_held"] is True for g in out["gpus"]) and out["clock_held"] is True


# -- CUDA_VISIBLE_DEVICES unset (issue 42 item 3): only the GPUs the command's processes use -----------------------------
def test_without_cuda_visible_devices_only_the_gpu_the_command_uses_is_pinned_and_metered(two_gpus, tmp_path):
    state, module = two_gpus
    r, seen = _run(state, tmp_path, "--json", uses=(1,))
    assert r.returncode == 0, r.stderr
    assert [g["locked"] for g in seen["gpus"]] == [None, [FREQ, FREQ]]  # GPU 0 (another user's) untouched
    after = read_shared_state(state)
    assert [(c["gpu"], c["call"][0]) for c in after["calls"]] == [(1, "lock"), (1, "reset")]
    assert [g["locked"] for g in after["gpus"]] == [None, None]
    out = json.loads(r.stdout)
    assert out["gpu_count"] == 1 and out["gpus"][0]["index"] == 1 and out["device_id"] == _uuids(module)[1]
    assert out["gpus"][0]["attached_after_s"] > 0 and out["gpus"][0]["key"] == f"{host_name()}/{_uuids(module)[1]}"
    # the idle 100 W GPU never enters energy_j: the sum is the 200 W GPU's alone
    assert out["energy_j"] == pytest.approx(out["gpus"][0]["energy_j"]) and out["avg_power_w"] == pytest.approx(200, rel=0.05)


def test_a_gpu_the_command_takes_later_is_pinned_when_it_does(two_gpus, tmp_path):
    state, _module = two_gpus
    r, seen = _run(state, tmp_path, "--json", uses=(0, 1))
    assert r.returncode == 0, r.stderr
    assert [g["locked"] for g in seen["gpus"]] == [[FREQ, FREQ], [FREQ, FREQ]]
    out = json.loads(r.stdout)
    first, second = out["gpus"]
    assert (first["index"], second["index"]) == (0, 1) and second["attached_after_s"] > first["attached_after_s"]
    assert [g["locked"] for g in read_shared_state(state)["gpus"]] == [None, None]


def test_a_command_that_uses_no_gpu_pins_and_meters_none(two_gpus, tmp_path):
    state, _module = two_gpus
    r, seen = _run(state, tmp_path)
    assert r.returncode == 0, r.stderr
    assert [g["locked"] for g in seen["gpus"]] == [None, None] and read_shared_state(state)["calls"] == []
    assert "the command used no GPU" in r.stderr and r.stderr.strip().splitlines()[-1].startswith("energy: 0.00 J")


def test_where_nvml_cannot_list_processes_run_refuses_in_one_line_before_anything(two_gpus, tmp_path):
    state, module = two_gpus
    module._gpus[1].process_list_api = False
    r, seen = _run(state, tmp_path, uses=(1,))
    assert r.returncode == 2 and seen is None and "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert all(name in line for name in ("--gpu-index", "CUDA_VISIBLE_DEVICES", "--all-gpus"))
    assert read_shared_state(state)["calls"] == []
    refused = run_cli("run", "--device", "nvml", "--freq", "900", "--gpu-index", "1", "--all-gpus", "--", "true")
    assert refused.returncode == 2 and "give one of them" in refused.stderr


def test_run_pins_only_the_gpu_cuda_visible_devices_names_by_uuid(two_gpus, tmp_path):
    state, module = two_gpus
    second = _uuids(module)[1]
    r, seen = _run(state, tmp_path, "--json", env={"CUDA_VISIBLE_DEVICES": second[:12]})  # a prefix naming one GPU alone
    assert r.returncode == 0, r.stderr
    assert [g["locked"] for g in seen["gpus"]] == [None, [FREQ, FREQ]]
    out = json.loads(r.stdout)
    assert out["device_id"] == second and "gpus" not in out and out["energy_j"] > 0  # one GPU: the single-GPU output
    after = read_shared_state(state)
    assert [(c["gpu"], c["call"][0]) for c in after["calls"]] == [(1, "lock"), (1, "reset")]
    assert [g["locked"] for g in after["gpus"]] == [None, None]


def test_run_with_every_gpu_by_index_pins_both_and_a_subset_by_index_is_refused(two_gpus, tmp_path):
    state, _module = two_gpus
    r, seen = _run(state, tmp_path, env={"CUDA_VISIBLE_DEVICES": "1,0"}, uses=(0, 1))
    assert r.returncode == 0, r.stderr
    assert [g["locked"] for g in seen["gpus"]] == [[FREQ, FREQ], [FREQ, FREQ]]
    calls = len(read_shared_state(state)["calls"])
    refused, seen = _run(state, tmp_path, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert refused.returncode == 2 and "name them by UUID" in refused.stderr and "Traceback" not in refused.stderr
    assert len(read_shared_state(state)["calls"]) == calls  # nothing touched


def test_run_gpu_index_pins_that_gpu_alone(two_gpus, tmp_path):
    state, _module = two_gpus
    r, seen = _run(state, tmp_path, "--gpu-index", "1")
    assert r.returncode == 0, r.stderr
    assert [g["locked"] for g in seen["gpus"]] == [None, [FREQ, FREQ]]
    assert r.stderr.strip().splitlines()[-1].startswith("energy: ")


def test_a_refused_pin_on_the_second_gpu_restores_the_first(two_gpus, tmp_path):
    state, module = two_gpus
    module._gpus[1].permission = False  # NVML refuses this process the second GPU's lock
    r, seen = _run(state, tmp_path, "--all-gpus")
    assert r.returncode == 2 and "no permission" in r.stderr and seen is None  # the command never ran
    after = read_shared_state(state)
    assert [g["locked"] for g in after["gpus"]] == [None, None]
    assert [(c["gpu"], c["call"][0]) for c in after["calls"]] == [(0, "lock"), (1, "lock"), (0, "reset")]


def _torchrun(tmp_path: Path, store: str, **env_extra: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """`torchrun --standalone --nproc-per-node 2 testkit/torchrun_trainer.py` on the CPU, each rank's `pynvml` the shared
    fake 2-GPU NVML (100 W, 200 W); rank 0 asks DvfsCallback for 900 MHz and rank 1 for 600. The run and the state file."""
    state = str(tmp_path / "nvml.json")
    write_shared_state(state, [FakeGPU(power_mw=100_000), FakeGPU(power_mw=200_000)])
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update({"PYTHONPATH": os.pathsep.join([os.path.join(REPO, "testkit", "fakes", "nvml_shim"), str(REPO)]),
                "DVFS_FAKE_NVML_STATE": state, "MLFLOW_TRACKING_URI": store, "DVFS_TORCH_DEVICE": "cpu", **env_extra})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "testkit" / "torchrun_trainer.py"), str(tmp_path), str(FREQ), "600"]
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240), state


def test_dvfs_callback_under_torchrun_runs_every_rank_at_rank_0s_clock_and_logs_one_run(tmp_path, empty_store, state_dir):
    """`torchrun --nproc-per-node 2` of a user's Trainer script (testkit/torchrun_trainer.py) on the CPU (gloo), each
    rank's NVML the shared fake 2-GPU one: rank 0 asks for 900 MHz and rank 1 for 600; both GPUs run at 900, both are
    restored, and one MLflow run holds both GPUs' energy and their sum."""
    import mlflow

    done, state = _torchrun(tmp_path, empty_store)
    assert done.returncode == 0, done.stderr[-3000:]
    uuids = [g["uuid"] for g in read_shared_state(state)["gpus"]]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["index"] for r in ranks] == [0, 1]  # each rank on its own GPU (LOCAL_RANK-th visible)
    assert [r["freq"] for r in ranks] == [FREQ, FREQ]  # rank 0's decision, broadcast
    for r in ranks:  # at every step of either rank, both GPUs locked at that clock
        assert len(r["seen"]) == 3 and all(step == [[FREQ, FREQ], [FREQ, FREQ]] for step in r["seen"])
    after = read_shared_state(state)
    assert [g["locked"] for g in after["gpus"]] == [None, None]  # both restored
    for i in (0, 1):
        assert [c["call"] for c in after["calls"] if c["gpu"] == i] == [["lock", FREQ, FREQ], ["reset"]]
    assert list_journals(state_dir) == []  # no journal left behind
    client = mlflow.MlflowClient(tracking_uri=empty_store)
    runs = [run for exp in client.search_experiments() for run in client.search_runs([exp.experiment_id])]
    assert len(runs) == 1  # rank 0's run; rank 1 logged nothing
    metrics, tags = runs[0].data.metrics, runs[0].data.tags
    keys = [f"{host_name()}/{uuid}" for uuid in uuids]  # per GPU by node and UUID, never by index alone
    per_gpu = [metrics[f"dvfs_energy_j/{key}"] for key in keys]
    assert per_gpu == pytest.approx([r["energy_j"] for r in ranks])
    assert metrics["dvfs_energy_j"] == pytest.approx(sum(per_gpu)) == pytest.approx(ranks[0]["job_energy_j"])
    assert [metrics[f"dvfs_avg_power_w/{key}"] for key in keys] == pytest.approx([100, 200], rel=0.05)
    assert [tags[f"dvfs.gpu.{key}.index"] for key in keys] == ["0", "1"] and tags["dvfs.gpu_count"] == "2"
    assert [tags[f"dvfs.gpu.{key}.rank"] for key in keys] == ["0", "1"] and tags["dvfs.freq_mhz"] == str(FREQ)
    assert tags["dvfs.clock_held"] == "true"
    assert "no-such-governor" in ranks[0]["decide_error"]  # rank 0's own error ...
    assert ranks[1]["decide_error"].startswith("DvfsError: rank 0 could not decide the clock (")  # ... told to rank 1


# ---- which GPUs a job sees, and which one a rank trains on -------------------------------------------------------------

def _units(m) -> list[set[str]]:
    from dvfs_mlops.hw.nvml import NvmlDevice

    return [NvmlDevice(index=i, nvml=m).cuda_uuids for i in range(len(m._gpus))]


@pytest.mark.parametrize(("visible", "expected"), [
    (None, [0, 1, 2]),  # unset: every GPU
    ("", []),  # empty: none
    ("2,0,1", [0, 1, 2]),  # every index: every GPU, whatever CUDA's order
    ("GPU-cccc,GPU-aaaa", [2, 0]),  # UUIDs (prefixes), in the order given
    ("GPU-cccc,GPU-zzzz,GPU-aaaa", [2]),  # an entry naming no GPU ends the list
    ("GPU-cccc,bogus,GPU-aaaa", [2]),  # as does one that is neither an index nor a UUID
], ids=["unset", "empty", "all-indices", "uuids", "unknown-uuid", "invalid-entry"])
def test_the_gpus_a_job_sees_without_torch(visible, expected):
    from dvfs_mlops.hw.placement import visible_gpus
    from testkit.fakes.fake_pynvml import make_module

    m = make_module([FakeGPU(uuid=f"GPU-{c * 4}1111-8a1d-4c3b-9f6e-2d7a5b4c3e10") for c in "abc"])
    assert visible_gpus(_units(m), visible) == expected


def test_a_subset_by_index_is_refused_without_torch_and_told_by_torch_with_it(monkeypatch):
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.hw.placement import cuda_uuids, visible_gpus
    from testkit.fakes.fake_pynvml import FakeCuda, make_module

    m = make_module([FakeGPU(), FakeGPU(), FakeGPU()])
    with pytest.raises(DvfsError, match="name them by UUID"):
        visible_gpus(_units(m), "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    FakeCuda(m, fastest_first=[2, 0, 1]).install(monkeypatch)  # CUDA's physical 1 and 0 are NVML GPUs 0 and 2
    assert visible_gpus(_units(m), "1,0", cuda_uuids()) == [0, 2]


def test_a_mig_device_in_cuda_visible_devices_is_its_gpu(monkeypatch):
    from dvfs_mlops.hw.placement import visible_gpus
    from testkit.fakes.fake_pynvml import make_module

    m = make_module([FakeGPU(), FakeGPU()])
    mig = m._gpus[1].enable_mig(2)[0]
    assert visible_gpus(_units(m), mig.uuid) == [1]


class _ModelOn:
    """A Trainer's model as the callback sees it: parameters on `where`."""

    def __init__(self, where: str):
        import torch

        self.where = torch.device(where)

    def parameters(self):
        import types

        return iter([types.SimpleNamespace(device=self.where)])


def test_a_rank_opens_the_local_rank_th_visible_gpu_like_the_device_given(monkeypatch):
    from dvfs_mlops.hw import open_device
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from testkit.fakes.fake_pynvml import make_module

    m = make_module([FakeGPU(), FakeGPU(), FakeGPU()])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{m._gpus[2].uuid},{m._gpus[1].uuid}")
    monkeypatch.setenv("LOCAL_RANK", "1")
    given = open_device("nvml", nvml_module=m, assume_unlocked=True, sample_hz=7)
    dev = DvfsCallback(device=given, announce=None, torch_device="cpu")._open_device(_ModelOn("cpu"))
    assert (dev.index, dev.assume_unlocked, dev.sample_hz) == (1, True, 7)  # visible are GPUs 2, 1: rank 1's is GPU 1
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(Exception, match="LOCAL_RANK 2 has no GPU of its own: the job sees 2"):
        DvfsCallback(device=given, announce=None, torch_device="cpu")._open_device(_ModelOn("cpu"))
    assert all(g.calls == [] for g in m._gpus)


def test_a_rank_whose_model_is_on_cuda_opens_the_gpu_with_that_uuid(monkeypatch):
    from dvfs_mlops.hw import open_device
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from testkit.fakes.fake_pynvml import FakeCuda, make_module

    m = make_module([FakeGPU(), FakeGPU()])
    monkeypatch.delenv("DVFS_TORCH_DEVICE", raising=False)
    FakeCuda(m, fastest_first=[1, 0]).install(monkeypatch)  # cuda:0 is NVML GPU 1
    monkeypatch.setenv("LOCAL_RANK", "1")  # the LOCAL_RANK-th would be cuda:1 = GPU 0, but the model says otherwise
    dev = DvfsCallback(device=open_device("nvml", nvml_module=m), announce=None)._open_device(_ModelOn("cuda:0"))
    assert dev.index == 1 and dev.torch_device == "cuda:0"


def test_combined_reports_add_energy_and_hold_only_if_every_gpu_held():
    from dvfs_mlops.hw.meter import EnergyReport
    from dvfs_mlops.hw.multi import combine

    def report(joules: float, seconds: float, held: bool, clock: float) -> EnergyReport:
        return EnergyReport(seconds, joules, joules, {"gpu": joules}, joules / seconds, joules / seconds + 5, 80.0, 10, False,
                            clock_mhz_measured=clock, clock_held=held)

    both = combine([report(100.0, 2.0, True, 900.0), report(300.0, 2.5, False, 880.0)])
    assert (both.energy_j, both.energy_total_j, both.energy_by_rail_j, both.duration_s) == (400.0, 400.0, {"gpu": 400.0}, 2.5)
    assert both.avg_power_w == pytest.approx(160.0) and both.peak_power_w == pytest.approx(50 + 5 + 120 + 5)
    assert both.clock_held is False and both.clock_mhz_measured == pytest.approx(890.0) and both.samples == 20


def test_a_rank_killed_under_torchrun_leaves_a_journal_that_restore_puts_back(tmp_path, empty_store, state_dir, monkeypatch):
    """Rank 1 SIGKILLs itself at step 2: torchrun stops rank 0 (SIGTERM), whose session restores GPU 0; GPU 1 stays
    locked with its journal, and `dvfs-mlops restore` resets it."""
    done, state = _torchrun(tmp_path, empty_store, TEST_RANK1_DIES_AT_STEP="2")
    assert done.returncode != 0 and "SIGKILL" in done.stderr
    killed = read_shared_state(state)
    assert [g["locked"] for g in killed["gpus"]] == [None, [FREQ, FREQ]]
    assert [c["call"] for c in killed["calls"] if c["gpu"] == 0] == [["lock", FREQ, FREQ], ["reset"]]
    assert [j.device_key for _p, j in list_journals(state_dir)] == ["nvml-1"]
    monkeypatch.setitem(sys.modules, "pynvml", shared_module(state))
    r = run_cli("restore")
    assert r.returncode == 0, r.stderr
    assert [g["locked"] for g in read_shared_state(state)["gpus"]] == [None, None] and list_journals(state_dir) == []


# -- per-GPU figures keyed by node and GPU (issue 42 item 9) ------------------------------------------------------------
def test_per_gpu_figures_are_keyed_by_node_and_uuid_never_by_index_alone(monkeypatch):
    import pickle
    import socket

    from dvfs_mlops.hw.meter import EnergyReport
    from dvfs_mlops.hw.multi import GpuEnergy

    report = EnergyReport(1.0, 10.0, 10.0, {"gpu": 10.0}, 10.0, 10.0, None, 5, False)
    a, b = GpuEnergy(0, "GPU-aaaa", report, 0, host="node-a"), GpuEnergy(0, "GPU-aaaa", report, 1, host="node-b")
    assert a.key == "node-a/GPU-aaaa" != b.key == "node-b/GPU-aaaa"  # GPU 0 of two nodes: two keys
    assert a.to_dict()["key"] == "node-a/GPU-aaaa" and a.to_dict()["host"] == "node-a"
    assert pickle.loads(pickle.dumps(b)).key == b.key  # what torch.distributed's all_gather_object carries to rank 0
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu node #7")
    assert GpuEnergy(3, "GPU-cccc", report).key == "gpu-node--7/GPU-cccc"  # a name MLflow takes in metric and tag names
