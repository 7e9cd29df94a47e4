"""Probe-and-refine: probes inside the job, the settled clock, totals that include the probes, restores kept."""
from __future__ import annotations

import csv
import io
import json
import shutil

import pytest

from dvfs_mlops.job.refine import ProbePlan, Refiner, plan, probe_clocks
from dvfs_mlops.mlops.governor import GovernorRef
from dvfs_mlops.model.curve import Measurement
from tests.conftest import trainer_args, trainer_data

TABLE = [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0, 1122.0, 1224.0, 1300.5]


def test_probe_clocks_spread_around_the_start_and_fill_inward_at_the_edges():
    assert probe_clocks(816.0, TABLE, 5) == [816.0, 612.0, 1020.0, 408.0, 1224.0]
    assert probe_clocks(1300.5, TABLE, 3) == [1300.5, 1122.0, 1224.0]
    assert plan(30, 816.0, TABLE) == ([816.0, 612.0, 1020.0], 4)  # the first round; up to 7 windows of 4 steps in all
    assert plan(8, 816.0, TABLE) == ([816.0, 612.0], 4)
    assert plan(70, 816.0, TABLE) == ([816.0, 612.0, 1020.0], 10)  # a larger budget: longer windows, not more of them
    assert plan(7, 816.0, TABLE) == ([], 0)  # too small a budget probes nothing


def _orin_like(f: float, opt: float) -> Measurement:
    """Per-step time and energy of a workload with the curve model's shape whose optimum is near `opt` MHz."""
    from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE

    g, v = f / 1000.0, 1 + ORIN_VOLTAGE_SHAPE * (f / 1300.5) ** 2
    t = 0.05 + 0.04 / g
    c = 12.0 * (opt / 1000.0) ** 2  # static power that puts the optimum roughly at `opt`
    return Measurement(f, t, t * (c + 10.0 * v * v * g))


def _drive(p: ProbePlan, truth) -> list[float]:
    asked = []
    while (f := p.next_clock()) is not None:
        asked.append(f)
        p.record(truth(f))
    return asked


def test_probe_plan_walks_one_step_at_a_time_towards_a_far_optimum_and_stays_when_there_is_nothing_to_gain():
    from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE

    def truth(opt_clock):
        return lambda f: _orin_like(f, opt_clock)

    energies = {f: _orin_like(f, 600.0).energy_j for f in TABLE}
    opt = min(energies, key=energies.__getitem__)
    # started at the optimum, noise-free: the first round (the start and two steps either side) and it stays
    p = ProbePlan(opt, TABLE, 30, voltage_shape=ORIN_VOLTAGE_SHAPE, noise=(0.01, 0.02))
    assert _drive(p, truth(600.0)) == probe_clocks(opt, TABLE, 3) and p.chosen_mhz == opt and p.moves == 0
    # started three steps above it: moves down one step per decision, probing the new neighbours, within 7 windows
    start = TABLE[TABLE.index(opt) + 3]
    p = ProbePlan(start, TABLE, 30, voltage_shape=ORIN_VOLTAGE_SHAPE, noise=(0.01, 0.02))
    asked = _drive(p, truth(600.0))
    assert len(asked) <= 7 and len(set(asked)) == len(asked) and asked[:3] == probe_clocks(start, TABLE, 3)
    assert p.chosen_mhz == opt and p.moves == 3
    # a budget of 12 steps: the first round only, then at most one step without probing around it
    p = ProbePlan(start, TABLE, 12, voltage_shape=ORIN_VOLTAGE_SHAPE, noise=(0.01, 0.02))
    assert len(_drive(p, truth(600.0))) == 3 and p.chosen_mhz in (start, TABLE[TABLE.index(start) - 1])


def test_probe_plan_does_not_move_on_a_saving_within_the_noise():
    from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE

    # a flat curve (energy the same at every clock up to 0.1 %): no move is worth its uncertainty
    flat = lambda f: Measurement(f, 1.0, 10.0 * (1 + 0.001 * ((f - 816.0) / 500.0)))
    p = ProbePlan(816.0, TABLE, 30, voltage_shape=ORIN_VOLTAGE_SHAPE, noise=(0.01, 0.02))
    assert _drive(p, flat) == [816.0, 612.0, 1020.0] and p.chosen_mhz == 816.0 and "no significant saving" in p.reason


def test_refine_on_the_twin_settles_at_the_fitted_optimum_and_counts_the_probes():
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.trace import TraceCache
    from dvfs_mlops.job.finetune import FinetuneConfig, profile_only
    from dvfs_mlops.job.workloads.zoo import PRESETS

    trace = TraceCache().get(PRESETS["bert-tiny"].config(), 16, 32)
    dev = SimDevice()
    steps = 60
    session = dev.session(612.0, label="t")
    with session:
        refiner = Refiner(session, 20, steps, board_of(dev), say=lambda m: None)
        profile_only([30] * 64, FinetuneConfig(steps=steps, batch_size=4), "eval_accuracy", session=session, trace_for=lambda n: trace,
                     on_step=refiner.on_step)
    res = refiner.result
    probed = [p.freq_mhz for p in res.probes]
    assert res is not None and probed[:3] == [612.0, 408.0, 816.0] and len(probed) <= 5 and len(set(probed)) == len(probed)
    assert all(p.steps == 4 for p in res.probes)
    # settled where the plan settled: one significant move down from 612, onto the twin's expected optimum for this trace
    curve, _ = dev.curve(trace)
    assert res.chosen_mhz == refiner.plan.chosen_mhz and refiner.plan.moves >= 1
    assert res.chosen_mhz == min(curve, key=lambda f: curve[f].energy_j) == 510.0
    assert len(res.predicted) == len(TABLE)
    assert session.freq == res.chosen_mhz and session.effective_mhz == res.chosen_mhz  # the rest ran at the choice
    curve, _ = dev.curve(trace)
    train = session.report()
    probes_j = sum(p.energy_j for p in res.probes)
    # the job's total: 2 warm-up steps at the start clock, the probes, the rest at the choice (noise within +-10 %)
    rest = steps - 2 - res.probe_steps
    expected = 2 * curve[612.0].energy_j + sum(p.steps * curve[p.freq_mhz].energy_j for p in res.probes) + rest * curve[res.chosen_mhz].energy_j
    assert train.energy_j == pytest.approx(expected, rel=0.1) and train.energy_j > probes_j
    for p in res.probes:  # each probe window is its own noisy draw of that clock
        assert p.energy_j / p.steps == pytest.approx(curve[p.freq_mhz].energy_j, rel=0.1)


class _Fixed:
    """A governor that always answers 612 MHz (refine is under test here, not the registry)."""

    def predict(self, rows, params=None):
        import pandas as pd

        return pd.DataFrame({"freq_mhz": [612.0], "decision_path": ["fixed -> 612 MHz"]})


@pytest.fixture(scope="module")
def store(tmp_path_factory, store_template):
    db = tmp_path_factory.mktemp("refine") / "mlflow.db"
    shutil.copy2(store_template, db)  # migrated already
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{db}"}


@pytest.fixture(autouse=True)
def _fixed_governor(monkeypatch):
    _use_governor(monkeypatch, GovernorRef("test:fixed-612", "fixed", 1))


def _use_governor(monkeypatch, ref, model=None):
    """Every load of a governor gives this one (refine is under test here, not the registry)."""
    from dvfs_mlops.mlops import governor

    monkeypatch.setattr(governor, "load_governor", lambda uri=None, direct=True: governor.Governor(ref, model or _Fixed()))


def _launch(device, workload, config, say=print, **options):
    """`finetune` as the CLI runs it: the board resolved from the device, the job, the launch options."""
    from dvfs_mlops.app.finetune import LaunchOptions, run_finetune
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.job.run import Job

    board = board_of(device)
    return run_finetune(device, board, Job(workload, config, board.torch_device), LaunchOptions(**options), say=say)


def _logged(run_id):
    from mlflow.tracking import MlflowClient

    c = MlflowClient()
    run = c.get_run(run_id)
    rows = list(csv.DictReader(io.StringIO(open(c.download_artifacts(run_id, "refine.csv")).read())))
    return run, rows


def test_finetune_refine_on_the_sim_logs_probes_choice_and_totals(store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["MLFLOW_TRACKING_URI"])
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    said: list[str] = []
    out = _launch(SimDevice(), w, FinetuneConfig(steps=14, batch_size=8), probe_steps=0, refine=8, say=said.append,
                                save_model=False)
    r = out["refine"]
    assert r["start_mhz"] == out["decision"]["freq_mhz"] and len(r["probes"]) == 2 and r["simulated"] is True
    run, rows = _logged(out["run_id"])
    assert run.data.params["freq_mhz"] == f"{r['chosen_mhz']:g}" and run.data.metrics["clock_mhz"] == r["chosen_mhz"]
    assert run.data.tags["refine.chosen_mhz"] == f"{r['chosen_mhz']:g}" and run.data.tags["refine.probe_steps"] == "8"
    assert run.data.tags["refine.simulated"] == "true"
    probes = [x for x in rows if x["kind"] == "probe"]
    assert [float(x["freq_mhz"]) for x in probes] == [p["freq_mhz"] for p in r["probes"]]
    assert sum(x["chosen"] == "1" for x in rows if x["kind"] == "predicted") == 1 and len([x for x in rows if x["kind"] == "predicted"]) == 11
    # the run's totals include the probes
    assert run.data.metrics["energy_j"] > sum(float(x["energy_j"]) for x in probes)
    assert run.data.metrics["time_s"] > sum(float(x["time_s"]) for x in probes)
    assert any(line.startswith("refine: settled at") for line in said)


def test_refine_is_off_by_default_on_the_twin_and_on_by_default_on_boards():
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.mlops.launch import default_refine

    class Board:
        simulated = False

    assert default_refine(board_of(SimDevice())) == 0 and default_refine(Board()) == 30


def test_finetune_refine_on_the_fake_jetson_moves_the_pin_and_restores_the_original(orin6, store, state_dir, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["MLFLOW_TRACKING_URI"])
    from dvfs_mlops.hw.jetson import JetsonDevice
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops import launch as launcher

    real = launcher.run_job
    pins: list[tuple[int, int]] = []
    journals: list[dict] = []

    def watching(*args, on_step=None, **kwargs):
        def hook(step, loss):
            on_step(step, loss)
            pins.append(orin6.range_hz)
            journals.extend(json.loads(p.read_text()) for p in state_dir.glob("restore-*.json"))
        return real(*args, on_step=hook, **kwargs)

    monkeypatch.setattr(launcher, "run_job", watching)
    monkeypatch.setattr("dvfs_mlops.hw.board.MIN_SAMPLES_PER_WINDOW", 0)  # windows of MIN_PROBE_STEPS (sizing: test_refine_sizes_...)
    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    out = _launch(JetsonDevice(), w, FinetuneConfig(steps=16, batch_size=8), probe_steps=0, refine=10,
                                say=lambda m: None, save_model=False)
    r = out["refine"]
    seen_mhz = [lo / 1e6 for lo, hi in pins if lo == hi]
    assert len(seen_mhz) == len(pins)  # pinned at every step
    assert {p["freq_mhz"] for p in r["probes"]} <= set(seen_mhz) and seen_mhz[-1] == r["chosen_mhz"]
    assert journals and all(j["settings"]["min_freq"] == "306000000" and j["settings"]["max_freq"] == "1300500000" for j in journals)
    assert orin6.range_hz == (306000000, 1300500000) and not list(state_dir.glob("restore-*.json"))  # restored, journal gone
    run, rows = _logged(out["run_id"])
    assert run.data.params["freq_mhz"] == f"{r['chosen_mhz']:g}" and run.data.tags["refine.chosen_mhz"] == f"{r['chosen_mhz']:g}"
    probes = [x for x in rows if x["kind"] == "probe"]
    assert len(probes) == 2 and run.data.metrics["time_s"] > sum(float(x["time_s"]) for x in probes)  # totals include the probes
    assert run.data.metrics["energy_j"] > sum(float(x["energy_j"]) for x in probes)


def test_refine_needs_a_pinned_session():
    from dvfs_mlops.errors import DvfsError
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice

    with SimDevice().session(612.0, observe=True) as s, pytest.raises(DvfsError, match="observing session"):
        s.repin(816.0)
    dev = SimDevice()
    for session in (dev.session("maxn"), dev.session(612.0, observe=True)):  # nothing pinned: nothing to probe around
        with session as s, pytest.raises(DvfsError, match="pins none"):
            Refiner(s, 20, 100, board_of(dev), say=lambda m: None)


def test_refine_leans_on_the_governors_power_prior_and_logs_it(store, monkeypatch):
    """A governor version trained on this board's sweep carries its power prior (tag power_prior): refine's fits use it
    with each probe's GPU utilisation, and the run says so (tag refine.power_prior, the printed lines)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["MLFLOW_TRACKING_URI"])
    from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.model.curve import PowerPrior

    prior = PowerPrior(0.15, 0.27, 0.03, 36, ORIN_VOLTAGE_SHAPE, 1300.5)
    _use_governor(monkeypatch, GovernorRef("test:fixed-612", "fixed", 1, None, {"device_profile": "sim-orin", "power_prior": prior.to_json()}))
    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    said: list[str] = []
    out = _launch(SimDevice(), w, FinetuneConfig(steps=20, batch_size=8), probe_steps=0, refine=12, say=said.append,
                                save_model=False)
    run, rows = _logged(out["run_id"])
    assert PowerPrior.from_json(run.data.tags["refine.power_prior"]) == prior
    assert any("board's power prior from 36 workloads" in line for line in said)
    assert all(0 < p["gpu_util"] <= 1 for p in out["refine"]["probes"])  # each window's own utilisation, for the fit
    assert [float(x["gpu_util"]) for x in rows if x["kind"] == "probe"] == [p["gpu_util"] for p in out["refine"]["probes"]]


def test_a_governors_power_prior_is_used_only_on_its_own_board():
    import dataclasses

    from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE, board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.model.curve import PowerPrior

    prior = PowerPrior(0.15, 0.27, 0.03, 36, ORIN_VOLTAGE_SHAPE, 1300.5)
    tags = {"device_profile": "sim-orin", "power_prior": prior.to_json()}
    board = board_of(SimDevice())
    jetson = dataclasses.replace(board, profile="jetson-agx-orin")
    assert GovernorRef("u", tags=tags).power_prior_for(board) == prior
    assert GovernorRef("u", tags=tags).power_prior_for(jetson) is None  # another board's power curves
    assert GovernorRef("u", tags={"device_profile": "sim-orin"}).power_prior_for(board) is None  # a version without one
    assert GovernorRef("u", tags={**tags, "power_prior": "{not json"}).power_prior_for(board) is None  # unreadable: refine without
    assert GovernorRef("u").power_prior_for(board) is None
    with SimDevice().session(612.0, label="p") as s:
        assert Refiner(s, 20, 100, board, say=lambda m: None, prior=prior).prior == prior
        # fitted against another table's top: its ratios mean something else here
        other = dataclasses.replace(prior, f_max_mhz=1600.0)
        assert Refiner(s, 20, 100, board, say=lambda m: None, prior=other).prior is None
        # fitted with another voltage curve than this board's own (the twin knows its curve): not this board's either
        bent = dataclasses.replace(prior, voltage_shape=0.2)
        assert Refiner(s, 20, 100, board, say=lambda m: None, prior=bent).prior is None
        # a real board's curve is assumed, not known: the prior's fitted shape replaces the assumption
        assumed = dataclasses.replace(board, voltage_shape_known=False)
        assert Refiner(s, 20, 100, assumed, say=lambda m: None, prior=bent).voltage_shape == 0.2


def test_probe_plan_fits_with_the_prior_from_each_probes_utilisation():
    """Noise-free probes of a workload of the prior's own form: the plan's fit predicts every clock, and a prior
    without the probes' utilisation is not used (the fit is the plain one)."""
    import math

    from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE
    from dvfs_mlops.model.curve import PowerPrior

    k, idle = 0.8, 0.15

    def truth(f: float, util: bool = True) -> Measurement:
        g, v = f / 1000.0, 1 + ORIN_VOLTAGE_SHAPE * (f / 1300.5) ** 2
        t = 0.01 + 0.03 / g
        u = (0.002 + 0.03 / g) / t
        return Measurement(f, t, t * 12.0 * (1 + k * v * v * g * (idle + (1 - idle) * u)), u if util else None)

    prior = PowerPrior(idle, math.log(k), 0.03, 20)
    p = ProbePlan(816.0, TABLE, 30, voltage_shape=ORIN_VOLTAGE_SHAPE, noise=(0.01, 0.02), prior=prior)
    _drive(p, truth)
    for pt in p.predicted:
        assert pt.energy_j == pytest.approx(truth(pt.freq_mhz).energy_j, rel=1e-3)
    assert p.prior_used == prior
    plain = ProbePlan(816.0, TABLE, 30, voltage_shape=ORIN_VOLTAGE_SHAPE, noise=(0.01, 0.02))
    _drive(plain, lambda f: truth(f, util=False))
    no_util = ProbePlan(816.0, TABLE, 30, voltage_shape=ORIN_VOLTAGE_SHAPE, noise=(0.01, 0.02), prior=prior)
    _drive(no_util, lambda f: truth(f, util=False))
    assert [pt.energy_j for pt in no_util.predicted] == [pt.energy_j for pt in plain.predicted]
    assert no_util.prior_used is None  # so the run does not claim it (RefineResult.prior, tag refine.power_prior)


def test_dvfs_callback_refines_in_a_users_trainer_with_the_governors_power_prior(tmp_path, monkeypatch):
    """DvfsCallback(refine=N) in a real Trainer on the twin: probes through the step hook, the rest at the settled clock,
    and the version's power prior in the fits (the decision comes from a resolved governor, not `freq=`)."""
    from transformers import Trainer

    from dvfs_mlops.hw.board import ORIN_VOLTAGE_SHAPE
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.finetune import build_model
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops.governor import PolicyModel
    from dvfs_mlops.model.curve import PowerPrior

    prior = PowerPrior(0.15, 0.27, 0.03, 36, ORIN_VOLTAGE_SHAPE, 1300.5)
    ref = GovernorRef("models:/dvfs-governor@production", "dvfs-governor", 3, "production",
                      {"device_profile": "sim-orin", "power_prior": prior.to_json()})
    _use_governor(monkeypatch, ref, PolicyModel({"tree": {"freq_mhz": 612.0}}))
    w = prepare_workload("bert-tiny", "sst2", train_size=128, dev_size=16)

    train_split, collate = trainer_data(w)

    args = trainer_args(tmp_path / "out", 16)
    said: list[str] = []
    with DvfsCallback(device=SimDevice(), refine=12, announce=said.append, gpu_util_pct=90.0) as dvfs:
        Trainer(model=build_model(w.model_config, seed=0), args=args, train_dataset=train_split, data_collator=collate, callbacks=[dvfs]).train()
    res = dvfs.refined
    assert res is not None and res.start_mhz == 612.0 and res.prior == prior
    assert [p.freq_mhz for p in res.probes][:2] == [612.0, 408.0] and all(p.gpu_util is not None for p in res.probes)
    assert res.chosen_mhz in TABLE and dvfs.report.energy_j > sum(p.energy_j for p in res.probes)
    assert any(line.startswith("refine: settled at") for line in said)
    assert any("board's power prior from 36 workloads" in line for line in said)
