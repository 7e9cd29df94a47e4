"""Your own models: transformers configs of architectures that are not presets (Llama-, Qwen2- and OPT-style, written
here), local pretrained folders and hub names, in `sweep --models` and `finetune --model`, on the twin."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from dvfs_mlops.app.cli import main
from dvfs_mlops.job.workloads.zoo import ModelEntry, model_entry

LLAMA = {"model_type": "llama", "vocab_size": 8000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
QWEN = {"model_type": "qwen2", "vocab_size": 8192, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}
OPT = {"model_type": "opt", "vocab_size": 8000, "hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "max_position_embeddings": 256, "word_embed_proj_dim": 32}
SMALL = ["--tasks", "sst2", "--freqs", "816", "--steps", "2", "--train-size", "32", "--dev-size", "16", "--device", "sim"]


@pytest.fixture
def configs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "qwen-tiny").mkdir()
    paths = {"llama": tmp_path / "llama-tiny.json", "qwen": tmp_path / "qwen-tiny", "opt": tmp_path / "opt-tiny.json"}
    paths["llama"].write_text(json.dumps(LLAMA))
    (paths["qwen"] / "config.json").write_text(json.dumps(QWEN))
    paths["opt"].write_text(json.dumps(OPT))
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


def test_entries_name_configs_by_content_not_path(configs: dict[str, Path], tmp_path: Path):
    llama = model_entry(str(configs["llama"]))
    assert re.fullmatch(r"llama-tiny-[0-9a-f]{6}", llama.name) and llama.config_path == str(configs["llama"].resolve())
    moved = tmp_path / "elsewhere" / "llama-tiny.json"
    moved.parent.mkdir()
    shutil.copy(configs["llama"], moved)
    assert model_entry(str(moved)).name == llama.name  # another board, another path: the same model
    moved.write_text(json.dumps({**LLAMA, "num_hidden_layers": 4}))
    assert model_entry(str(moved)).name != llama.name  # an edited config is another model
    assert re.fullmatch(r"qwen-tiny-[0-9a-f]{6}", model_entry(str(configs["qwen"])).name)
    assert model_entry("bert-tiny") == ModelEntry("bert-tiny")
    assert model_entry("Qwen/Qwen2.5-0.5B") == ModelEntry("Qwen--Qwen2.5-0.5B", pretrained="Qwen/Qwen2.5-0.5B")


def test_sweep_takes_presets_and_configs_mixed_and_resumes_them_from_another_path(configs, store, tmp_path):
    models = ",".join(["bert-tiny", str(configs["llama"]), str(configs["qwen"]), str(configs["opt"])])
    r = _invoke("sweep", "--preset", "smoke", "--models", models, *SMALL)
    assert r.exit_code == 0, r.output
    runs = _points(store)
    by_model = {x.data.params["model"]: x for x in runs if x.data.params["freq_mhz"] == "816"}
    names = sorted(by_model)
    assert len(runs) == 8 and names[0] == "bert-tiny" and [n.rsplit("-", 1)[0] for n in names[1:]] == ["llama-tiny", "opt-tiny", "qwen-tiny"]
    # features read from configs the code has never seen
    qwen = next(x for n, x in by_model.items() if n.startswith("qwen-tiny"))
    assert (qwen.data.params["model_type"], qwen.data.params["num_layers"], qwen.data.params["hidden_size"]) == ("decoder", "3", "64")
    opt = next(x for n, x in by_model.items() if n.startswith("opt-tiny"))
    assert (opt.data.params["num_layers"], opt.data.params["hidden_size"]) == ("2", "32") and int(opt.data.params["num_params"]) > 0
    # the same configs at other paths: the same sweep, nothing runs again
    other = tmp_path / "copy"
    shutil.copytree(configs["qwen"], other / "qwen-tiny")
    shutil.copy(configs["llama"], other / "llama-tiny.json")
    shutil.copy(configs["opt"], other / "opt-tiny.json")
    again = ",".join(["bert-tiny", str(other / "llama-tiny.json"), str(other / "qwen-tiny"), str(other / "opt-tiny.json")])
    r2 = _invoke("sweep", "--preset", "smoke", "--models", again, *SMALL)
    assert r2.exit_code == 0, r2.output
    assert "8 already finished, 0 to run" in r2.output and len(_points(store)) == 8


def test_finetune_takes_a_config_file_as_its_model(configs, store):
    r = _invoke("registry", "bootstrap")
    assert r.exit_code == 0, r.output
    assert _invoke("registry", "promote", "1").exit_code == 0
    r = _invoke("finetune", "--model", str(configs["opt"]), "--task", "sst2", "--device", "sim", "--steps", "2", "--train-size", "32",
                "--probe-steps", "0", "--no-save-model", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert re.fullmatch(r"opt-tiny-[0-9a-f]{6}/sst2", out["workload"])
    assert out["decision"]["features"]["num_layers"] == 2 and out["decision"]["features"]["model_type"] == "decoder"


def _local_pretrained(folder: Path) -> None:
    """A tiny BERT with its own tokenizer, saved as `save_pretrained` writes a hub checkpoint (offline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    words = ["the", "movie", "was", "good", "bad", "great", "awful", "fine", "plot", "actors", "film", "story"]
    tok.train_from_iterator([" ".join(words)] * 4, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]").save_pretrained(folder)
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    BertForSequenceClassification(config).save_pretrained(folder)


def test_a_local_pretrained_folder_loads_its_weights_and_tokenizer(tmp_path, store):
    folder = tmp_path / "tiny-bert-local"
    _local_pretrained(folder)
    entry = model_entry(str(folder))
    assert entry.pretrained == str(folder.resolve()) and entry.config_path is None and entry.name.startswith("tiny-bert-local-")
    r = _invoke("sweep", "--preset", "smoke", "--models", str(folder), *SMALL)
    assert r.exit_code == 0, r.output
    runs = _points(store)
    assert {x.data.params["model"] for x in runs} == {entry.name} and len(runs) == 2
    assert {x.data.params["model_type"] for x in runs} == {"encoder"}


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "nothing.json", "model config {p} does not exist"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "model folder {p} has no config.json"),
    (lambda d: (d / "x.json").write_text('{"hidden_size": 8}') and d / "x.json", "has no 'model_type'; it is not a transformers config"),
    (lambda d: (d / "y.json").write_text('{"model_type": "no-such-arch"}') and d / "y.json", "cannot read model config"),
    (lambda d: Path("gpt-17"), "unknown model 'gpt-17'; valid models: a preset (bert-tiny"),
    (lambda d: (d / "toy.json").write_text(json.dumps({**LLAMA, "vocab_size": 1000})) and d / "toy.json",
     "has vocab_size 1000; trained from scratch it reads a WordPiece vocabulary of 8000 tokens"),
])
def test_bad_models_are_one_line_before_anything_runs(tmp_path, store, make, message):
    path = make(tmp_path)
    r = _invoke("sweep", "--preset", "smoke", "--models", f"bert-tiny,{path}", *SMALL)
    assert r.exit_code == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message.format(p=path) in lines[0], r.stderr
    assert _points(store) == []  # checked before the first point, bert-tiny's included


def test_precision_trains_with_autocast_is_recorded_and_bf16_costs_less_on_the_twin(store):
    """`--precision bf16|fp16` really trains (autocast; fp16 with a scaler), logs `precision` on every point, is part of
    the sweep's identity (an fp32 sweep keeps its old id) and the twin charges it at tensor-core rates."""
    expected: dict[str, float] = {}
    ids: dict[str, str] = {}
    for precision in ("fp32", "bf16", "fp16"):
        r = _invoke("sweep", "--preset", "smoke", "--models", "bert-mini", *SMALL, "--precision", precision)
        assert r.exit_code == 0, r.output
        ids[precision] = re.search(r"sweep (sweep-[0-9a-f]{10})", r.output).group(1)
        runs = [x for x in _points(store) if x.data.tags["dvfs.sweep_id"] == ids[precision]]
        assert len(runs) == 2 and {x.data.params["precision"] for x in runs} == {precision}
        at_816 = next(x for x in runs if x.data.params["freq_mhz"] == "816")
        assert 0.0 <= at_816.data.metrics["eval_accuracy"] <= 1.0  # trained and evaluated under autocast
        expected[precision] = at_816.data.metrics["energy_expected_j"]
    assert len(set(ids.values())) == 3  # a bf16 sweep never resumes an fp32 one
    assert expected["bf16"] < 0.9 * expected["fp32"] and expected["fp16"] < 0.9 * expected["fp32"]
    from dvfs_mlops.hw.board import board_of
    from dvfs_mlops.hw.sim import SimDevice
    from dvfs_mlops.mlops.sweep import SweepRequest, build_spec

    old = build_spec(board_of(SimDevice()), SweepRequest("smoke", models="bert-mini", tasks="sst2", freqs="816", steps=2, train_size=32, dev_size=16))
    assert old.sweep_id == ids["fp32"] and "precision" not in old.definition()


def test_an_unknown_precision_is_one_line():
    r = _invoke("sweep", "--preset", "smoke", "--precision", "int8", "--device", "sim")
    assert r.exit_code == 2 and "'int8' is not one of 'fp32', 'bf16', 'fp16'" in r.stderr


def test_simulate_takes_the_same_precision_option():
    def energy(*extra: str) -> float:
        r = _invoke("simulate", "bert-mini", "--seq-len", "32", "--json", *extra)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["points"][2]["energy_j"]

    bf16 = energy("--precision", "bf16")
    assert bf16 < 0.9 * energy()  # fp32 by default


def test_twin_fit_rebuilds_a_config_models_bf16_points(configs, store, tmp_path):
    """`twin fit --sweep-id` on a sweep of a config-file model in bf16: its points are rebuilt from the logged
    config path and precision, and the fitted profile reproduces them within the twin's noise."""
    r = _invoke("sweep", "--preset", "smoke", "--models", str(configs["llama"]), "--tasks", "sst2,rte", "--freqs", "510,1020",
                "--steps", "2", "--train-size", "32", "--dev-size", "16", "--device", "sim", "--precision", "bf16")
    assert r.exit_code == 0, r.output
    runs = _points(store)
    assert {x.data.params["model_config"] for x in runs} == {str(configs["llama"].resolve())}
    sweep_id = runs[0].data.tags["dvfs.sweep_id"]
    r = _invoke("twin", "fit", "--sweep-id", sweep_id, "--out", str(tmp_path / "fit.yaml"), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["n_workloads"] == 2 and report["n_points"] == 4
    assert report["errors_expected"]["energy"]["mean_rel"] < 0.05, report["errors_expected"]
