from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from dvfs_mlops.errors import DvfsError, UnknownNameError
from dvfs_mlops.workloads.glue_tsv import read_glue_tsv
from dvfs_mlops.workloads.tasks import TASKS, get_task, hub_rows_to_examples, load_task
from dvfs_mlops.workloads.tokenizer import train_wordpiece, training_texts

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "glue-samples"
# rows per file, from SOURCES.md
SAMPLE_ROWS = {"sst2": ("SST-2", 872), "rte": ("RTE", 139), "wnli": ("WNLI", 70), "mrpc": ("MRPC", 408),
               "stsb": ("STS-B", 132), "qnli": ("QNLI", 63)}


@pytest.mark.parametrize("name", list(TASKS))
def test_synthetic_length_profile_and_format(name):
    task = TASKS[name]
    data = load_task(name, train_size=1024, dev_size=128, seed=3)
    enc = train_wordpiece(training_texts(data.train))
    mean = enc.encode(data.train).mean_length
    assert abs(mean - task.mean_tokens) <= 0.1 * task.mean_tokens, (mean, task.mean_tokens)
    assert all((e.text_b is not None) == task.pair for e in data.train)
    labels = {e.label for e in data.train}
    if task.is_regression:
        assert min(labels) >= 0 and max(labels) <= 5 and len(labels) > 100
    else:
        assert labels == set(map(float, range(task.num_labels)))


def test_synthetic_is_deterministic_by_seed():
    a, b, c = (load_task("mrpc", seed=s, train_size=50, dev_size=10) for s in (1, 1, 2))
    assert a.train == b.train and a.dev == b.dev and a.train != c.train


@pytest.mark.parametrize("task, floor", [("sst2", 0.7), ("mnli", 0.5)])
def test_synthetic_is_learnable(task, floor):
    """A short fine-tune of bert-tiny from random init clearly beats chance (0.5 / 0.33)."""
    from dvfs_mlops.finetune import FinetuneConfig, finetune
    from dvfs_mlops.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", task, train_size=1024, dev_size=256)
    r = finetune(w.model_config, w.train, w.dev, w.encoder.pad_id, FinetuneConfig(steps=60), is_regression=False)
    assert r.eval_value >= floor, r.eval_value


def _data_dir(tmp_path: Path, glue_dir: str, dev_name: str = "dev.tsv") -> Path:
    folder = tmp_path / glue_dir
    folder.mkdir(parents=True)
    shutil.copy(SAMPLES / glue_dir / "dev.tsv", folder / "train.tsv")
    shutil.copy(SAMPLES / glue_dir / "dev.tsv", folder / dev_name)
    return tmp_path


@pytest.mark.parametrize("name", list(SAMPLE_ROWS))
def test_tsv_loader_on_real_glue_samples(tmp_path, name):
    glue_dir, rows = SAMPLE_ROWS[name]
    data = load_task(name, data_dir=_data_dir(tmp_path, glue_dir))
    assert data.source == "tsv" and len(data.train) == rows and len(data.dev) == rows
    task = TASKS[name]
    for e in data.train:
        assert e.text_a and "\ufeff" not in e.text_a and (e.text_b is not None) == task.pair
        assert "\ufeff" not in (e.text_b or "")
        if not task.is_regression:
            assert e.label in range(task.num_labels)


def test_tsv_quirks(tmp_path):
    sst = load_task("sst2", data_dir=_data_dir(tmp_path, "SST-2")).train
    assert sst[0].text_a == "it 's a charming and often affecting journey ." and sst[0].label == 1
    mrpc = read_glue_tsv(SAMPLES / "MRPC/dev.tsv", TASKS["mrpc"])
    assert mrpc[0].text_b.startswith('"The foodservice')  # unbalanced quote kept verbatim
    stsb = read_glue_tsv(SAMPLES / "STS-B/dev.tsv", TASKS["stsb"])  # no header: by position
    assert stsb[0].text_a == "A man is playing the cello." and stsb[0].label == pytest.approx(4.25)
    qnli = read_glue_tsv(SAMPLES / "QNLI/dev.tsv", TASKS["qnli"])
    assert qnli[0].label == 0 and qnli[1].label == 1  # entailment, not_entailment


def test_cola_mnli_qqp_layouts_written_by_test(tmp_path):
    (tmp_path / "CoLA").mkdir()
    cola = "gj04\t1\t\tOur friends won't buy this analysis.\ngj04\t0\t*\tThey drank the pub.\n"
    (tmp_path / "CoLA/train.tsv").write_text(cola)
    (tmp_path / "CoLA/dev.tsv").write_text(cola)
    d = load_task("cola", data_dir=tmp_path)
    assert [e.label for e in d.train] == [1, 0] and d.train[1].text_a == "They drank the pub."
    (tmp_path / "MNLI").mkdir()
    cols = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
            "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
    row = ["0", "1", "1e", "gov", "(", "(", "(", "(", "The cat sat.", "A cat sat.", "entailment", "entailment"]
    text = "\t".join(cols) + "\n" + "\t".join(row) + "\n"
    (tmp_path / "MNLI/train.tsv").write_text(text)
    (tmp_path / "MNLI/dev_matched.tsv").write_text(text.replace("\tentailment\tentailment", "\tneutral\tcontradiction"))
    d = load_task("mnli", data_dir=tmp_path)
    assert d.train[0].label == 0 and d.dev[0].label == 2 and d.train[0].text_b == "A cat sat."
    (tmp_path / "QQP").mkdir()
    qqp = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n1\t2\t3\tHow?\tWhy?\t0\n"
    (tmp_path / "QQP/train.tsv").write_text(qqp)
    (tmp_path / "QQP/dev.tsv").write_text(qqp)
    assert load_task("qqp", data_dir=tmp_path).train[0].text_b == "Why?"


def test_malformed_file_names_file_and_line(tmp_path):
    folder = tmp_path / "RTE"
    folder.mkdir()
    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two\n")
    (folder / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(DvfsError, match=r"RTE/train.tsv:3: expected at least 4"):
        load_task("rte", data_dir=tmp_path)
    (folder / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(DvfsError, match=r"RTE/dev.tsv:2: label 'maybe' is not one of entailment, not_entailment"):
        load_task("rte", data_dir=tmp_path)


def test_missing_task_folder_is_clear(tmp_path):
    with pytest.raises(DvfsError, match="has no SST-2/ folder"):
        load_task("sst2", data_dir=tmp_path)


def test_unknown_task_lists_valid():
    with pytest.raises(UnknownNameError, match="sst2, qnli, mrpc"):
        get_task("squad")


def test_hub_code_path_on_local_files(tmp_path, monkeypatch):
    """The hub loader, with datasets reading local TSVs instead of the network."""
    import datasets

    from dvfs_mlops.workloads import tasks

    rte = tmp_path / "rte.tsv"
    rte.write_text("sentence1\tsentence2\tlabel\nA man runs.\tA person runs.\t0\nIt rains.\tIt is dry.\t1\n")
    calls = []
    real_load = datasets.load_dataset

    def fake_load(path, name=None, **kw):
        calls.append((path, name))
        return real_load("csv", data_files={"train": str(rte), "validation": str(rte)}, delimiter="\t", cache_dir=str(tmp_path / "hf-cache"))

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    d = tasks.load_task("rte", source="hub")
    assert calls == [("nyu-mll/glue", "rte")]
    assert d.source == "hub" and [e.label for e in d.train] == [0, 1] and d.dev[0].text_b == "A person runs."


def test_hub_rows_skip_unlabelled_test_rows():
    rows = [{"sentence": "good", "label": 1}, {"sentence": "hidden", "label": -1}]
    assert [e.text_a for e in hub_rows_to_examples(TASKS["sst2"], rows)] == ["good"]


def test_hub_offline_error_is_clear(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DvfsError, match="offline"):
        load_task("sst2", source="hub")


def test_features_from_config_and_data():
    from dvfs_mlops.workloads.prepare import prepare_workload

    w = prepare_workload("pythia-70m", "mrpc", train_size=200, dev_size=20)
    f = w.features
    assert (f.model_type, f.num_layers, f.hidden_size) == ("decoder", 6, 512)
    assert f.avg_seq_len == pytest.approx(np.mean([len(x) for x in w.train.ids]))
    assert 40e6 < f.num_params < 50e6  # pythia-70m without its LM head
    assert prepare_workload("bert-base", "sst2", train_size=50, dev_size=10).features.model_type == "encoder"


def test_finetune_is_deterministic():
    from dvfs_mlops.finetune import FinetuneConfig, finetune
    from dvfs_mlops.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "stsb", train_size=128, dev_size=64)
    runs = [finetune(w.model_config, w.train, w.dev, w.encoder.pad_id, FinetuneConfig(steps=5, seed=7), is_regression=True)
            for _ in range(2)]
    assert runs[0].eval_value == runs[1].eval_value and runs[0].train_loss == runs[1].train_loss
    assert runs[0].eval_metric == "eval_pearson" and runs[0].padded_lengths == runs[1].padded_lengths
    assert all(n % 8 == 0 for n in runs[0].padded_lengths)
