"""A sweep's identity is an explicit list of fields (mlops/sweep/spec.py, IDENTITY_FIELDS): the ids the code gave
sweeps before that list existed do not change, and a field that is not listed changes no id."""
from __future__ import annotations

import dataclasses

import pytest

from dvfs_mlops.hw.board import board_of
from dvfs_mlops.hw.sim import SimDevice
from dvfs_mlops.hw.twin.profiles import load_twin_params
from dvfs_mlops.job.workloads.adapters import peft_spec
from dvfs_mlops.mlops.sweep.spec import IDENTITY_FIELDS, IDENTITY_SCHEMA, SweepRequest, SweepSpec, build_spec, sweep_id_of

# Computed by the code before identity-by-inclusion (commit a419239's SweepSpec.definition(), which hashed asdict()
# minus a list of pops), for these definitions on the sim device: they must never change.
PINNED = {
    "smoke": "sweep-a9f22bba97",
    "quick": "sweep-8d0990b215",
    "paper": "sweep-c8d5f6157c",
    "quick-adaptive": "sweep-823f4225fe",
    "smoke-lora-bf16": "sweep-9a7f3cc2d3",
    "smoke-lora-r16-targets-bf16": "sweep-b4d211aae3",
    "smoke-fp16-seed3": "sweep-076dad4be8",
    "smoke-measured": "sweep-0713926803",
    "smoke-twin-params": "sweep-f962652450",
    "quick-named-board-adaptive": "sweep-a9f846a8ea",
}


def _spec(name: str, tmp_path) -> SweepSpec:
    dev = SimDevice()
    if name in ("smoke", "quick", "paper"):
        return build_spec(board_of(dev), SweepRequest(name))
    if name == "quick-adaptive":
        return build_spec(board_of(dev), SweepRequest("quick", strategy="adaptive"))
    if name == "smoke-lora-bf16":
        return build_spec(board_of(dev), SweepRequest("smoke", peft=peft_spec("lora", 8, 16, None), precision="bf16"))
    if name == "smoke-lora-r16-targets-bf16":
        return build_spec(board_of(dev), SweepRequest("smoke", models="pythia-14m", tasks="sst2,rte", peft=peft_spec("lora", 16, 32, "query_key_value"),
                          precision="bf16", repeats=2, freqs="612,816"))
    if name == "smoke-fp16-seed3":
        return build_spec(board_of(dev), SweepRequest("smoke", precision="fp16", seed=3, steps=7, batch_size=8))
    if name == "smoke-measured":
        return build_spec(board_of(SimDevice(params=load_twin_params("sim-orin-measured", None))), SweepRequest("smoke"))
    if name == "smoke-twin-params":
        (tmp_path / "board.yaml").write_text("gpu_k: 30.0\n")
        return build_spec(board_of(SimDevice(params=load_twin_params(None, tmp_path / "board.yaml"))), SweepRequest("smoke"))
    (tmp_path / "mine.yaml").write_text("profile: my-board\ngpu_k: 30.0\nnoise_power: 0.03\n")
    board = SimDevice(params=load_twin_params("sim-orin-measured", tmp_path / "mine.yaml"))
    return build_spec(board_of(board), SweepRequest("quick", strategy="adaptive", repeats=2))


@pytest.mark.parametrize("name", sorted(PINNED))
def test_ids_of_existing_definitions_do_not_change(name, tmp_path):
    spec = _spec(name, tmp_path)
    assert spec.sweep_id == PINNED[name]
    assert sweep_id_of(spec.definition()) == PINNED[name]


def test_the_identity_is_the_listed_fields_only():
    spec = build_spec(board_of(SimDevice()), SweepRequest("smoke", peft=peft_spec("lora", 8, 16, None), precision="bf16", strategy="adaptive"))
    assert IDENTITY_SCHEMA == 1
    assert set(spec.definition()) <= set(IDENTITY_FIELDS)
    assert {"sweep_id", "experiment", "shuffle_clocks", "model_entries"}.isdisjoint(IDENTITY_FIELDS)
    # a field that is not listed changes nothing: where the sweep is stored, the clock order, a new field
    moved = dataclasses.replace(spec, experiment="elsewhere", shuffle_clocks=not spec.shuffle_clocks, sweep_id="")
    assert moved.with_default_id().sweep_id == spec.sweep_id
    Wider = dataclasses.make_dataclass("Wider", [("new_knob", int, dataclasses.field(default=7))], bases=(SweepSpec,), frozen=True)
    wider = Wider(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(SweepSpec)} | {"sweep_id": ""})
    assert wider.with_default_id().sweep_id == spec.sweep_id


def test_a_listed_field_changes_the_id():
    base = build_spec(board_of(SimDevice()), SweepRequest("smoke"))
    for change in ({"seed": 1}, {"steps": 5}, {"precision": "bf16"}, {"strategy": "adaptive"}, {"repeats": 2}):
        assert dataclasses.replace(base, sweep_id="", **change).with_default_id().sweep_id != base.sweep_id, change


def test_the_clock_knobs_keep_todays_ids_and_a_joint_sweep_is_another():
    """`--knobs gpu` (the default) adds nothing to the identity; tuning the CPU clock too is another sweep, whose
    points are configurations (maxn alone pins nothing)."""
    dev = SimDevice()
    board = board_of(dev)
    gpu = build_spec(board, SweepRequest("smoke", tuned="gpu"), dev)
    assert gpu.sweep_id == PINNED["smoke"] and {"tuned", "cpu_freqs", "emc_freqs"}.isdisjoint(gpu.definition())
    joint = build_spec(board, SweepRequest("smoke", tuned="gpu,cpu", cpu_freqs="2201.6,1190.4"), dev)
    assert joint.sweep_id != gpu.sweep_id
    assert joint.definition()["tuned"] == ["gpu", "cpu"] and joint.definition()["cpu_freqs"] == ["1190.4", "2201.6"]
    points = [p for p in joint.points() if p.model == "bert-tiny" and p.task == "sst2"]
    assert len(points) == 1 + 3 * 2 and points[0].key == "bert-tiny/sst2@maxn#0" and points[1].key == "bert-tiny/sst2@510/cpu1190.4#0"
    every = build_spec(board, SweepRequest("smoke", tuned="emc,gpu"), dev)  # a clock's whole table unless named; any order
    assert every.tuned == ("gpu", "emc") and every.emc_freqs == tuple(dev.emc_frequencies_mhz) and every.cpu_freqs == ()
