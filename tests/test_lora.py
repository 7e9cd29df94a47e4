"""LoRA (`--peft lora`, the peft library) on sweep, finetune and DvfsCallback: the twin traces the LoRA step as it runs,
`trainable_params` and `precision` are recorded and are governor features, and a LoRA workload is never a full one."""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from dvfs_mlops.app.cli import main
from dvfs_mlops.job.workloads.adapters import FULL, PeftSpec, peft_spec, variant_suffix
from dvfs_mlops.model.workload import split_variant
from tests.conftest import trainer_args, trainer_data
from tests.test_models import LLAMA, OPT, QWEN

SMALL = ["--tasks", "sst2", "--freqs", "816", "--steps", "2", "--train-size", "32", "--dev-size", "16", "--device", "sim"]


@pytest.fixture
def configs(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / f"{name}-tiny.json" for name in ("llama", "qwen", "opt")}
    for name, config in (("llama", LLAMA), ("qwen", QWEN), ("opt", OPT)):
        paths[name].write_text(json.dumps(config))
    return paths


@pytest.fixture
def store(empty_store: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", empty_store)
    return empty_store


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _points(store: str) -> list:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=store)
    exps = [e.experiment_id for e in c.search_experiments()]
    return c.search_runs(exps, filter_string="tags.`dvfs.point` != ''", max_results=1000)


def test_peft_options_become_a_checked_spec_and_a_workload_suffix():
    assert peft_spec() is FULL and variant_suffix(FULL) == "" and variant_suffix(FULL, "bf16") == "+bf16"
    lora = peft_spec("lora", 4, None, "q_proj, v_proj")
    assert lora == PeftSpec("lora", 4, 16, ("q_proj", "v_proj"))
    assert variant_suffix(lora, "fp16") == "+lora-r4a16-q_proj.v_proj+fp16"
    assert variant_suffix(peft_spec("lora")) == "+lora-r8a16"
    assert split_variant("sst2+lora-r8a16+bf16") == ("sst2", "+lora-r8a16+bf16") and split_variant("rte") == ("rte", "")
    assert lora.params() == {"peft": "lora", "lora_r": "4", "lora_alpha": "16", "lora_targets": "q_proj,v_proj", "lora_dropout": "0.05"}


@pytest.mark.parametrize(("args", "message"), [
    (["--lora-r", "4"], "--lora-r only apply with --peft lora"),
    (["--peft", "lora", "--lora-targets", "nope"], "--lora-targets nope match no module of this qwen2 model"),
    (["--peft", "qlora"], "'qlora' is not one of 'full', 'lora'"),
    (["--peft", "lora", "--lora-r", "0"], "0 is not in the range x>=1"),
])
def test_bad_peft_options_are_one_line(configs, store, args, message):
    r = _invoke("finetune", "--model", str(configs["qwen"]), "--task", "sst2", "--device", "sim", "--dry-run", *args)
    assert r.exit_code == 2 and message in r.stderr, r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("model", ["pythia-70m", "llama"])
def test_the_twin_traces_the_lora_step_as_it_runs_and_it_costs_less(model, tmp_path):
    """Frozen weights get no weight gradient and no AdamW state: fewer FLOPs, a smaller optimizer kernel, less energy
    per step than full fine-tuning of the same model, at every clock (a preset, and a Llama-style config of real width)."""
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    kwargs: dict = {"model": model}
    if model == "llama":
        path = tmp_path / "llama-mid.json"
        path.write_text(json.dumps({**LLAMA, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4, "num_attention_heads": 8,
                                    "num_key_value_heads": 4}))
        kwargs = {"model": None, "model_config_path": str(path)}
    full = prepare_workload(task="mrpc", train_size=64, dev_size=16, **kwargs)
    lora = prepare_workload(task="mrpc", train_size=64, dev_size=16, peft=peft_spec("lora"), **kwargs)
    assert lora.name == f"{full.name}+lora-r8a16" and full.name.endswith("/mrpc")
    assert lora.features.num_params == full.features.num_params == full.features.trainable_params
    assert 0 < lora.features.trainable_params < 0.01 * lora.features.num_params
    t_full, t_lora = full.trace_provider(16)(64), lora.trace_provider(16)(64)
    assert t_lora.num_params == lora.features.trainable_params and t_full.num_params == full.features.num_params
    assert t_lora.total_flops < 0.8 * t_full.total_flops  # no weight-gradient matmuls for the frozen base
    assert t_lora.bytes[-1] < 0.01 * t_full.bytes[-1]  # the optimizer kernel moves the adapters' state only
    sim = SimDevice()
    (c_full, _), (c_lora, _) = sim.curve(t_full), sim.curve(t_lora)
    assert all(c_lora[f].energy_j < c_full[f].energy_j for f in c_full)


def test_sweep_with_and_without_lora_on_configs_that_are_not_presets(configs, store):
    """Llama-, Qwen2- and OPT-style configs, full and LoRA, through one sweep id: the LoRA points run (they never resume
    the full ones), record peft and trainable_params, and cost less on the twin (noise-free values)."""
    models = ",".join(str(p) for p in configs.values())
    r = _invoke("sweep", "--preset", "smoke", "--models", models, *SMALL, "--sweep-id", "mixed")
    assert r.exit_code == 0, r.output
    r = _invoke("sweep", "--preset", "smoke", "--models", models, *SMALL, "--sweep-id", "mixed", "--peft", "lora")
    assert r.exit_code == 0, r.output
    assert "6 points, 0 already finished, 6 to run" in r.output  # the full points are another workload
    runs = [x for x in _points(store) if x.data.params["freq_mhz"] == "816"]
    assert len(runs) == 6
    by = {x.data.tags["dvfs.workload"]: x for x in runs}
    for name in ("llama-tiny", "qwen-tiny", "opt-tiny"):
        full = next(x for w, x in by.items() if w.startswith(name) and w.endswith("/sst2"))
        lora = next(x for w, x in by.items() if w.startswith(name) and w.endswith("/sst2+lora-r8a16"))
        assert full.data.params["peft"] == "full" and lora.data.params["peft"] == "lora" and lora.data.params["lora_r"] == "8"
        assert full.data.params["trainable_params"] == full.data.params["num_params"] == lora.data.params["num_params"]
        assert int(lora.data.params["trainable_params"]) < int(full.data.params["num_params"])
        # (the energy of these 64-wide toys is kernel-launch bound, where LoRA's extra small kernels cost as much as they
        # save: the saving is checked on real sizes in test_the_twin_traces_the_lora_step_as_it_runs_and_it_costs_less)
        assert lora.data.metrics["energy_expected_j"] > 0 and full.data.metrics["energy_expected_j"] > 0


def test_finetune_with_lora_and_bf16_on_a_qwen_config(configs, store):
    assert _invoke("registry", "bootstrap").exit_code == 0
    assert _invoke("registry", "promote", "1").exit_code == 0
    r = _invoke("finetune", "--model", str(configs["qwen"]), "--task", "sst2", "--device", "sim", "--steps", "3", "--train-size", "32",
                "--probe-steps", "0", "--no-save-model", "--peft", "lora", "--lora-r", "4", "--lora-targets", "q_proj,k_proj,v_proj",
                "--precision", "bf16", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert re.fullmatch(r"qwen-tiny-[0-9a-f]{6}/sst2\+lora-r4a16-q_proj\.k_proj\.v_proj\+bf16", out["workload"])
    features = out["decision"]["features"]
    assert features["precision"] == "bf16" and 0 < features["trainable_params"] < features["num_params"]
    from mlflow.tracking import MlflowClient

    params = MlflowClient(tracking_uri=store).get_run(out["run_id"]).data.params
    assert (params["peft"], params["lora_r"], params["lora_targets"], params["precision"]) == ("lora", "4", "q_proj,k_proj,v_proj", "bf16")
    assert params["trainable_params"] == str(features["trainable_params"])


def _curve(workload: str, energy: dict[float, float], **features):
    from dvfs_mlops.model.governor.dataset import WorkloadCurve
    from dvfs_mlops.model.workload import WorkloadFeatures

    f = WorkloadFeatures("decoder", 12, 768, 100_000_000, 40.0, 90.0, **features)
    return WorkloadCurve(workload, "train", f, energy, {k: 1000.0 / k for k in energy}, max(energy.values()), 0.7)


def test_trainable_params_and_precision_are_features_where_a_sweep_varies_them():
    from dvfs_mlops.model.governor.search import search_features

    e = {510.0: 1.0, 816.0: 1.1}
    full = [_curve("a/sst2", e), _curve("b/rte", e)]
    assert search_features(full) == ("is_decoder", "num_layers", "hidden_size", "num_params", "avg_seq_len", "gpu_util_pct")
    mixed = [*full, _curve("a/sst2+lora-r8a16+bf16", e, trainable_params=400_000, precision="bf16")]
    assert search_features(mixed)[-2:] == ("trainable_params", "half_precision")
    assert mixed[2].task == "sst2" and mixed[2].model == "a"  # held out with its task, not as a task of its own
    row = mixed[2].features.numeric_row()
    assert row["trainable_params"] == 400_000 and row["half_precision"] == 1.0


def test_a_tree_splitting_on_the_new_features_reads_rows_from_before_them_as_full_fp32():
    from dvfs_mlops.model.governor import policy_tree

    policy = {"tree": {"feature": "trainable_params", "threshold": 1e6, "left": {"freq_mhz": 510.0},
                       "right": {"feature": "half_precision", "threshold": 0.5, "left": {"freq_mhz": 816.0}, "right": {"freq_mhz": 612.0}}}}
    old = {"model_type": "decoder", "num_layers": 6, "hidden_size": 512, "num_params": 70_000_000, "avg_seq_len": 30.0, "gpu_util_pct": 80.0}
    assert policy_tree.decide(policy, old)[0] == 816.0  # trainable = num_params, fp32
    assert policy_tree.decide(policy, {**old, "precision": "bf16"}) == (612.0, ["trainable_params=7e+07 > 1e+06", "precision=bf16 > 0.5"])
    assert policy_tree.decide(policy, {**old, "trainable_params": 300_000})[0] == 510.0


def test_dvfs_callback_sees_a_peft_model_and_bf16(tmp_path):
    """A user's Trainer with a peft-wrapped model and bf16=True: the callback's features carry trainable_params and
    precision, and the twin charges the LoRA step in bf16."""
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer

    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.integrations.transformers import DvfsCallback
    from dvfs_mlops.job.finetune import build_model
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "sst2", train_size=64, dev_size=16)
    with warnings.catch_warnings():  # peft on transformers 5 (the user's own call here): a deprecation they cannot act on
        warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.*", category=FutureWarning)
        model = get_peft_model(build_model(w.model_config, seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"],
                                                                               task_type="SEQ_CLS"))

    train_split, collate = trainer_data(w)

    args = trainer_args(tmp_path / "out", 2, bf16=True)
    with DvfsCallback(device=SimDevice(), freq=816, announce=None) as dvfs:
        Trainer(model=model, args=args, train_dataset=train_split, data_collator=collate, callbacks=[dvfs]).train()
    f = dvfs.features
    assert f.precision == "bf16" and f.num_params == w.features.num_params
    assert f.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad) < f.num_params
    assert dvfs._trace.dtype == "bfloat16" and dvfs._trace.num_params == f.trainable_params
    assert dvfs.report.energy_j > 0 and dvfs.report.simulated


def test_a_governor_registered_before_the_new_columns_gets_only_the_columns_it_declares():
    """MLflow warns on every call about inputs a signature lacks; the launcher and evaluate send a version only what it
    declares (our own PolicyModel, without a signature, gets every column)."""
    from types import SimpleNamespace

    from mlflow.types import ColSpec, Schema

    from dvfs_mlops.mlops.governor import PolicyModel, input_frame
    from dvfs_mlops.mlops.pyfunc import input_example

    old = Schema([ColSpec("string", "model_type"), ColSpec("long", "num_layers"), ColSpec("long", "hidden_size"),
                  ColSpec("long", "num_params"), ColSpec("double", "avg_seq_len"), ColSpec("double", "gpu_util_pct")])
    older = SimpleNamespace(metadata=SimpleNamespace(get_input_schema=lambda: old))
    rows = input_example()
    assert list(input_frame(older, rows).columns) == old.input_names()
    assert list(input_frame(PolicyModel({"tree": {"freq_mhz": 612.0}}), rows).columns) == list(rows[0])


def test_a_sweep_checks_every_models_lora_targets_before_the_first_point(configs, store):
    models = f"bert-tiny,{configs['llama']}"
    r = _invoke("sweep", "--preset", "smoke", "--models", models, *SMALL, "--peft", "lora", "--lora-targets", "q_proj,v_proj")
    assert r.exit_code == 2 and "--lora-targets q_proj,v_proj match no module of this bert model" in r.stderr, r.output
    assert _points(store) == []  # nothing ran: bert-tiny (first in the list) calls them query/value


def test_lora_on_the_instruct_task_adapts_the_causal_lm(configs, store):
    """LoRA on a causal-LM task: peft's CAUSAL_LM wrapping (no classifier head to train), through a sweep on the twin."""
    r = _invoke("sweep", "--preset", "smoke", "--models", str(configs["llama"]), "--tasks", "instruct", "--freqs", "816", "--steps", "2",
                "--train-size", "32", "--dev-size", "16", "--device", "sim", "--peft", "lora", "--lora-r", "4")
    assert r.exit_code == 0, r.output
    run = next(x for x in _points(store) if x.data.params["freq_mhz"] == "816")
    assert run.data.tags["dvfs.workload"].endswith("/instruct+lora-r4a16")
    assert 0 < int(run.data.params["trainable_params"]) < int(run.data.params["num_params"])
    assert 0.0 <= run.data.metrics["eval_token_accuracy"] <= 1.0
