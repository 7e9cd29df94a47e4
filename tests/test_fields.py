"""One record, both ways: every param and metric a job's run logs is declared once (`mlops/fields.py`, the features in
`WorkloadFeatures`); what the writer logs, the dataset reader reads back equal and typed, and the pyfunc's signature
and the docs' table come from the same declarations."""
from __future__ import annotations

import dataclasses

import pytest


@pytest.fixture
def store(tmp_path, empty_store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    monkeypatch.chdir(tmp_path)
    return empty_store


def _point(freq, peft_method: str = "full", precision: str = "fp32"):
    """A real twin job at `freq` (profile-only: the twin charges the steps), its record, and its workload."""
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.job.finetune import FinetuneConfig
    from dvfs_mlops.job.run import PROFILE, Job
    from dvfs_mlops.job.workloads.adapters import peft_spec
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.mlops import records
    from dvfs_mlops.mlops.launch import Decision, Launch

    peft = peft_spec(peft_method)
    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16, peft=peft, precision=precision)
    dev = SimDevice()
    board = board_of(dev)
    job = Job(w, FinetuneConfig(steps=8, batch_size=8, precision=precision, peft=peft), board.torch_device)
    done = Launch(dev, board, Decision.at(freq), label=f"{w.name}#0").run(job, mode=PROFILE)
    record = records.job_record(job, board, done.session, done.result, freq, profiled=True).plus(params={"repeat": 0})
    return record, w, board


def _log(record, sweep: str, key: str) -> str:
    from dvfs_mlops.mlops import lifecycle, schema

    tags = {schema.TAG_SWEEP: sweep, schema.TAG_POINT: key, schema.TAG_WORKLOAD: key.split("@")[0]}
    with lifecycle.owned_run("dvfs-sweep", name=key, tags=tags) as run:
        run.log(record)
    return run.run_id


def test_a_written_run_reads_back_equal_and_typed(store):
    from mlflow.tracking import MlflowClient

    from dvfs_mlops.mlops.dataset import run_record

    record, _, _ = _point(816.0)
    got = MlflowClient().get_run(_log(record, "sweep-rt", "bert-tiny/sst2@816#0")).data
    back = run_record(dict(got.params), dict(got.metrics), dict(got.tags))
    assert back.params == record.params  # every param its own type again: ints, floats, text
    assert {k: type(v) for k, v in back.params.items()} == {k: type(v) for k, v in record.params.items()}
    written = {k: v for k, v in record.metrics.items() if v is not None}
    assert {k: v for k, v in back.metrics.items() if k != "power_w"} == pytest.approx(written)
    assert back.metrics["power_w"] == pytest.approx(record.series["power_w"][-1])  # a series: its last value
    assert {k: back.tags[k] for k in record.tags} == record.tags


def test_the_dataset_reads_the_features_the_writer_wrote(store):
    import mlflow

    from dvfs_mlops.mlops.dataset import dataset_from_frame

    runs = {}
    for freq in ("maxn", 612.0, 918.0):
        record, workload, board = _point(freq, "lora", "bf16")
        runs[freq] = record
        _log(record, "sweep-rt", f"{workload.name}@{freq if freq == 'maxn' else f'{freq:g}'}#0")
    frame = mlflow.search_runs([mlflow.get_experiment_by_name("dvfs-sweep").experiment_id])
    curve = dataset_from_frame(frame, "sweep-rt", board.profile, True, board).curves[0]
    from dvfs_mlops.mlops.records import feature_params
    from dvfs_mlops.model.workload import WorkloadFeatures

    written = WorkloadFeatures(**feature_params(workload.features), gpu_util_pct=runs["maxn"].metrics["gpu_util_pct"])
    assert curve.features == written  # the features as the writer logged them (lengths to 3 decimals)
    assert curve.features.avg_seq_len == pytest.approx(workload.features.avg_seq_len, abs=5e-4)
    assert curve.features.trainable_params < curve.features.num_params and curve.features.precision == "bf16"
    assert curve.energy_j == {612.0: pytest.approx(runs[612.0].metrics["energy_j"]), 918.0: pytest.approx(runs[918.0].metrics["energy_j"])}
    assert curve.maxn_time_s == pytest.approx(runs["maxn"].metrics["time_s"])


@pytest.mark.parametrize("peft, precision", [("full", "fp32"), ("lora", "bf16")])
def test_every_name_a_job_writes_is_declared(peft, precision):
    from dvfs_mlops.mlops import fields

    record, _, _ = _point(816.0, peft, precision)
    assert [k for k in record.params if not fields.declared(k, "param")] == []
    assert [k for k in record.metrics if not fields.declared(k, "metric")] == []
    assert [k for k in record.series if not fields.declared(k, "metric")] == []


def test_an_undeclared_name_is_an_error_where_it_is_read():
    from dvfs_mlops.mlops import fields

    assert fields.column("num_layers") == "params.num_layers" and fields.column("energy_j", "metric") == "metrics.energy_j"
    with pytest.raises(KeyError, match="'num_layer' is not declared"):
        fields.column("num_layer")


def test_the_pyfunc_signature_and_the_docs_table_come_from_the_declarations():
    from dvfs_mlops.mlops import fields, pyfunc
    from dvfs_mlops.model.workload import FEATURE_COLUMNS, WorkloadFeatures

    inputs = pyfunc.signature().inputs
    assert inputs.input_names() == list(FEATURE_COLUMNS)
    optional = {f.name for f in dataclasses.fields(WorkloadFeatures) if f.default is not dataclasses.MISSING}
    assert {c.name for c in inputs.inputs if not c.required} == optional == {"trainable_params", "precision"}
    assert {c.name: c.type.name for c in inputs.inputs}["avg_seq_len"] == "double"
    table = fields.markdown_table()
    for f in fields.FIELDS:
        assert f"| `{f.name}` | {f.kind} | {f.type.__name__} | {f.unit} |" in table
    assert all(row.count("|") == 7 for row in table.splitlines())
