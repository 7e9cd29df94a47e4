"""The causal-LM instruction task `instruct` (issue 15): synthetic and JSONL data, the prompt-masked LM encoding, the
causal-LM model and its parameter count, the twin's LM-head trace, and the commands (sweep, finetune, simulate) on it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dvfs_mlops.app.cli import main
from dvfs_mlops.errors import DvfsError
from dvfs_mlops.job.workloads.instruct import OPERATIONS, apply_operation, read_jsonl
from dvfs_mlops.job.workloads.tasks import CHARACTERISATION_TASKS, TASKS, Example, get_task, load_task
from dvfs_mlops.job.workloads.tokenizer import IGNORE_INDEX, collate, lm_labels, lm_sequence, train_wordpiece, training_texts

LLAMA = {"model_type": "llama", "vocab_size": 8000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
TINY = ["--steps", "2", "--train-size", "32", "--dev-size", "16", "--device", "sim"]


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    path = tmp_path / "llama-tiny.json"
    path.write_text(json.dumps(LLAMA))
    return path


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


def _one_error_line(r) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error: "), (r.exit_code, r.stderr)
    return lines[0]


# ---- the task and its synthetic data -----------------------------------------------------------------------

def test_instruct_is_a_causal_lm_task_beside_glue_that_leaves_the_paper_preset_alone():
    from dvfs_mlops.mlops.sweep.spec import PRESETS

    task = get_task("instruct")
    assert (task.kind, task.metric, task.split, task.num_labels) == ("causal_lm", "eval_token_accuracy", "eval", 0)
    assert not task.is_regression and get_task("stsb").kind == "regression" and get_task("rte").kind == "classification"
    assert "instruct" not in TASKS and PRESETS["paper"].tasks == tuple(TASKS) and len(TASKS) == 9
    assert CHARACTERISATION_TASKS == ("sst2", "qnli", "mrpc")


def test_synthetic_pairs_are_deterministic_learnable_transformations_with_the_length_profile():
    a, b, c = (load_task("instruct", seed=s, train_size=400, dev_size=20) for s in (1, 1, 2))
    assert a.train == b.train and a.dev == b.dev and a.train != c.train and a.train != a.dev[:400]
    for e in a.train[:50]:
        op, *words = e.text_a.split()
        assert op in OPERATIONS and e.text_b == " ".join(apply_operation(op, words))  # the response follows from the prompt
    assert {e.text_a.split()[0] for e in a.train} == set(OPERATIONS)
    enc = train_wordpiece(training_texts(a.train))
    encoded = enc.encode_lm(a.train)
    assert abs(encoded.mean_length - get_task("instruct").mean_tokens) <= 0.1 * get_task("instruct").mean_tokens, encoded.mean_length
    assert max(len(x) for x in encoded.ids) <= 128


def test_labels_mask_the_prompt_separator_and_padding():
    data = [Example("reverse alpha beta gamma", "gamma beta alpha", 0.0), Example("copy delta", "delta", 0.0)]
    enc = train_wordpiece(training_texts(data) * 3, vocab_size=200)
    sep = enc.backend.token_to_id("[SEP]")
    encoded = enc.encode_lm(data)
    first, start = encoded.ids[0], encoded.response_start[0]
    assert first[start - 1] == sep and first[-1] == sep  # prompt [SEP] response [SEP]
    assert enc.backend.decode(first[:start - 1]) == "reverse alpha beta gamma"
    assert enc.backend.decode(first[start:-1]) == "gamma beta alpha"
    ids, mask = collate(encoded.ids, enc.pad_id)
    labels = lm_labels(encoded.ids, encoded.response_start, ids.shape[1])
    for i, x in enumerate(encoded.ids):
        s = encoded.response_start[i]
        assert (labels[i, :s] == IGNORE_INDEX).all()  # the prompt and its separator: no loss
        assert list(labels[i, s:len(x)]) == x[s:]  # the response and its end token: the loss
        assert (labels[i, len(x):] == IGNORE_INDEX).all() and (mask[i, len(x):] == 0).all()  # padding


def test_truncation_keeps_part_of_the_response():
    prompt, response = list(range(100, 300)), list(range(300, 340))
    seq, start = lm_sequence(prompt, response, [3], [3], 128)
    assert len(seq) == 128 and seq[start - 1] == 3 and seq[start:] == [*response, 3]  # a long prompt is cut, not the answer
    seq, start = lm_sequence(list(range(10)), list(range(300, 600)), [3], [3], 128)
    assert len(seq) == 128 and start == 11 and seq[start:] == list(range(300, 417))  # a long answer is cut at its end
    seq, start = lm_sequence(list(range(500)), list(range(300, 600)), [3], [3], 128)
    assert len(seq) == 128 and len(seq) - start >= 63  # both long: the response keeps half the room


def test_a_tiny_llama_learns_the_synthetic_task(llama: Path):
    """A few steps of a Llama-style config from random init: the loss drops and response tokens are predicted far
    above chance (1 in the 8000-token vocabulary)."""
    from dvfs_mlops.job.finetune import FinetuneConfig, finetune
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("llama-tiny", "instruct", model_config_path=str(llama), train_size=256, dev_size=32)
    cfg = FinetuneConfig(steps=20, batch_size=16, learning_rate=1e-2)
    r = finetune(w, cfg)
    assert r.eval_metric == "eval_token_accuracy" and set(r.extra_metrics) == {"eval_loss"}
    assert r.train_loss < 0.85 * np.log(8000), r.train_loss  # from ~ln(8000) = 9.0 at random init
    assert r.extra_metrics["eval_loss"] < 0.85 * np.log(8000) and r.eval_value > 50 / 8000, (r.eval_value, r.extra_metrics)
    assert type(r.model).__name__ == "LlamaForCausalLM"


def test_param_count_and_config_are_the_causal_lms():
    from dvfs_mlops.job.workloads.features import classifier_config, facts_key
    from dvfs_mlops.job.workloads.prepare import prepare_workload
    from dvfs_mlops.job.workloads.zoo import resolve_model

    lm = prepare_workload("pythia-14m", "instruct", train_size=64, dev_size=8)
    cls = prepare_workload("pythia-14m", "sst2", train_size=64, dev_size=8)
    assert lm.features.num_params - cls.features.num_params == 50304 * 128 - 2 * 128  # the LM head instead of a 2-way score
    assert lm.features.model_type == "decoder" and lm.features.avg_seq_len == pytest.approx(np.mean([len(x) for x in lm.train.ids]))
    spec = resolve_model("pythia-14m")
    assert facts_key(spec, 0, "causal_lm") != facts_key(spec, 0, "classification")
    cfg = classifier_config(spec, 0, 0, "causal_lm")
    assert getattr(cfg, "problem_type", None) is None and cfg.num_labels == spec.config.num_labels  # no classification fields


# ---- JSONL files -------------------------------------------------------------------------------------------

def _jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = [{"prompt": "Say hi.", "response": "Hi!", "id": 1}, {"prompt": "", "response": "An answer without a prompt."}]


@pytest.mark.parametrize("layout", ["task-folder", "flat"])
def test_jsonl_data_dir_in_either_layout(tmp_path: Path, layout: str):
    folder = tmp_path / "instruct" if layout == "task-folder" else tmp_path
    _jsonl(folder / "train.jsonl", GOOD)
    (folder / "dev.jsonl").write_text('\ufeff{"prompt": "Say bye.", "response": "Bye!"}\n\n')  # a BOM and a blank line
    d = load_task("instruct", data_dir=tmp_path)
    assert d.source == "jsonl" and [(e.text_a, e.text_b) for e in d.train] == [("Say hi.", "Hi!"), ("", "An answer without a prompt.")]
    assert [(e.text_a, e.text_b) for e in d.dev] == [("Say bye.", "Bye!")]


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "a", "response": "b"}', '{"prompt": "a", "response": "b"'], r"f.jsonl:2: not JSON"),
    (['{"prompt": "a", "response": "b"}', "", '{"prompt": "a"}'], r"f.jsonl:3: no \"response\" key"),
    (['{"response": "b"}'], r"f.jsonl:1: no \"prompt\" key"),
    (['{"prompt": "a", "response": 7}'], r"f.jsonl:1: \"response\" is int, not a string"),
    (['{"prompt": ["a"], "response": "b"}'], r"f.jsonl:1: \"prompt\" is list, not a string"),
    (['["a", "b"]'], r"f.jsonl:1: expected a JSON object"),
    (['{"prompt": "a", "response": "  "}'], r"f.jsonl:1: \"response\" is empty"),
    ([], r"f.jsonl is empty"),
    (["", "  "], r"f.jsonl is empty"),
])
def test_bad_jsonl_lines_are_one_line_errors_naming_file_and_line(tmp_path: Path, lines: list, message: str):
    f = _jsonl(tmp_path / "f.jsonl", lines) if lines else tmp_path / "f.jsonl"
    if not lines:
        f.write_text("")
    with pytest.raises(DvfsError, match=message) as e:
        read_jsonl(f)
    assert "\n" not in str(e.value) and str(f) in str(e.value)


def test_missing_files_and_the_hub_are_clear(tmp_path: Path):
    with pytest.raises(DvfsError, match=r"has no instruct/train.jsonl or train.jsonl for task instruct"):
        load_task("instruct", data_dir=tmp_path)
    _jsonl(tmp_path / "instruct" / "train.jsonl", GOOD)
    with pytest.raises(DvfsError, match=r"instruct/dev.jsonl does not exist"):
        load_task("instruct", data_dir=tmp_path)
    with pytest.raises(DvfsError, match=r"task instruct has no hub dataset; use --data-source synthetic or --data-dir DIR"):
        load_task("instruct", source="hub")


def test_the_token_length_cache_is_keyed_by_the_jsonl_files(tmp_path: Path):
    from dvfs_mlops.job.workloads.prepare import lengths_key

    task = get_task("instruct")
    _jsonl(tmp_path / "instruct" / "train.jsonl", GOOD)
    _jsonl(tmp_path / "instruct" / "dev.jsonl", GOOD)
    key = lengths_key(task, "tsv", str(tmp_path), 0, 2048, 128, None)
    assert key is not None and key == lengths_key(task, "tsv", str(tmp_path), 5, 10, 128, None)  # seed and size: synthetic only
    _jsonl(tmp_path / "instruct" / "dev.jsonl", GOOD[:1])
    assert lengths_key(task, "tsv", str(tmp_path), 0, 2048, 128, None) != key
    assert lengths_key(task, "synthetic", None, 0, 2048, 128, None) != lengths_key(get_task("sst2"), "synthetic", None, 0, 2048, 128, None)


# ---- the twin ----------------------------------------------------------------------------------------------

def test_the_twin_traces_the_lm_head_and_charges_longer_sequences_more(trace_cache_dir: Path):
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.hw.twin.trace import TraceCache, trace_key
    from dvfs_mlops.job.workloads.features import classifier_config
    from dvfs_mlops.job.workloads.zoo import resolve_model

    spec = resolve_model("pythia-14m")
    lm_cfg = classifier_config(spec, 0, 0, "causal_lm")
    traces = TraceCache(trace_cache_dir)
    twin = SimDevice()
    energy = {}
    for kind, cfg in (("causal_lm", lm_cfg), ("classification", spec.config)):
        for seq in (64, 128):
            trace = traces.get(cfg, 16, seq, "float32", 0 if kind == "causal_lm" else 2, kind=kind)
            curve, _ = twin.curve(trace)
            energy[kind, seq] = curve[816.0].energy_j
    assert energy["causal_lm", 128] > 1.5 * energy["causal_lm", 64]  # a longer sequence costs more per step
    assert energy["causal_lm", 64] > 1.2 * energy["classification", 64]  # the vocabulary-wide LM head and its loss are charged
    assert trace_key(spec.config, 16, 64, "float32", 2) == trace_key(spec.config, 16, 64, "float32", 2, kind="classification")
    assert trace_key(lm_cfg, 16, 64, "float32", 0, kind="causal_lm") != trace_key(lm_cfg, 16, 64, "float32", 0)


def test_simulate_takes_the_task(llama: Path):
    r = _invoke("simulate", "pythia-14m", "--task", "instruct", "--json")
    assert r.exit_code == 0, r.output
    lm = json.loads(r.stdout)
    assert lm["task"] == "instruct" and lm["seq_len"] == 96 and lm["num_params"] > 14_000_000  # LM head included
    glue = json.loads(_invoke("simulate", "pythia-14m", "--task", "sst2", "--seq-len", "96", "--json").stdout)
    assert lm["points"][5]["energy_j"] > glue["points"][5]["energy_j"]
    assert _invoke("simulate", "--model-config", str(llama), "--task", "instruct", "--seq-len", "64").exit_code == 0
    line = _one_error_line(_invoke("simulate", "bert-mini", "--task", "instruct"))
    assert "needs a decoder model" in line and "bert-mini is an encoder (bert)" in line


# ---- the commands ------------------------------------------------------------------------------------------

def test_sweep_on_instruct_end_to_end_with_a_llama_config(llama: Path, store: str):
    r = _invoke("sweep", "--preset", "smoke", "--models", str(llama), "--tasks", "instruct,sst2", "--freqs", "816", *TINY)
    assert r.exit_code == 0, r.output
    runs = _points(store)
    assert len(runs) == 4
    lm = [x for x in runs if x.data.params["task"] == "instruct"]
    glue = [x for x in runs if x.data.params["task"] == "sst2"]
    assert len(lm) == 2 and {x.data.params["split"] for x in lm} == {"eval"}
    for x in lm:
        m = x.data.metrics
        assert 0.0 <= m["eval_token_accuracy"] <= 1.0 and m["eval_loss"] > 0 and "eval_accuracy" not in m
    assert 80 < float(lm[0].data.params["avg_seq_len"]) < 110
    assert int(lm[0].data.params["num_params"]) > int(glue[0].data.params["num_params"])  # the LM head is counted
    at = {x.data.params["task"]: x.data.metrics["energy_expected_j"] for x in runs if x.data.params["freq_mhz"] == "816"}
    assert at["instruct"] > at["sst2"]  # longer sequences and the LM head


def test_finetune_on_instruct_from_jsonl_files(llama: Path, store: str, tmp_path: Path):
    from dvfs_mlops.job.workloads.instruct import make_pairs

    pairs = [{"prompt": p, "response": r} for p, r in make_pairs("instruct", "train", 48, 3, 40)]
    _jsonl(tmp_path / "data" / "instruct" / "train.jsonl", pairs[:32])
    _jsonl(tmp_path / "data" / "instruct" / "dev.jsonl", pairs[32:])
    assert _invoke("registry", "bootstrap").exit_code == 0
    assert _invoke("registry", "promote", "1").exit_code == 0
    r = _invoke("finetune", "--model", str(llama), "--task", "instruct", "--device", "sim", "--steps", "2", "--data-dir",
                str(tmp_path / "data"), "--probe-steps", "0", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["workload"].endswith("/instruct") and out["decision"]["features"]["model_type"] == "decoder"
    assert 0.0 <= out["metrics"]["eval_token_accuracy"] <= 1.0 and out["metrics"]["eval_loss"] > 0
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=store).get_run(out["run_id"])
    assert run.data.params["task"] == "instruct" and run.data.params["data_source"] == "jsonl"
    assert {a.path for a in MlflowClient(tracking_uri=store).list_artifacts(out["run_id"], "model")} >= {"model/config.json"}


def test_a_warm_dry_run_on_instruct_imports_neither_torch_nor_transformers(tmp_path: Path):
    """The token-length, parameter-count and trace caches serve instruct as they serve GLUE: the second decision
    for a workload imports neither torch nor transformers, and decides as the first."""
    import os

    from tests.conftest import REPO, production_store
    from tests.test_decision_speed import _probe

    env = production_store(tmp_path, DVFS_CACHE_DIR=str(tmp_path / "cache"))
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    args = ["finetune", "--model", "pythia-14m", "--task", "instruct", "--device", "sim", "--dry-run", "--probe-steps", "0",
            "--train-size", "256", "--json"]
    cold, cold_report, _ = _probe(env, tmp_path, *args)
    assert set(cold_report["heavy"]) >= {"torch", "transformers"}
    warm, warm_report, _ = _probe(env, tmp_path, *args)
    assert warm_report["heavy"] == [] and warm["decision"] == cold["decision"]
    assert warm["decision"]["features"]["num_params"] == 14067712  # pythia-14m with its LM head


def test_encode_lm_with_a_pretrained_tokenizer():
    """A pretrained tokenizer: its sep token (else a newline) between prompt and response, its eos at the end."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from dvfs_mlops.job.workloads.tokenizer import TextEncoder

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["say hi back to me"] * 3, trainers.WordLevelTrainer(special_tokens=["<unk>", "<eos>"]))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    hf.pad_token = hf.eos_token
    enc = TextEncoder(hf, int(hf.pad_token_id), 128, hf=True)
    encoded = enc.encode_lm([Example("say hi", "hi back", 0.0)])
    ids, start = encoded.ids[0], encoded.response_start[0]
    assert ids[-1] == hf.eos_token_id and hf.decode(ids[:start - 1]) == "say hi" and hf.decode(ids[start:-1]) == "hi back"
    assert ids[start - 1] == hf.eos_token_id  # no sep token and "\n" is not a word of it here: eos separates


def test_an_encoder_on_instruct_is_refused_in_one_line_before_anything_runs(store: str, tmp_path: Path):
    r = _invoke("sweep", "--preset", "smoke", "--models", "pythia-14m,bert-mini", "--tasks", "sst2,instruct", *TINY)
    line = _one_error_line(r)
    assert "task instruct is a causal-LM (instruction) task and needs a decoder model" in line and "bert-mini is an encoder" in line
    assert _points(store) == []  # checked before the first point, pythia-14m's included
    r = _invoke("finetune", "--model", "bert-mini", "--task", "instruct", "--steps", "2", "--device", "sim")
    assert "bert-mini is an encoder (bert)" in _one_error_line(r)
    r = _invoke("sweep", "--preset", "smoke", "--models", "pythia-14m", "--tasks", "instruct", "--data-dir", str(tmp_path), *TINY)
    assert "has no instruct/train.jsonl or train.jsonl for task instruct" in _one_error_line(r)


def test_a_config_without_a_causal_lm_class_is_refused_in_one_line(store: str, tmp_path: Path):
    t5 = tmp_path / "t5-tiny.json"  # neither an encoder of ours nor a causal LM of transformers'
    t5.write_text(json.dumps({"model_type": "t5", "vocab_size": 8000, "d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 2,
                              "d_kv": 16}))
    r = _invoke("sweep", "--preset", "smoke", "--models", str(t5), "--tasks", "instruct", *TINY)
    assert "model type 't5' has no causal-LM class in transformers" in _one_error_line(r) and _points(store) == []
