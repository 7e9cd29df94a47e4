"""The first training steps are warm-up, metered apart (issue 31, item 7): allocation, autotuning and lazy loading
land in `warmup_energy_j`/`warmup_s`, never on the clock a shuffled sweep happens to visit first; `energy_j` and
`time_s` are the steps after warm-up in every run. 3 steps on hardware, none on the twin (whose ids stay)."""
from __future__ import annotations

import mlflow
import pytest

from dvfs_mlops.hw.board import board_of
from dvfs_mlops.hw.sim import SimDevice
from dvfs_mlops.job.finetune import FinetuneConfig, profile_only
from dvfs_mlops.job.run import default_warmup_steps


def test_warm_up_is_a_window_of_its_own_and_at_most_a_quarter_of_the_steps():
    from dvfs_mlops.hw.twin.trace import TraceCache
    from dvfs_mlops.job.workloads.zoo import PRESETS

    assert default_warmup_steps(simulated=False) == 3 and default_warmup_steps(simulated=True) == 0
    assert [FinetuneConfig(warmup_steps=3).cold_steps(n) for n in (2, 8, 12, 40)] == [0, 2, 3, 3]
    trace = TraceCache().get(PRESETS["bert-tiny"].config(), 16, 32)
    with SimDevice().session(612.0, label="w") as s:
        result = profile_only([30] * 64, FinetuneConfig(steps=20, batch_size=4, warmup_steps=3), "eval_accuracy", session=s,
                              trace_for=lambda n: trace)
    warmup, train = s.windows["warmup"], s.windows["train"]
    assert result.warmup_steps == 3 and result.metered_samples == 17 * 4
    assert warmup.samples == 3 and train.samples == 17 and s.report() is train  # energy_j: the steps after warm-up
    assert warmup.energy_j + train.energy_j == pytest.approx(s.session_report().energy_j)


def test_a_hardware_sweep_point_meters_its_first_steps_apart_and_a_twin_sweep_does_not(orin6, state_dir, empty_store, monkeypatch):
    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.mlops.sweep import RunOptions, SweepRequest, build_spec, run_sweep

    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    dev = JetsonDevice(sample_hz=200)
    board = board_of(dev, "cpu")
    spec = build_spec(board, SweepRequest("smoke", models="bert-tiny", tasks="rte", freqs="612", steps=12, train_size=64, dev_size=16))
    assert spec.warmup_steps == 3 and "warmup_steps" in spec.definition()
    run_sweep(spec, dev, board, RunOptions(announce=lambda m: None))
    df = mlflow.search_runs(experiment_names=["dvfs-sweep"], filter_string="tags.`dvfs.point` != ''")
    assert len(df) == 2 and (df["metrics.warmup_s"] > 0).all() and df["metrics.warmup_energy_j"].notna().all()
    # samples per second count the steps energy_j and time_s cover: the 9 after warm-up, 16 examples each
    assert (df["metrics.samples_per_s"] * df["metrics.time_s"]).round().eq(9 * 16).all()
    twin = build_spec(board_of(SimDevice()), SweepRequest("smoke"))
    assert twin.warmup_steps == 0 and "warmup_steps" not in twin.definition()
    # the identity holds the warm-up that runs: of 8 steps at most 2, however many were asked for
    short = [build_spec(board, SweepRequest("smoke", models="bert-tiny", tasks="rte", freqs="612", steps=8, warmup_steps=w))
             for w in (2, 3, 5)]
    assert {s.warmup_steps for s in short} == {2} and len({s.sweep_id for s in short}) == 1


def test_finetune_says_the_whole_jobs_energy_beside_the_training_steps(orin6, state_dir, empty_store, monkeypatch):
    from dvfs_mlops.app.finetune import LaunchOptions, run_finetune
    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.job.run import Job
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops import governor

    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    fixed = governor.Governor(governor.GovernorRef("test:fixed", "fixed", 1), governor.PolicyModel({"tree": {"freq_mhz": 612.0}}))
    monkeypatch.setattr(governor, "load_governor", lambda uri=None, direct=True: fixed)
    dev = JetsonDevice(sample_hz=200)
    board = board_of(dev, "cpu")
    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    said: list[str] = []
    out = run_finetune(dev, board, Job(w, FinetuneConfig(steps=12, batch_size=8, warmup_steps=3), "cpu"),
                       LaunchOptions(probe_steps=0, save_model=False, refine=0), say=said.append)
    done = next(line for line in said if line.startswith("done"))
    assert "the whole job" in done and "warmup" in done and "eval" in done
    assert out["metrics"]["warmup_s"] > 0 and out["metrics"]["energy_j"] < out["metrics"]["session_energy_j"]


def test_the_utilisation_probe_runs_warm_and_long_enough_to_be_a_mean(orin6, state_dir):
    """On hardware the probe meters its warm-up apart and measures at least 2 s (NVML's utilisation is a share of a
    sample period of up to 1 s): asked for 2 steps, it runs 3 warm-up steps, then as many as 2 s take."""
    import re

    from dvfs_mlops.app.finetune import MIN_PROBE_S, measure_gpu_util
    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.job.run import Job
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    dev = JetsonDevice(sample_hz=200)
    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    util, source = measure_gpu_util(dev, board_of(dev, "cpu"), Job(w, FinetuneConfig(steps=40, batch_size=8, warmup_steps=3), "cpu"), 2)
    steps = int(re.fullmatch(r"probe: (\d+) steps at maxn after 3 warm-up", source).group(1))
    assert steps >= 9 and util is not None and MIN_PROBE_S == 2.0


def _trainer(tmp_path, model, w, max_steps: int, callbacks: list):
    from transformers import Trainer

    from tests.conftest import trainer_args, trainer_data

    train_split, collate = trainer_data(w)
    args = trainer_args(tmp_path / "out", max_steps, save_strategy="steps", save_steps=4)
    return Trainer(model=model, args=args, train_dataset=train_split, data_collator=collate, callbacks=callbacks)


def test_dvfs_callback_meters_the_warm_up_apart_also_when_the_trainer_resumes_from_a_checkpoint(orin6, state_dir, tmp_path):
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.finetune import build_model
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    model = build_model(w.model_config, seed=0)
    _trainer(tmp_path, model, w, 4, []).train()  # a checkpoint at step 4
    from transformers import TrainerCallback

    steps: list[int] = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(state.global_step)

    with DvfsCallback(device="jetson", announce=None, torch_device="cpu", freq=612.0) as dvfs:
        _trainer(tmp_path, model, w, 16, [dvfs, Steps()]).train(resume_from_checkpoint=True)
    session = dvfs.launched.session
    assert steps[0] == 5 and len(steps) == 12  # resumed: this train() ran steps 5..16
    # warm-up: 3 of the 12 steps this train() runs (the hardware default), then "train" for the other 9
    assert {"warmup", "train"} <= set(session.windows)
    assert dvfs.report is session.windows["train"] and dvfs.report.duration_s > session.windows["warmup"].duration_s
