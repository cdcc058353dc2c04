"""benchmarks.pretrained at toy size: a tiny random BERT as the teacher, a few texts of three newsgroups, and the
scripts (conversion, fine-tuning) run in this process."""

import json
import types

import pytest
import safetensors.torch
import torch
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification, BertModel

from benchmarks import harness, pretrained
from fastformer.cli import convert_bert_to_fastformer
from tests.in_process import run_in_process

LABELS = ("rec.sport.hockey", "sci.space", "talk.religion.misc")
BATCH = {
    "input_ids": torch.tensor([[2, 40, 41, 3], [2, 50, 3, 0]]),
    "attention_mask": torch.tensor([[1] * 4, [1, 1, 1, 0]]),
}


def subset(path, per_label: int, words: int) -> list[dict]:
    """The first `per_label` texts of each of LABELS in `path` with at least `words` words, cut to that many."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [{**row, "text": " ".join(row["text"].split()[:words])} for row in rows if len(row["text"].split()) >= words]
    return [row for label in LABELS for row in [row for row in rows if row["label"] == label][:per_label]]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def toy(repo_root, tokenizer, tmp_path_factory):
    """A tiny BERT teacher (with the bundled tokenizer), its conversion (one layerwise step), and the data files
    that stand for the benchmark's: training splits, test texts, distillation texts, long documents."""
    folder = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=512,
    )
    teacher = BertModel(config, add_pooling_layer=False)
    with torch.no_grad():  # weights larger than BERT's initializer, so that the student has something to learn
        for parameter in teacher.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    teacher.save_pretrained(folder / "teacher")
    tokenizer.save_pretrained(folder / "teacher")
    data = repo_root / "data" / "20newsgroups"
    train = write_jsonl(folder / "train.jsonl", subset(data / "train.jsonl", 10, 40))
    distill = write_jsonl(
        folder / "distill.jsonl", [{"text": row["text"]} for row in subset(data / "train.jsonl", 27, 30)]
    )
    shared = folder / "shared" / "20newsgroups"
    shared.mkdir(parents=True)
    write_jsonl(shared / "test.jsonl", subset(data / "test.jsonl", 3, 120))
    # the toy training split's texts, which the validation texts leave out, and 6 others
    write_jsonl(shared / "train.jsonl", subset(data / "train.jsonl", 10, 40) + subset(data / "test.jsonl", 2, 20))
    flags = f"--max_position_embeddings 512 --distill_file {distill} --max_seq_length 32 --max_steps 1"
    flags += " --end_to_end_steps 0 --per_device_train_batch_size 8 --use_cpu --disable_tqdm true"
    output = ["--model_name_or_path", str(folder / "teacher"), "--output_dir", str(folder / "converted")]
    convert_bert_to_fastformer.main([*output, *flags.split()])
    return {
        "folder": folder,
        "teacher": folder / "teacher",
        "converted": folder / "converted",
        "splits": {"newsgroups": train, "fewshot": write_jsonl(folder / "fewshot.jsonl", subset(train, 3, 40))},
        "test": write_jsonl(folder / "test.jsonl", subset(data / "test.jsonl", 4, 40)),
        "distill": distill,
    }


@pytest.fixture
def benchmark(toy, tmp_path, monkeypatch):
    """benchmark(*flags) runs benchmarks.pretrained on the toy data, its scripts in this process, its records into
    `benchmark.records`; `benchmark.runs` lists the scripts it ran."""
    monkeypatch.setattr(pretrained, "SPLITS", toy["splits"])
    monkeypatch.setattr(pretrained, "TEST", toy["test"])
    monkeypatch.setattr(pretrained, "DISTILL_FILE", toy["distill"])
    monkeypatch.setattr(pretrained, "EPOCHS", {"newsgroups": 1, "fewshot": 1})
    runs = []

    def counted(command, env=None):
        runs.append(command)
        return run_in_process(command, env)

    monkeypatch.setattr(harness, "run", counted)
    folders = ["--output", str(tmp_path / "records"), "--work", str(tmp_path / "work")]
    models = ["--teacher", str(toy["teacher"]), "--converted", str(toy["converted"])]

    def run(*flags):
        pretrained.main([*models, *folders, "--max-seq-length", "32", "--threads", "1", *flags])

    run.runs, run.records = runs, tmp_path / "records"
    return run


def record(folder, part) -> dict:
    """The part's record, checked for the keys every record has and for its CSV beside it."""
    found = json.loads((folder / f"{part}.json").read_text())
    assert {"machine", "settings", "minutes", "rows"} <= set(found) and found["rows"]
    assert found["machine"]["command"] and (folder / f"{part}.csv").exists()
    return found


def test_knn_votes_by_majority_then_similarity():
    index = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]]), dim=-1)
    queries = torch.nn.functional.normalize(torch.tensor([[1.0, 0.05], [0.05, 1.0], [0.6, 0.5]]), dim=-1)
    labels = ["a", "a", "b", "b"]
    assert pretrained.knn_accuracy(index, labels, queries, ["a", "b", "a"], k=2) == 1.0
    assert pretrained.knn_accuracy(index, labels, queries, ["a", "b", "b"], k=4) == pytest.approx(2 / 3)  # 2-2 tie


def test_mixed_texts_join_the_bundled_files_and_draw_shares_of_them(tmp_path):
    whole = pretrained.mixed_texts(tmp_path)
    lines = whole.read_text().splitlines()
    assert len(lines) == len(pretrained.read_jsonl(pretrained.SPLITS["newsgroups"])) + 6924
    for name, share in pretrained.MIXED_SHARES.items():
        drawn = pretrained.mixed_texts(tmp_path, name).read_text().splitlines()
        assert len(drawn) == len(lines) // share and set(drawn) <= set(lines)
    half, quarter = (pretrained.mixed_texts(tmp_path, name).read_text() for name in ("mixed_half", "mixed_quarter"))
    assert half != quarter and pretrained.mixed_texts(tmp_path, "mixed_half").read_text() == half  # read back


def test_more_texts_add_the_shared_posts_that_validation_leaves_out(tmp_path, toy):
    shared = toy["folder"] / "shared"
    validation = pretrained.validation_rows(shared, 2)
    lines = pretrained.more_texts(tmp_path, shared, validation).read_text().splitlines()
    added = [
        json.loads(line)["text"] for line in lines[len(pretrained.mixed_texts(tmp_path).read_text().splitlines()) :]
    ]
    assert len(added) == len(pretrained.validation_rows(shared, 100)) - 2 > 0
    assert not {row["text"] for row in validation} & set(added)


def test_converted_is_needed_but_by_the_parts_that_start_from_the_teacher():
    with pytest.raises(SystemExit):
        pretrained.parse_args(["--teacher", "teacher", "--parts", "memory", "long"])
    assert pretrained.parse_args(["--teacher", "teacher", "--parts", "memory", "levers", "residual"]).converted is None


@pytest.mark.slow
def test_conversion_residual_and_agreement_parts(benchmark, toy):
    benchmark("--parts", "conversion", "residual", "agreement", "--residual-steps", "2")
    copied = json.loads((benchmark.records / "conversion.json").read_text())
    assert copied == json.loads((toy["converted"] / "conversion.json").read_text())
    residual = record(benchmark.records, "residual")["rows"]
    assert [(row["query_residual"], row["layerwise_steps"]) for row in residual] == [
        (True, 0),
        (True, 2),
        (False, 0),
        (False, 2),
    ]
    assert all(len(row["attention"]) == len(row["hidden"]) == 2 for row in residual)
    agreement = record(benchmark.records, "agreement")["rows"]
    assert len(agreement) == 4 and agreement[0]["cosine_to_teacher"] == pytest.approx(1.0)
    assert all(0 <= row["knn_accuracy"] <= 1 for row in agreement)
    assert len(benchmark.runs) == 1  # the layerwise-only conversion


@pytest.mark.slow
def test_finetune_runs_each_model_and_seed_once_and_records_every_stored_run(benchmark, capsys):
    benchmark("--parts", "finetune", "--splits", "newsgroups", "--rows", "teacher", "converted", "--seeds", "0")
    assert len(benchmark.runs) == 2
    # a later command: its converted run is read back, not run again, and the record keeps the teacher's run too
    benchmark("--parts", "finetune", "--splits", "newsgroups", "--rows", "converted", "paper-size", "--seeds", "0")
    assert len(benchmark.runs) == 3
    rows = record(benchmark.records, "finetune")["rows"]
    assert [(row["model"], row["seed"]) for row in rows] == [("teacher", 0), ("converted", 0), ("paper-size", 0)]
    assert all(0 <= row["accuracy"] <= 1 and row["train_seconds"] > 0 for row in rows)
    table = capsys.readouterr().out
    assert all(f"| {model} |" in table for model in ("teacher", "converted", "paper-size"))


def test_levers_part_scores_each_conversion_with_its_fine_tuning(benchmark):
    benchmark("--parts", "levers", "--levers", "no-transfer", "--splits", "newsgroups", "--seeds", "0")
    (row,) = record(benchmark.records, "levers")["rows"]
    assert row["lever"] == "no-transfer" and row["distill_seconds"] == 0 and 0 <= row["knn_accuracy"] <= 1
    assert "--max_steps 0 --end_to_end_steps 0" in row["command"] and len(row["after"]["hidden"]) == 2
    assert [run["seed"] for run in row["newsgroups"]] == [0] and row["fewshot"] == []
    assert len(benchmark.runs) == 2  # the conversion, its fine-tuning


def test_long_and_memory_parts_measure_each_model_at_each_length(benchmark, monkeypatch):
    peaks = []

    def peak_in_process(prepare, *args, mmap_threshold=None):
        prepare(*args)()  # the forward measured in a fresh process, run here
        peaks.append(mmap_threshold)
        return 1.5

    monkeypatch.setattr(harness, "peak_megabytes", peak_in_process)
    benchmark("--parts", "long", "memory", "--lengths", "256", "512")
    long = record(benchmark.records, "long")["rows"]
    assert [(row["model"], row["tokens"]) for row in long] == [
        (name, length) for length in (256, 512) for name in (pretrained.CONVERTED, pretrained.TEACHER)
    ]
    memory = record(benchmark.records, "memory")["rows"]
    assert [(row["tokens"], row["model"], row["chunk"]) for row in memory] == [
        (length, name, chunk)
        for length in (256, 512)
        for name in (pretrained.TEACHER, pretrained.CONVERTED)
        for chunk in pretrained.MEMORY_CHUNKS
    ]
    assert all(row["forward_ms"] > 0 and row["peak_mb"] == 1.5 for row in long + memory)
    assert peaks == [None] * 4 + [pretrained.MMAP_THRESHOLD] * 8


def test_documents_part_reads_the_long_documents_whole_and_cut(benchmark, toy, monkeypatch):
    monkeypatch.setattr(pretrained, "DOCUMENT_ROWS", [("converted", 64, (48, None))])
    monkeypatch.setattr(pretrained, "DOCUMENT_MIN_TOKENS", 40)
    benchmark("--parts", "documents", "--seeds", "0", "--shared-data", str(toy["folder"] / "shared"))
    found = record(benchmark.records, "documents")
    assert [(row["model"], row["train_length"], row["read"]) for row in found["rows"]] == [
        ("converted", 64, 48),
        ("converted", 64, None),
    ]
    assert found["documents"] == 9 and found["max_tokens"] > 40
    assert all(0 <= row["accuracy"] <= 1 and row["ms_per_document"] > 0 for row in found["rows"])
    assert len(benchmark.runs) == 1  # fine-tuned at 64 tokens, above --max-seq-length: a run of its own


def test_classifier_part_converts_the_fine_tuned_teacher_with_its_head(benchmark, toy, monkeypatch):
    monkeypatch.setattr(pretrained, "CLASSIFIER", "--max_position_embeddings 512 --distill_file {}")
    toy_flags = "--max_steps 1 --end_to_end_steps 2 --max_seq_length 32 --per_device_train_batch_size 8 --use_cpu"
    monkeypatch.setattr(pretrained, "CLASSIFIER_LEVERS", {"toy": f"{toy_flags} --disable_tqdm true"})
    monkeypatch.setattr(pretrained, "DOCUMENT_MIN_TOKENS", 40)
    shared = ["--shared-data", str(toy["folder"] / "shared")]
    benchmark("--parts", "classifier", "--classifier-levers", "toy", "--seeds", "0", *shared)
    found = record(benchmark.records, "classifier")
    teacher, converted = found["rows"]
    assert teacher["agreement"] == 1 and 0 <= teacher["long_accuracy_at_512"] <= 1
    assert converted["model"] == "converted (toy)" and 0 <= converted["agreement"] <= 1
    assert converted["accuracy / teacher's"] == converted["accuracy"] / teacher["accuracy"]
    assert converted["distill_minutes"] > 0 and found["long_documents"] == 9
    assert found["validation_texts"] == 6 and teacher["validation_agreement"] == 1  # none of the toy split's
    assert 0 <= converted["validation_agreement"] <= 1 and 0 <= converted["validation_accuracy"] <= 1
    assert 0 <= converted["training_agreement"] <= 1 and "stable_agreement" not in converted  # one teacher
    assert len(benchmark.runs) == 2  # the teacher's fine-tuning, its conversion
    config = json.loads((benchmark.records.parent / "work" / "classifier" / "toy" / "config.json").read_text())
    assert config["architectures"] == ["FastformerForSequenceClassification"] and len(config["id2label"]) == 3
    # the teacher's labels are read back from --work: the test texts' true labels written there score as a perfect
    # teacher, where the toy teacher is not one
    kept_files = (benchmark.records.parent / "work" / "classifier").glob("teacher-labels-*.json")
    # one file per text set: the test and validation texts with the long documents, and the training texts drawn
    (kept,) = [path for path in kept_files if json.loads(path.read_text())[1]]
    (texts, long_texts) = json.loads(kept.read_text())
    test_labels = [row["label"] for row in pretrained.read_jsonl(toy["test"])]
    kept.write_text(json.dumps([test_labels + texts[len(test_labels) :], long_texts]))
    benchmark("--parts", "classifier", "--classifier-levers", "toy", "--seeds", "0", *shared)
    assert record(benchmark.records, "classifier")["rows"][0]["accuracy"] == 1 > found["rows"][0]["accuracy"]
    assert len(benchmark.runs) == 2  # the conversion read back too
    benchmark("--parts", "classifier", "--classifier-levers", "toy", "--seeds", "0", "1", *shared)
    teacher, again, converted = record(benchmark.records, "classifier")["rows"]
    assert again["model"] == "teacher fine-tuned from seed 1" and len(benchmark.runs) == 3
    assert again["agreement"] == again["accuracy"] < 1  # with the first seed's labels, here the true ones
    # where both teachers give the true label (the first seed's, as above)
    found = record(benchmark.records, "classifier")
    assert found["stable_texts"] == round(again["accuracy"] * len(test_labels)) and "stable_agreement" not in teacher
    assert 0 <= converted["stable_agreement"] <= 1 and 0 <= converted["validation_stable_agreement"] <= 1

    monkeypatch.setattr(harness, "peak_megabytes", lambda prepare, *args, **options: prepare(*args)() and 1.5)
    benchmark("--parts", "classifier-speed", "--classifier-levers", "toy", "--seeds", "0", "--lengths", "64", "512")
    speed = record(benchmark.records, "classifier-speed")["rows"]
    names = [(row["model"], row["tokens"]) for row in speed]
    converted = f"{pretrained.CONVERTED} (toy)"
    assert names == [(name, length) for length in (64, 512) for name in (converted, pretrained.TEACHER)]
    assert all(row["forward_ms"] > 0 and row["peak_mb"] == 1.5 for row in speed)
    assert len(benchmark.runs) == 3  # nothing trained again


def test_classifier_part_distils_a_bert_student_of_the_teachers_shape(benchmark, toy, monkeypatch):
    monkeypatch.setattr(pretrained, "BERT_STUDENTS", {"student": (3, 1e-3)})
    monkeypatch.setattr(pretrained, "DOCUMENT_MIN_TOKENS", 40)
    run = ["--parts", "classifier", "--classifier-levers", "student", "--seeds", "0"]
    benchmark(*run, "--shared-data", str(toy["folder"] / "shared"))
    teacher, student = record(benchmark.records, "classifier")["rows"]
    assert student["model"] == "BERT student (student)" and student["flags"] == "steps 3, learning rate 0.001"
    assert 0 <= student["agreement"] <= 1 and 0 <= student["validation_agreement"] <= 1
    assert 0 <= student["training_agreement"] <= 1 and student["distill_minutes"] > 0
    work = benchmark.records.parent / "work"
    folder = work / "classifier" / "student"
    trained = BertForSequenceClassification.from_pretrained(folder)
    fine_tuned = BertForSequenceClassification.from_pretrained(work / "finetune" / "newsgroups" / "teacher" / "seed0")
    assert trained.config.id2label == fine_tuned.config.id2label and len(trained.config.id2label) == 3
    start = BertModel.from_pretrained(toy["teacher"])  # the teacher's start: the layers learnt, the embeddings frozen
    assert torch.equal(trained.bert.embeddings.word_embeddings.weight, start.embeddings.word_embeddings.weight)
    layer, start_layer = trained.bert.encoder.layer[0], start.encoder.layer[0]
    assert not torch.equal(layer.attention.self.query.weight, start_layer.attention.self.query.weight)
    written = (folder / "student.json").stat().st_mtime_ns
    benchmark(*run, "--shared-data", str(toy["folder"] / "shared"))
    assert (folder / "student.json").stat().st_mtime_ns == written  # read back, not distilled again
    # the loss is the conversion's: zero for the teacher itself, positive for the student
    assert pretrained.StudentDistillation(fine_tuned, fine_tuned)(**BATCH)["loss"] == 0
    assert pretrained.StudentDistillation(trained, fine_tuned)(**BATCH)["loss"] > 0


def test_classifier_part_distils_a_hybrid_with_the_teachers_softmax_in_some_layers(benchmark, toy, monkeypatch):
    toy_flags = "--max_steps 1 --max_seq_length 32 --per_device_train_batch_size 8 --use_cpu --disable_tqdm true"
    monkeypatch.setattr(pretrained, "CLASSIFIER", "--max_position_embeddings 512 --distill_file {}")
    monkeypatch.setattr(pretrained, "CLASSIFIER_LEVERS", {"cls4200-bf16": toy_flags})
    monkeypatch.setattr(pretrained, "HYBRIDS", {"hybrid": ((0,), 3, 1e-3)})
    monkeypatch.setattr(pretrained, "DOCUMENT_MIN_TOKENS", 40)
    run = ["--parts", "classifier", "--classifier-levers", "hybrid", "--seeds", "0"]
    benchmark(*run, "--shared-data", str(toy["folder"] / "shared"))
    teacher, hybrid = record(benchmark.records, "classifier")["rows"]
    assert hybrid["model"] == "hybrid (hybrid)" and hybrid["flags"].startswith("softmax attention in layers (0,)")
    assert 0 <= hybrid["agreement"] <= 1 and 0 <= hybrid["validation_agreement"] <= 1 and hybrid["distill_minutes"] > 0
    work = benchmark.records.parent / "work"
    folder = work / "classifier" / "hybrid"
    written = (folder / "student.json").stat().st_mtime_ns
    benchmark(*run, "--shared-data", str(toy["folder"] / "shared"))
    assert (folder / "student.json").stat().st_mtime_ns == written  # read back, not distilled again
    assert record(benchmark.records, "classifier")["rows"][1] == hybrid
    # the distilled weights are the ones read back, and they moved from the layerwise conversion's
    args = types.SimpleNamespace(work=work, max_seq_length=32)
    teacher_folder = work / "finetune" / "newsgroups" / "teacher" / "seed0"
    _, student = pretrained.hybrid_student(args, teacher_folder, folder, (0,), 3, 1e-3)
    saved = safetensors.torch.load_file(folder / "hybrid.safetensors")
    assert all(torch.equal(tensor, saved[name]) for name, tensor in student.state_dict().items())
    fine_tuned = BertForSequenceClassification.from_pretrained(teacher_folder)
    start = pretrained.hybrid_layers(
        AutoModelForSequenceClassification.from_pretrained(folder / "layerwise"), fine_tuned, (0,)
    )
    query = "fastformer.layers.0.attention.self.query.weight"  # the teacher's attention, trained
    assert not torch.equal(saved[query], start.state_dict()[query])
    # with every layer's attention the teacher's, the converted classifier computes the teacher's logits
    converted = AutoModelForSequenceClassification.from_pretrained(folder / "layerwise")
    converted = pretrained.hybrid_layers(converted, fine_tuned, (0, 1))
    expected, found = (model.eval()(**BATCH).logits for model in (fine_tuned, converted))
    torch.testing.assert_close(found, expected)
    assert isinstance(converted.fastformer.layers[1], pretrained.SoftmaxAttentionLayer)
