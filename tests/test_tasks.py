from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dvfs_mlops.errors import DvfsError, UnknownNameError
from dvfs_mlops.job.workloads.glue_tsv import read_glue_tsv
from dvfs_mlops.job.workloads.tasks import TASKS, get_task, hub_rows_to_examples, load_task
from dvfs_mlops.job.workloads.tokenizer import train_wordpiece, training_texts

# Real GLUE dev.tsv copies (SST-2, RTE, WNLI, MRPC, STS-B, QNLI; see their SOURCES.md) are not part of the
# repository: the tests on them run when DVFS_GLUE_SAMPLES names their folder (.ci/run sets it where it can).
_SAMPLES_ENV = os.environ.get("DVFS_GLUE_SAMPLES", "")
SAMPLES = Path(_SAMPLES_ENV) if _SAMPLES_ENV else None
needs_samples = pytest.mark.skipif(
    SAMPLES is None or not SAMPLES.is_dir(),
    reason="real GLUE samples not found: set DVFS_GLUE_SAMPLES to a folder holding SST-2/dev.tsv, RTE/dev.tsv, ... "
           + (f"({_SAMPLES_ENV} is not a folder)" if _SAMPLES_ENV else "(it is unset)")
           + "; the quirk tests on files the tests write run regardless")
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
    from dvfs_mlops.job.finetune import FinetuneConfig, finetune
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", task, train_size=1024, dev_size=256)
    r = finetune(w, FinetuneConfig(steps=60))
    assert r.eval_value >= floor, r.eval_value


def _data_dir(tmp_path: Path, glue_dir: str, dev_name: str = "dev.tsv") -> Path:
    folder = tmp_path / glue_dir
    folder.mkdir(parents=True)
    shutil.copy(SAMPLES / glue_dir / "dev.tsv", folder / "train.tsv")
    shutil.copy(SAMPLES / glue_dir / "dev.tsv", folder / dev_name)
    return tmp_path


@needs_samples
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


@needs_samples
def test_tsv_quirks_of_real_glue_samples(tmp_path):
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


# ---- the GLUE TSV reader on files the tests write: every quirk of real copies ---------------------------

def _write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode(encoding))
    return path


def test_cola_has_no_header_and_four_columns(tmp_path):
    """CoLA: source, label, the original acceptability mark ('*' or empty), sentence; never a header."""
    f = _write(tmp_path / "CoLA/dev.tsv", 'gj04\t1\t\tOur friends won\'t buy this analysis.\n'
                                          'gj04\t0\t*\tThey drank the pub "dry.\n'
                                          'cj99\t1\t\tlabel\n')  # a sentence that looks like a header word
    ex = read_glue_tsv(f, TASKS["cola"])
    assert [e.label for e in ex] == [1, 0, 1] and all(e.text_b is None for e in ex)
    assert ex[0].text_a == "Our friends won't buy this analysis." and ex[1].text_a == 'They drank the pub "dry.'
    assert ex[2].text_a == "label"


def test_mnli_reads_dev_matched_and_its_wider_header(tmp_path):
    """MNLI's dev file is dev_matched.tsv, with label1..label5 before gold_label (train has label1 only)."""
    parse = ["(", "(", "(", "("]
    train_cols = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                  "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
    dev_cols = [*train_cols[:-1], "label2", "label3", "label4", "label5", "gold_label"]
    train = "\t".join(train_cols) + "\n" + "\t".join(["0", "1", "1e", "gov", *parse, "The cat sat.", "A cat sat.", "entailment",
                                                      "entailment"]) + "\n"
    dev = "\t".join(dev_cols) + "\n" + "\t".join(["0", "2", "2n", "fiction", *parse, "It rained.", "It was dry.",
                                                  "contradiction", "neutral", "contradiction", "contradiction", "contradiction",
                                                  "contradiction"]) + "\n"
    _write(tmp_path / "MNLI/train.tsv", train)
    _write(tmp_path / "MNLI/dev.tsv", dev)  # the name other tasks use: not read for MNLI
    with pytest.raises(DvfsError, match=r"MNLI/dev_matched.tsv does not exist"):
        load_task("mnli", data_dir=tmp_path)
    _write(tmp_path / "MNLI/dev_matched.tsv", dev)
    d = load_task("mnli", data_dir=tmp_path)
    assert (d.train[0].text_a, d.train[0].text_b, d.train[0].label) == ("The cat sat.", "A cat sat.", 0)
    assert (d.dev[0].text_a, d.dev[0].text_b, d.dev[0].label) == ("It rained.", "It was dry.", 2)  # gold_label, not label1


def test_quotes_are_text_not_csv_quoting(tmp_path):
    """GLUE TSVs are read with quoting disabled: an opening quote without its closing one swallows nothing."""
    f = _write(tmp_path / "MRPC/dev.tsv", 'Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n'
                                          '1\t1\t2\tHe said "yes.\t"The pie business does not fit.\n'
                                          '0\t3\t4\t""\t"quoted" and "" doubled\n'
                                          '1\t5\t6\tplain\t"\n')
    ex = read_glue_tsv(f, TASKS["mrpc"])
    assert len(ex) == 3 and [e.label for e in ex] == [1, 0, 1]
    assert ex[0].text_a == 'He said "yes.' and ex[0].text_b == '"The pie business does not fit.'
    assert ex[1].text_a == '""' and ex[1].text_b == '"quoted" and "" doubled' and ex[2].text_b == '"'


@pytest.mark.parametrize("task, text", [
    ("sst2", "\ufeffsentence\tlabel\r\ngood film \t1\r\n"),  # BOM before the header, CRLF, GLUE's space before the tab
    ("rte", "\ufeffindex\tsentence1\tsentence2\tlabel\n0\tgood film\tok\tentailment\n"),
    ("cola", "\ufeffgj04\t1\t\tgood film\n"),  # headerless: the BOM sits in the (unused) source column
    ("stsb", "\ufeff4\tmain-captions\tMSRvid\t2012test\t0009\tnone\tnone\tgood film\tok\t1.000\n"),  # headerless STS-B
])
def test_byte_order_mark_at_file_start(tmp_path, task, text):
    f = _write(tmp_path / "f.tsv", text)
    (e,) = read_glue_tsv(f, TASKS[task])
    assert e.text_a == "good film" and "\ufeff" not in e.text_a and "\ufeff" not in (e.text_b or "")


def test_zero_width_no_break_spaces_inside_fields_are_dropped(tmp_path):
    f = _write(tmp_path / "QNLI/dev.tsv", "index\tquestion\tsentence\tlabel\n60\tWhat\ufeff is it?\t\ufeffIt is.\ufeff\tentailment\n")
    (e,) = read_glue_tsv(f, TASKS["qnli"])
    assert (e.text_a, e.text_b, e.label) == ("What is it?", "It is.", 0)


def test_trailing_tabs_and_blank_lines_are_tolerated(tmp_path):
    f = _write(tmp_path / "RTE/dev.tsv", "index\tsentence1\tsentence2\tlabel\t\n\n0\ta\tb\tentailment\t\t\n   \n1\tc\td\tnot_entailment\n\n")
    assert [e.label for e in read_glue_tsv(f, TASKS["rte"])] == [0, 1]


@pytest.mark.parametrize("task, text, message", [
    ("rte", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two\n",
     r"f.tsv:3: expected at least 4 tab-separated fields, found 2"),
    ("cola", "gj04\t1\t\tfine\ngj04\t1\t\tone\ttab too many\n", r"f.tsv:2: expected 4 tab-separated fields as on line 1, found 5"),
    ("sst2", "sentence\tlabel\nit is\tgood\t1\n", r"f.tsv:2: expected 2 tab-separated fields as on line 1, found 3"),
    ("stsb", ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
              "0\tmain\tf\t2012\t1\tnone\tnone\ta\tb\tfour\n"), r"f.tsv:2: score 'four' is not a number"),
    ("stsb", "4\tmain-captions\tMSRvid\t2012test\t0009\tnone\tnone\ta\tb\t\n", r"f.tsv:1: expected at least 10 tab-separated fields, found 9"),
    ("mrpc", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\nyes\t1\t2\ta\tb\n", r"f.tsv:2: label 'yes' is not one of 0, 1"),
    ("cola", "gj04\tx\t\tfine\n", r"f.tsv:1: label 'x' is not one of 0, 1"),
    ("qnli", "index\tquestion\tlabel\n0\ta\tentailment\n", r"f.tsv:1: header has no sentence column"),
    ("sst2", "review\tstars\ngood\t1\n", r"f.tsv:1: header \['review', 'stars'\] has no sentence/text and label columns"),
    ("sst2", "", r"f.tsv is empty"),
])
def test_bad_rows_are_one_line_errors_naming_file_and_line(tmp_path, task, text, message):
    f = _write(tmp_path / "f.tsv", text)
    with pytest.raises(DvfsError, match=message) as e:
        read_glue_tsv(f, TASKS[task])
    assert "\n" not in str(e.value) and str(f) in str(e.value)


def test_non_utf8_file_is_a_clear_error(tmp_path):
    f = _write(tmp_path / "f.tsv", "sentence\tlabel\ncaf\u00e9\t1\n", encoding="latin-1")
    with pytest.raises(DvfsError, match=r"f.tsv is not UTF-8 text \(invalid continuation byte at byte 18\)"):
        read_glue_tsv(f, TASKS["sst2"])


def test_missing_task_folder_is_clear(tmp_path):
    with pytest.raises(DvfsError, match="has no SST-2/ folder"):
        load_task("sst2", data_dir=tmp_path)


def test_unknown_task_lists_valid():
    with pytest.raises(UnknownNameError, match="sst2, qnli, mrpc"):
        get_task("squad")


def test_hub_rows_skip_unlabelled_test_rows():
    rows = [{"sentence": "good", "label": 1}, {"sentence": "hidden", "label": -1}]
    assert [e.text_a for e in hub_rows_to_examples(TASKS["sst2"], rows)] == ["good"]


def test_features_from_config_and_data():
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("pythia-70m", "mrpc", train_size=200, dev_size=20)
    f = w.features
    assert (f.model_type, f.num_layers, f.hidden_size) == ("decoder", 6, 512)
    assert f.avg_seq_len == pytest.approx(np.mean([len(x) for x in w.train.ids]))
    assert 40e6 < f.num_params < 50e6  # pythia-70m without its LM head
    assert prepare_workload("bert-base", "sst2", train_size=50, dev_size=10).features.model_type == "encoder"


def test_finetune_is_deterministic():
    from dvfs_mlops.job.finetune import FinetuneConfig, finetune
    from dvfs_mlops.job.workloads.prepare import prepare_workload

    w = prepare_workload("bert-tiny", "stsb", train_size=128, dev_size=64)
    runs = [finetune(w, FinetuneConfig(steps=5, seed=7))
            for _ in range(2)]
    assert runs[0].eval_value == runs[1].eval_value and runs[0].train_loss == runs[1].train_loss
    assert runs[0].eval_metric == "eval_pearson" and runs[0].padded_lengths == runs[1].padded_lengths
    assert all(n % 8 == 0 for n in runs[0].padded_lengths)
