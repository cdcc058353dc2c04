"""The example scripts end to end, as users run them: their `main()` with a command line (in this process, as
`python scripts/x.py ...` runs it, without a new interpreter's imports), real CLI processes where processes are
the subject (2-process DDP through `accelerate launch`), tiny configs, bundled real data; the flags of
transformers' own example scripts and the data preparation behind them."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import (
    AutoModelForMaskedLM,
    DataCollatorForSeq2Seq,
    PegasusConfig,
    PegasusForConditionalGeneration,
    Seq2SeqTrainingArguments,
)
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput

import headline_rules
from beam_reranking import FEATURES, BeamReranker
from fastformer import FastformerConfig, FastformerForConditionalGeneration, FastformerForMaskedLM
from fastformer.cli import parse_args, warn_emulated_bf16
from headline_decoding import SourceSpanLogitsProcessor
from headline_rules import headline_quality, headline_style, headline_words
from rouge_metric import rouge
from scripts import run_classification, run_mlm, run_summarization
from tests.in_process import run_in_process
from training_utils import ModelArguments, load_model, load_raw_datasets, load_tokenizer

TINY = {
    "fastformer": "hidden_size=32,num_attention_heads=4,intermediate_size=64",
    "bert": "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=64",
    "bart": "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=4,decoder_attention_heads=4,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64",
}
COMMON = ["--report_to", "none", "--use_cpu", "--save_strategy", "no", "--seed", "0", "--disable_tqdm", "true"]


def run(script, *args, launcher=None, check=True):
    """Runs `script` (one of the scripts/ modules imported above) offline with `args`: in this process, or as a
    CLI process started by `launcher` (e.g. the `accelerate_launch` fixture's)."""
    command = [script.__file__, *map(str, args)]
    if launcher is None:
        process = run_in_process([sys.executable, *command])
    else:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        process = subprocess.run([*launcher, *command], capture_output=True, text=True, env=env, timeout=600)
    if check:
        assert process.returncode == 0, f"{script.__name__} failed:\n{process.stdout[-3000:]}\n{process.stderr[-3000:]}"
    return process


def head(source, destination, rows):
    """The first `rows` lines of a bundled jsonl file."""
    lines = Path(source).read_text().splitlines()[:rows]
    destination.write_text("\n".join(lines) + "\n")
    return destination


def results(output_dir, name="eval_results.json"):
    return json.loads((Path(output_dir) / name).read_text())


def assert_hub_ready(output_dir, task, metrics_keys):
    output_dir = Path(output_dir)
    files = {p.name for p in output_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "all_results.json"} <= files
    metrics = results(output_dir)
    assert set(metrics_keys) <= metrics.keys()
    card = ModelCard.load(output_dir / "README.md")
    assert card.data.pipeline_tag == task and card.data.library_name == "transformers"
    reported = {
        result.metric_type if result.metric_name is None else result.metric_name: result.metric_value
        for result in card.data.eval_results
    }
    for key in metrics_keys:
        assert metrics[key] in reported.values(), f"{key}={metrics[key]} not in the model-index {reported}"
    return metrics, card


@pytest.fixture(scope="module")
def newsgroups(tmp_path_factory, repo_root):
    folder = tmp_path_factory.mktemp("newsgroups")
    return (
        head(repo_root / "data/20newsgroups/train.jsonl", folder / "train.jsonl", 48),
        head(repo_root / "data/20newsgroups/test.jsonl", folder / "validation.jsonl", 21),
    )


@pytest.fixture(scope="module")
def headlines(tmp_path_factory, repo_root):
    folder = tmp_path_factory.mktemp("headlines")
    return (
        head(repo_root / "data/news_headlines/train.jsonl", folder / "train.jsonl", 16),
        head(repo_root / "data/news_headlines/validation.jsonl", folder / "validation.jsonl", 6),
    )


def from_scratch(model_type):
    return ["--model_type", model_type, "--config_overrides", TINY[model_type]]


def classify(output_dir, data, *extra, model_type="fastformer"):
    train, validation = data
    return run(
        run_classification,
        "--output_dir",
        output_dir,
        "--do_train",
        "--do_eval",
        "--train_file",
        train,
        "--validation_file",
        validation,
        "--max_seq_length",
        64,
        "--per_device_train_batch_size",
        8,
        "--per_device_eval_batch_size",
        4,
        "--max_steps",
        4,
        "--learning_rate",
        "3e-3",
        *COMMON,
        *extra,
        *([] if "--model_name_or_path" in extra else from_scratch(model_type)),
    )


@pytest.mark.slow
def test_classification_from_scratch_then_from_its_checkpoint(tmp_path, newsgroups):
    classify(tmp_path / "scratch", newsgroups)
    metrics, card = assert_hub_ready(tmp_path / "scratch", "text-classification", ["eval_accuracy", "eval_f1_macro"])
    assert metrics["eval_samples"] == 21 and 0 <= metrics["eval_accuracy"] <= 1
    assert "fastformer" in card.data.tags and "trust_remote_code=True" in card.text
    config = json.loads((tmp_path / "scratch" / "config.json").read_text())
    assert config["model_type"] == "fastformer" and config["hidden_size"] == 32 and len(config["id2label"]) > 5

    classify(tmp_path / "tuned", newsgroups, "--model_name_or_path", tmp_path / "scratch")
    metrics, card = assert_hub_ready(tmp_path / "tuned", "text-classification", ["eval_accuracy", "eval_f1_macro"])
    assert card.data.base_model is None and f"fine-tuned from `{tmp_path / 'scratch'}`" in card.text  # a local folder
    scratch, tuned = (load_file(tmp_path / name / "model.safetensors") for name in ("scratch", "tuned"))
    assert scratch.keys() == tuned.keys() and any(not torch.equal(scratch[k], tuned[k]) for k in scratch)


@pytest.mark.slow
def test_classification_reads_csv_and_the_bert_baseline(tmp_path, newsgroups):
    csv_files = []
    for path in newsgroups:
        csv_path = tmp_path / (path.stem + ".csv")
        datasets.load_dataset("json", data_files=str(path), split="train").to_csv(csv_path)
        csv_files.append(csv_path)
    classify(tmp_path / "bert", csv_files, model_type="bert")
    metrics, card = assert_hub_ready(tmp_path / "bert", "text-classification", ["eval_accuracy", "eval_f1_macro"])
    assert json.loads((tmp_path / "bert" / "config.json").read_text())["model_type"] == "bert"
    assert "fastformer" not in (card.data.tags or []) and "trust_remote_code" not in card.text


def summarize(output_dir, data, *extra, model_type="fastformer"):
    train, validation = data
    return run(
        run_summarization,
        "--output_dir",
        output_dir,
        "--do_train",
        "--do_eval",
        "--predict_with_generate",
        "--train_file",
        train,
        "--validation_file",
        validation,
        "--max_source_length",
        64,
        "--max_target_length",
        12,
        "--per_device_train_batch_size",
        8,
        "--per_device_eval_batch_size",
        4,
        "--max_steps",
        3,
        *COMMON,
        *extra,
        *([] if "--model_name_or_path" in extra else from_scratch(model_type)),
    )


ROUGE = ["eval_rouge1", "eval_rouge2", "eval_rougeL", "eval_rougeLsum"]


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["fastformer", "bart"])
def test_summarization_from_scratch(tmp_path, headlines, model_type):
    summarize(tmp_path / "out", headlines, model_type=model_type)
    metrics, card = assert_hub_ready(tmp_path / "out", "summarization", ROUGE)
    assert metrics["eval_samples"] == 6 and 0 < metrics["eval_gen_len"] <= 12
    assert all(0 <= metrics[key] <= 100 for key in ROUGE)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == model_type
    assert (tmp_path / "out" / "generation_config.json").exists()


@pytest.mark.slow
def test_summarization_with_a_frozen_encoder_reuses_its_cached_states(tmp_path, headlines):
    summarize(tmp_path / "scratch", headlines)
    summarize(
        tmp_path / "frozen",
        headlines,
        "--model_name_or_path",
        tmp_path / "scratch",
        "--freeze_encoder",
        "--cache_encoder_states",
        "--num_train_epochs",
        2,
    )
    assert_hub_ready(tmp_path / "frozen", "summarization", ROUGE)
    scratch, frozen = (load_file(tmp_path / name / "model.safetensors") for name in ("scratch", "frozen"))
    encoder = [name for name in scratch if name.startswith("fastformer.")]
    assert encoder and all(torch.equal(frozen[name], scratch[name]) for name in encoder)
    decoder = "decoder.embeddings.word_embeddings.weight"  # the LM head's too: tied weights are stored once
    assert not torch.equal(frozen[decoder], scratch["fastformer.embeddings.word_embeddings.weight"])
    process = run(
        run_summarization,
        "--output_dir",
        tmp_path / "refused",
        "--train_file",
        headlines[0],
        "--cache_encoder_states",
        *COMMON,
        check=False,
    )
    assert process.returncode == 1 and "--cache_encoder_states needs --freeze_encoder" in process.stderr
    process = run(
        run_summarization,
        "--output_dir",
        tmp_path / "refused",
        "--train_file",
        headlines[0],
        "--model_name_or_path",
        tmp_path / "scratch",
        "--freeze_encoder",
        "--cache_encoder_states",
        "--dataloader_num_workers",
        2,
        *COMMON,
        check=False,
    )
    assert process.returncode == 1 and "use it with --dataloader_num_workers 0" in process.stderr
    process = run(
        run_summarization,
        "--output_dir",
        tmp_path / "refused",
        "--train_file",
        headlines[0],
        "--model_name_or_path",
        tmp_path / "scratch",
        "--freeze_encoder",
        "--cache_encoder_states",
        "--train_encoder_layers",
        1,
        *COMMON,
        check=False,
    )
    assert process.returncode == 1 and "needs the whole encoder frozen" in process.stderr


@pytest.mark.slow
def test_summarization_from_a_checkpoint_keeps_its_pipeline(tmp_path, headlines):
    summarize(tmp_path / "scratch", headlines)
    summarize(tmp_path / "tuned", headlines, "--model_name_or_path", tmp_path / "scratch")
    assert_hub_ready(tmp_path / "tuned", "summarization", ROUGE)
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert "summarization" in config["custom_pipelines"] and (tmp_path / "tuned" / "pipeline_fastformer.py").exists()


@pytest.mark.slow
def test_masked_lm_pretraining_then_classification(tmp_path, newsgroups):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(json.loads(line)["text"] for line in newsgroups[0].read_text().splitlines()) + "\n")
    run(
        run_mlm,
        "--output_dir",
        tmp_path / "mlm",
        "--do_train",
        "--do_eval",
        "--train_file",
        text,
        "--validation_file",
        text,
        "--max_seq_length",
        64,
        "--per_device_train_batch_size",
        8,
        "--max_steps",
        3,
        "--model_type",
        "fastformer",
        "--config_overrides",
        TINY["fastformer"],
        *COMMON,
    )
    metrics, _ = assert_hub_ready(tmp_path / "mlm", "fill-mask", ["eval_loss"])
    assert metrics["perplexity"] == pytest.approx(torch.tensor(metrics["eval_loss"]).exp().item(), rel=1e-5)
    process = classify(tmp_path / "cls", newsgroups, "--model_name_or_path", tmp_path / "mlm")
    assert (tmp_path / "cls" / "eval_results.json").exists()
    assert "classifier.weight" in process.stdout + process.stderr  # reported as newly initialized


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--text_column_names", "body"], "--text_column_names: column(s) ['body'] not in the data"),
        (["--label_column_name", "topic"], "--label_column_name: column(s) ['topic'] not in the data"),
        (["--model_type", "no-such-model"], "unknown --model_type 'no-such-model'"),
        (["--config_overrides", "interaction=dot"], "'interaction' expected one of ('product', 'add', 'concat')"),
        (["--train_file", "EMPTY"], "is empty"),
        (["--train_file", "data.parquet"], "unsupported extension '.parquet'"),
    ],
    ids=["missing-text", "missing-label", "unknown-model-type", "bad-override", "empty-file", "extension"],
)
def test_bad_input_exits_with_a_clear_message(tmp_path, newsgroups, args, message):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = [str(empty) if arg == "EMPTY" else arg for arg in args]
    train, validation = newsgroups
    base = [
        "--output_dir",
        tmp_path / "out",
        "--do_train",
        "--do_eval",
        "--train_file",
        train,
        "--validation_file",
        validation,
        "--max_steps",
        1,
        *COMMON,
    ]
    if "--model_type" not in args:
        base += ["--config_overrides", TINY["fastformer"]] if "--config_overrides" not in args else []
    process = run(run_classification, *base, *args, check=False)
    assert process.returncode != 0
    assert "run_classification.py: error: " in process.stderr and message in process.stderr, process.stderr[-2000:]


@pytest.mark.slow
def test_two_processes_train_like_one_process_with_the_same_global_batch_and_count_each_example_once(
    repo_root, tmp_path, newsgroups, accelerate_launch
):
    """accelerate launch, 2 CPU processes (gloo), as docs/SCALING.md says; 48 training and 21 evaluation texts.
    DDP (2 processes x 4 examples) and 1 process x 8 examples take the same steps: the same 8 examples per step
    (accelerate shards one seeded order), gradients averaged over them. No dropout, so that the random streams
    (which differ per process) play no part. Checkpoints after every step are compared."""
    train, validation = newsgroups
    data = [
        "--train_file",
        train,
        "--validation_file",
        validation,
        "--test_file",
        validation,
        "--max_seq_length",
        64,
        "--per_device_eval_batch_size",
        4,
        *COMMON,
    ]
    training = [
        "--do_train",
        "--num_train_epochs",
        1,
        "--learning_rate",
        "3e-3",
        "--model_type",
        "fastformer",
        "--save_strategy",
        "steps",
        "--save_steps",
        1,
        "--config_overrides",
        TINY["fastformer"] + ",hidden_dropout_prob=0.0",
    ]  # the classifier's too
    run(
        run_classification,
        "--output_dir",
        tmp_path / "ddp",
        "--per_device_train_batch_size",
        4,
        *data,
        *training,
        "--do_eval",
        "--do_predict",
        launcher=accelerate_launch(repo_root / "configs/accelerate/cpu_2proc.yaml"),
    )
    steps = json.loads((tmp_path / "ddp" / "trainer_state.json").read_text())["global_step"]
    assert steps == 48 // (4 * 2)  # each step consumed a batch on each of 2 processes
    assert "| `num_devices` | 2 |" in ModelCard.load(tmp_path / "ddp" / "README.md").text
    run(run_classification, "--output_dir", tmp_path / "single", "--per_device_train_batch_size", 8, *data, *training)
    for step in range(1, steps + 1):
        distributed, single = (
            load_file(tmp_path / name / f"checkpoint-{step}" / "model.safetensors") for name in ("ddp", "single")
        )
        assert distributed.keys() == single.keys()
        for name in single:
            torch.testing.assert_close(distributed[name], single[name], rtol=1e-4, atol=1e-5, msg=f"{step}: {name}")
    first = load_file(tmp_path / "single" / "checkpoint-1" / "model.safetensors")
    assert max((single[name] - first[name]).abs().max().item() for name in single) > 1e-3  # the steps moved them
    # (train_loss is not compared: with 2 processes the Trainer reports the main process's own mean)

    # the DDP checkpoint evaluated by one process: the same 21 predictions in the same order and the same metrics,
    # so the 2-process gather (21 = 2 x 10 + 1 rows) dropped its padding duplicates
    run(
        run_classification,
        "--output_dir",
        tmp_path / "one",
        "--model_name_or_path",
        tmp_path / "ddp",
        *data,
        "--do_eval",
        "--do_predict",
    )
    predictions = [(tmp_path / name / "predictions.jsonl").read_text().splitlines() for name in ("ddp", "one")]
    assert len(predictions[0]) == 21 and predictions[0] == predictions[1]
    distributed, one = results(tmp_path / "ddp"), results(tmp_path / "one")
    assert distributed["eval_samples"] == one["eval_samples"] == 21
    assert distributed["eval_accuracy"] == one["eval_accuracy"]
    assert distributed["eval_f1_macro"] == pytest.approx(one["eval_f1_macro"], abs=1e-12)
    # (eval_loss is transformers' mean of per-batch losses: it depends on how batches fall, so it is not compared)


@pytest.mark.slow
def test_dataset_name_loads_like_a_hub_data_set(tmp_path, newsgroups):
    """--dataset_name goes through datasets.load_dataset as for a Hub id; a local folder of split files is the
    offline stand-in (datasets infers the splits from the file names)."""
    folder = tmp_path / "newsgroups_dataset"
    folder.mkdir()
    for path in newsgroups:
        (folder / path.name).write_text(path.read_text())
    run(
        run_classification,
        "--output_dir",
        tmp_path / "out",
        "--do_train",
        "--do_eval",
        "--dataset_name",
        folder,
        "--max_seq_length",
        64,
        "--per_device_train_batch_size",
        8,
        "--max_steps",
        2,
        *from_scratch("fastformer"),
        *COMMON,
    )
    metrics = results(tmp_path / "out")
    assert metrics["eval_samples"] == 21
    assert ModelCard.load(tmp_path / "out" / "README.md").data.datasets == [str(folder)]


# --- the flags of transformers' own example scripts ---------------------------------------------------------------

# Every flag of the ModelArguments and DataTrainingArguments of transformers' examples/pytorch/
# text-classification/run_classification.py, summarization/run_summarization.py and language-modeling/run_mlm.py
# as of transformers v4.57.3 (check_min_version("4.57.0.dev0")), the newest version of these files that could be
# read (pip's transformers 5 does not ship its examples): from GitHub feisenyu/transformers_4573 at 1b9542ec, a
# copy of the v4.57.3 tree, and run_classification.py also from huggingface/transformers at 005c23ae (the same
# flags). A bool field whose default is True also has its --no_ flag. Each flag with an example value.
TRANSFORMERS_MODEL_FLAGS = [
    "--model_name_or_path=some/model",
    "--config_name=some/config",
    "--tokenizer_name=some/tokenizer",
    "--cache_dir=cache",
    "--use_fast_tokenizer",
    "--no_use_fast_tokenizer",
    "--model_revision=v1",
    "--token=hf_abc",
    "--trust_remote_code",
]
TRANSFORMERS_FLAGS = {
    "run_classification": [
        *TRANSFORMERS_MODEL_FLAGS,
        "--ignore_mismatched_sizes",
        "--dataset_name=glue",
        "--dataset_config_name=stsb",
        "--do_regression",
        "--text_column_names=s1,s2",
        "--text_column_delimiter=;",
        "--train_split_name=training",
        "--validation_split_name=dev",
        "--test_split_name=held_out",
        "--remove_splits=unsupervised",
        "--remove_columns=idx",
        "--label_column_name=y",
        "--max_seq_length=128",
        "--preprocessing_num_workers=2",
        "--overwrite_cache",
        "--pad_to_max_length",
        "--no_pad_to_max_length",
        "--shuffle_train_dataset",
        "--shuffle_seed=7",
        "--max_train_samples=10",
        "--max_eval_samples=5",
        "--max_predict_samples=3",
        "--metric_name=matthews_correlation",
        "--train_file=train.csv",
        "--validation_file=validation.csv",
        "--test_file=test.csv",
    ],
    "run_summarization": [
        *TRANSFORMERS_MODEL_FLAGS,
        "--resize_position_embeddings=True",  # an Optional[bool] there too: HfArgumentParser wants its value
        "--lang=en_XX",
        "--dataset_name=xsum",
        "--dataset_config_name=default",
        "--text_column=article",
        "--summary_column=highlights",
        "--train_file=train.json",
        "--validation_file=validation.json",
        "--test_file=test.json",
        "--overwrite_cache",
        "--preprocessing_num_workers=2",
        "--max_source_length=256",
        "--max_target_length=32",
        "--val_max_target_length=48",
        "--pad_to_max_length",
        "--max_train_samples=10",
        "--max_eval_samples=5",
        "--max_predict_samples=3",
        "--num_beams=2",
        "--ignore_pad_token_for_loss",
        "--no_ignore_pad_token_for_loss",
        "--source_prefix=summarize: ",
        "--forced_bos_token=en_XX",
    ],
    "run_mlm": [
        *TRANSFORMERS_MODEL_FLAGS,
        "--model_type=bert",
        "--config_overrides=num_hidden_layers=2",
        "--dtype=bfloat16",
        "--dataset_name=wikitext",
        "--dataset_config_name=wikitext-2-raw-v1",
        "--train_file=train.txt",
        "--validation_file=validation.txt",
        "--overwrite_cache",
        "--validation_split_percentage=10",
        "--max_seq_length=128",
        "--preprocessing_num_workers=2",
        "--mlm_probability=0.2",
        "--line_by_line",
        "--pad_to_max_length",
        "--max_train_samples=10",
        "--max_eval_samples=5",
        "--streaming",
    ],
}
# the flags that cannot apply; docs/TRAINING.md says why, in its "Flags of the transformers examples"
FAST_TOKENIZER_FLAGS = {"--use_fast_tokenizer", "--no_use_fast_tokenizer"}
NOT_APPLICABLE = {
    "run_classification": FAST_TOKENIZER_FLAGS,
    "run_summarization": FAST_TOKENIZER_FLAGS | {"--lang"},
    "run_mlm": FAST_TOKENIZER_FLAGS,
}
SCRIPT_MODULES = {"run_classification": run_classification, "run_summarization": run_summarization, "run_mlm": run_mlm}


def flag_name(flag: str) -> str:
    return flag.partition("=")[0]


@pytest.mark.parametrize("script", TRANSFORMERS_FLAGS)
def test_the_flags_of_the_transformers_example_parse_into_their_fields(script):
    """Each applicable flag alone: it parses (unknown flags are an error) and lands in the field of its name."""
    arguments = SCRIPT_MODULES[script].ARGUMENTS
    for flag in TRANSFORMERS_FLAGS[script]:
        name, has_value, value = flag.removeprefix("--").partition("=")
        if flag_name(flag) in NOT_APPLICABLE[script]:
            with pytest.raises(ValueError, match="not used by the HfArgumentParser"):
                parse_args(arguments, [flag, "--report_to", "none"])
            continue
        field = name.removeprefix("no_")  # a --no_ flag sets its field to False
        parsed = [
            getattr(args, field)
            for args in parse_args(arguments, [flag, "--report_to", "none"])
            if hasattr(args, field)
        ]
        expected = value if has_value else not name.startswith("no_")
        assert len(parsed) == 1 and (str(parsed[0]) if has_value else parsed[0]) == expected, (flag, parsed)


def test_the_docs_name_each_flag_that_does_not_apply(repo_root):
    training = (repo_root / "docs" / "TRAINING.md").read_text()
    section = training.split("## Flags of the transformers examples\n", 1)[1].split("\n## ", 1)[0]
    for script, flags in NOT_APPLICABLE.items():
        assert set(flags) <= {flag_name(flag) for flag in TRANSFORMERS_FLAGS[script]}
        for flag in flags:
            assert f"`{flag}`" in section, f"docs/TRAINING.md does not say why {flag} ({script}) does not apply"


# --- what those flags do ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ignore_pad_token_for_loss", [True, False], ids=["label-pad--100", "label-pad-pad-token"])
def test_summarization_tokenize_prefixes_pads_and_cuts_to_the_target_length(tokenizer, ignore_pad_token_for_loss):
    flags = ["--pad_to_max_length", "--max_source_length=16", "--source_prefix=summarize: ", "--report_to=none"]
    flags.append(f"--ignore_pad_token_for_loss={ignore_pad_token_for_loss}")
    _, data_args, _ = parse_args(run_summarization.ARGUMENTS, flags)
    batch = {"document": ["a short text", "another text"], "summary": ["short", "one two three four five six seven"]}
    encoded = run_summarization.tokenize(
        batch,
        tokenizer=tokenizer,
        data_args=data_args,
        text_column="document",
        summary_column="summary",
        eos_token_id=tokenizer.sep_token_id,
        max_target_length=6,
    )
    assert [len(ids) for ids in encoded["input_ids"]] == [16, 16]
    assert tokenizer.decode(encoded["input_ids"][0], skip_special_tokens=True) == "summarize : a short text"
    pad = -100 if ignore_pad_token_for_loss else tokenizer.pad_token_id
    short, long = tokenizer(batch["summary"], add_special_tokens=False)["input_ids"]
    assert encoded["labels"] == [short + [tokenizer.sep_token_id] + [pad] * 4, long[:5] + [tokenizer.sep_token_id]]


def test_summarization_resizes_the_positions_where_the_model_can_and_refuses_where_not(caplog):
    """--resize_position_embeddings as in transformers' example: a source longer than the encoder's positions resizes
    them (by default with a warning, True without), False refuses; a model that cannot resize them (Fastformer) is
    refused, naming the flag; a source within the positions changes nothing."""
    pegasus = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32)
    pegasus |= dict(encoder_attention_heads=2, decoder_attention_heads=2, vocab_size=64, max_position_embeddings=32)
    for resize, warned in ((None, True), (True, False)):
        model = PegasusForConditionalGeneration(PegasusConfig(**pegasus))
        caplog.clear()
        run_summarization.fit_source_positions(model, 48, resize)
        assert model.config.max_position_embeddings == 48
        assert model.get_encoder().embed_positions.weight.shape[0] == 48
        assert ("from 32 to 48" in caplog.text) == warned
    with pytest.raises(SystemExit, match="48 positions .*, and --resize_position_embeddings is False"):
        run_summarization.fit_source_positions(model, 64, False)
    fastformer = FastformerForConditionalGeneration(
        FastformerConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
    )
    with pytest.raises(SystemExit, match="which FastformerForConditionalGeneration cannot resize"):
        run_summarization.fit_source_positions(fastformer, 48, None)
    run_summarization.fit_source_positions(fastformer, 32, False)  # within its positions: nothing to do
    assert fastformer.config.max_position_embeddings == 32


def test_summarization_forced_bos_token_is_a_token_of_the_tokenizer(tokenizer):
    assert run_summarization.token_id(tokenizer, "news", "--forced_bos_token") == tokenizer.convert_tokens_to_ids(
        "news"
    )
    assert run_summarization.token_id(tokenizer, None, "--forced_bos_token") is None
    with pytest.raises(SystemExit, match="--forced_bos_token 'en_XX': not a token of the tokenizer"):
        run_summarization.token_id(tokenizer, "en_XX", "--forced_bos_token")


def test_mlm_holds_out_the_first_percent_of_the_training_texts():
    raw = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": [str(i) for i in range(40)]})})
    raw = run_mlm.split_off_validation(raw, 10)
    assert raw["validation"]["text"] == ["0", "1", "2", "3"] and raw["train"]["text"] == [str(i) for i in range(4, 40)]


def test_classification_arranges_the_splits_as_the_transformers_example():
    def split(name, rows):
        return datasets.Dataset.from_dict({"text": [f"{name} {i}" for i in range(rows)], "idx": list(range(rows))})

    raw = datasets.DatasetDict({"training": split("training", 20), "dev": split("dev", 4), "extra": split("extra", 2)})
    flags = [
        "--train_split_name=training",
        "--validation_split_name=dev",
        "--remove_splits=extra",
        "--remove_columns=idx",
        "--shuffle_train_dataset",
        "--shuffle_seed=3",
        "--report_to=none",
    ]
    _, data_args, _ = parse_args(run_classification.ARGUMENTS, flags)
    arranged = run_classification.arrange_splits(raw, data_args)
    assert set(arranged) == {"train", "validation"} and arranged["validation"]["text"] == raw["dev"]["text"]
    assert arranged["train"].column_names == ["text"]
    shuffled = raw["training"].shuffle(seed=3)["text"]
    assert arranged["train"]["text"] == shuffled != raw["training"]["text"]


def test_dtype_creates_and_loads_the_weights_in_that_dtype(tmp_path):
    def config():  # a fresh one each time: creating a model in a dtype sets the config's
        return FastformerConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
        )

    FastformerForMaskedLM(config()).save_pretrained(tmp_path)
    for model_name_or_path in (None, str(tmp_path)):
        for dtype, expected in [(None, torch.float32), ("auto", torch.float32), ("bfloat16", torch.bfloat16)]:
            model_args = ModelArguments(model_name_or_path=model_name_or_path, dtype=dtype)
            model = load_model(AutoModelForMaskedLM, model_args, config())
            assert model.dtype == expected, (model_name_or_path, dtype)


@pytest.mark.parametrize("script", [run_summarization, run_classification])
def test_evaluation_and_prediction_read_a_split_in_its_order(tmp_path, tokenizer, tokenizer_fields, script):
    """A predictions file (generated_predictions.txt, predictions.jsonl) lines up with the test file: evaluation and
    prediction read a split in its order even where the training batches are grouped by length (transformers'
    Trainer groups evaluation batches too)."""
    config = FastformerConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, **tokenizer_fields)
    model = FastformerForConditionalGeneration(config)
    lengths = list(range(3, 11))  # grouping by length would read the longest first
    rows = [[tokenizer.cls_token_id, *[1000] * (length - 2), tokenizer.sep_token_id] for length in lengths]
    dataset = datasets.Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(row) for row in rows]})
    dataset = dataset.add_column("labels", [[tokenizer.cls_token_id, tokenizer.sep_token_id]] * len(rows))
    args = Seq2SeqTrainingArguments(
        tmp_path,
        train_sampling_strategy="group_by_length",
        per_device_eval_batch_size=3,
        use_cpu=True,
        report_to="none",
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    trainer_class = getattr(script, "SummarizationTrainer", None) or script.ClassificationTrainer
    trainer = trainer_class(model=model, args=args, processing_class=tokenizer, data_collator=collator)
    for loader in (trainer.get_eval_dataloader(dataset), trainer.get_test_dataloader(dataset)):
        assert [int(mask.sum()) for batch in loader for mask in batch["attention_mask"]] == lengths


@pytest.mark.slow
def test_summarization_num_beams_and_the_length_sample_and_prefix_flags(tmp_path, headlines, monkeypatch):
    """--num_beams reaches generate in evaluation and prediction (Seq2SeqTrainer reads it from the saved
    generation_num_beams), as --val_max_target_length does generate's max_length, and --no_repeat_content_words,
    --whole_words and --source_span_bonus their logits processors (the last given each batch's articles, without
    which it refuses to run), with --copied_punctuation and --stay_on_span, which need it; --headline_style
    post-edits the generated summaries, written and scored apart from the model's own."""
    validation = headlines[1]
    # headline style marked with the first reference, to see which texts the script edits and scores so
    references = [json.loads(line)["summary"] for line in validation.read_text().splitlines()[:2]]
    styled, marker = headline_rules.headline_style, f"{references[0]} | "
    monkeypatch.setattr(headline_rules, "headline_style", lambda text: marker + styled(text))
    summarize(
        tmp_path / "out",
        headlines,
        "--num_beams",
        2,
        "--val_max_target_length",
        10,
        "--pad_to_max_length",
        "--source_prefix",
        "summarize: ",
        "--max_train_samples",
        8,
        "--do_predict",
        "--test_file",
        validation,
        "--max_predict_samples",
        2,
        "--no_repeat_content_words",
        "--whole_words",
        "--source_span_bonus",
        1.0,
        "--copied_punctuation",
        "--stay_on_span",
        "--headline_style",
    )
    args = torch.load(tmp_path / "out" / "training_args.bin", weights_only=False)
    assert args.generation_num_beams == 2 and args.generation_max_length == 10
    assert results(tmp_path / "out", "train_results.json")["train_samples"] == 8
    metrics = results(tmp_path / "out")
    assert metrics["eval_samples"] == 6 and 0 < metrics["eval_gen_len"] <= 10 and "eval_rouge1" in metrics
    predictions = (tmp_path / "out" / "generated_predictions.txt").read_text().splitlines()
    edited = (tmp_path / "out" / "edited_predictions.txt").read_text().splitlines()
    # --headline_style: the generated summaries, not the references, post-edited; the model's own written and scored
    # as generated, the edited ones apart
    assert edited == [marker + styled(text) for text in predictions]
    scored = results(tmp_path / "out", "predict_results.json")
    assert scored["predict_rougeL"] == pytest.approx(rouge(predictions, references)["rougeL"])
    assert scored["predict_edited_rougeL"] == pytest.approx(rouge(edited, references)["rougeL"])
    assert scored["predict_edited_rougeL"] > 0 and scored["predict_edited_rougeL"] != scored["predict_rougeL"]
    assert metrics["eval_edited_rougeL"] != metrics["eval_rougeL"]
    # --no_repeat_content_words reaches generate in evaluation and prediction
    assert len(predictions) == 2 and metrics["eval_repeated"] == 0 and headline_quality(predictions)["repeated"] == 0
    # --whole_words: every generated word is a word of the training split or of the articles (a random model's pieces
    # would splice into non-words)
    rows = [json.loads(line) for path in headlines for line in path.read_text().splitlines()]
    words = {word for row in rows for word in headline_words(row["document"] + " " + row["summary"])}
    assert all(set(headline_words(text)) <= words for text in predictions)
    # --copied_punctuation: no punctuation first (a random model's first token could be any)
    assert not any(text and not text[0].isalnum() for text in predictions)


@pytest.mark.slow
def test_summarization_rerank_beams_fits_on_validation_and_writes_the_chosen_beams(tmp_path, headlines):
    """--rerank_beams: every beam of each article is kept; the reranker is fit on the validation split's beams after
    evaluation (its 5-fold estimate logged), saved beside the model and applied to the test split, whose chosen beams
    are the post-edit, written and scored apart from the model's own top beams; a later --do_predict reads the saved
    reranker, and without one, or with one beam, the script refuses. --forced_bos_token: every beam starts with it."""
    validation = headlines[1]
    references = [json.loads(line)["summary"] for line in validation.read_text().splitlines()[:3]]
    common = ["--num_beams", 3, "--source_span_bonus", 1.0, "--headline_style", "--rerank_beams"]
    common += ["--forced_bos_token", "the"]
    test = ["--do_predict", "--test_file", validation, "--max_predict_samples", 3]
    summarize(tmp_path / "out", headlines, *common, *test)
    out = tmp_path / "out"
    metrics = results(out)
    assert metrics["eval_samples"] == 6 and 0 <= metrics["eval_reranked_changed"] <= 6
    assert all(0 <= metrics[f"eval_reranked_{name}"] <= 100 for name in ("rouge1", "rouge2", "rougeL"))
    weights = json.loads((out / "beam_reranker.json").read_text())["weights"]
    assert set(weights) == {"bias", *FEATURES}
    beams = [json.loads(line) for line in (out / "predict_beams.jsonl").read_text().splitlines()]
    assert [len(article["texts"]) for article in beams] == [3, 3, 3]
    assert all(
        len(article["scores"]) == 3 and article["scores"] == sorted(article["scores"])[::-1] for article in beams
    )
    generated = (out / "generated_predictions.txt").read_text().splitlines()
    edited = (out / "edited_predictions.txt").read_text().splitlines()
    assert [headline_style(text) for text in generated] == [article["texts"][0] for article in beams]  # top beams
    assert all(text.split()[0] == "the" for text in generated)
    assert edited == [article["texts"][article["choice"]] for article in beams]
    assert all(article["choice"] == 0 or article["allowed"][article["choice"]] for article in beams)
    scored = results(out, "predict_results.json")
    assert scored["predict_rougeL"] == pytest.approx(rouge(generated, references)["rougeL"])
    assert scored["predict_edited_rougeL"] == pytest.approx(rouge(edited, references)["rougeL"])
    assert scored["predict_reranked_changed"] == sum(article["choice"] != 0 for article in beams)
    assert len((out / "eval_beams.jsonl").read_text().splitlines()) == 6
    # the saved reranker chooses again without the validation split
    summarize_saved = ["--model_name_or_path", out, *COMMON, *common, *test, "--max_source_length", 64]
    summarize_saved += ["--max_target_length", 12]
    run(run_summarization, "--output_dir", tmp_path / "again", "--predict_with_generate", *summarize_saved)
    again = (tmp_path / "again" / "edited_predictions.txt").read_text().splitlines()
    assert again == edited
    (out / "beam_reranker.json").unlink()
    refused = ["--output_dir", tmp_path / "refused", "--predict_with_generate", *summarize_saved]
    process = run(run_summarization, *refused, check=False)
    assert process.returncode == 1 and "beam_reranker.json from" in process.stderr and "there is none" in process.stderr
    process = run(run_summarization, *refused, "--num_beams", 1, check=False)
    assert process.returncode == 1 and "--rerank_beams chooses among beams" in process.stderr


def test_beam_choice_returns_the_top_beam_and_keeps_every_beam_with_the_rerankers_choice(tokenizer):
    """--rerank_beams' generate(): all beams asked for with their scores, grouped per article (best first), the top
    beam returned (the model's own output), each article's beams kept with its reference (none without labels) and
    the reranker's choice among the beams copied up to a clause's end (the top beam while there is no reranker)."""
    articles = ["floods hit the coast, killing two. prices rose", "prices rose 4.5 percent; floods hit the town."]
    encoded = tokenizer(articles, padding=True, return_tensors="pt")
    span = SourceSpanLogitsProcessor(tokenizer, 1.0, eos_token_id=tokenizer.sep_token_id)
    span.set_source(encoded["input_ids"], encoded["attention_mask"])
    beams = [["floods hit the coast", "floods hit", "killing two"], ["prices rose", "floods hit the town", "floods"]]
    rows = [
        [tokenizer.cls_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]
        for texts in beams
        for text in texts
    ]
    width = max(map(len, rows))
    sequences = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    scores = torch.tensor([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6])
    asked = {}

    def generate(**named):
        asked.update(named)
        return GenerateBeamEncoderDecoderOutput(sequences=sequences, sequences_scores=scores)

    labels = tokenizer(["floods kill two", "prices rise"], padding=True, return_tensors="pt")["input_ids"]
    choice = run_summarization.BeamChoice(tokenizer, False, span)
    top = choice.generate(generate, 3, input_ids=encoded["input_ids"], labels=labels)
    assert asked["num_return_sequences"] == 3 and asked["return_dict_in_generate"] and asked["output_scores"]
    assert torch.equal(top, sequences[[0, 3]])
    kept = choice.take()
    assert [article["texts"] for article in kept] == beams and choice.take() == []
    assert [article["allowed"] for article in kept] == [[True, False, True], [False, True, False]]
    assert [article["scores"] for article in kept] == [
        pytest.approx([-0.1, -0.2, -0.3]),
        pytest.approx([-0.4, -0.5, -0.6]),
    ]
    assert [article["reference"] for article in kept] == ["floods kill two", "prices rise"]
    assert [article["choice"] for article in kept] == [0, 0]
    # a reranker that prefers later beams: the last allowed one, the top beam where no other is allowed
    choice.reranker = BeamReranker({"bias": 0.0, **dict.fromkeys(FEATURES, 0.0), "rank": 1.0})
    returned = choice.generate(generate, 3, input_ids=encoded["input_ids"])
    assert torch.equal(returned, sequences[[0, 3]])
    assert [article["choice"] for article in choice.articles] == [2, 1]
    assert all(article["reference"] is None for article in choice.take())


def test_summarization_post_edits_are_the_rerankers_choice_or_headline_style_and_none_without_either():
    """What edited_predictions.txt and *_edited_* hold: the reranker's choice where the evaluation kept the beams
    (their texts already in headline style with --headline_style), else the summaries in headline style, else
    nothing (no edit)."""
    predictions = ["the man was killed", "a flood hit the town"]
    plain = run_summarization.DataTrainingArguments()
    styled = run_summarization.DataTrainingArguments(headline_style=True)
    assert run_summarization.edited_texts(predictions, plain, None) is None
    assert run_summarization.edited_texts(predictions, styled, None) == ["man killed", "flood hit town"]
    choice = run_summarization.BeamChoice(None, True, None)
    choice.articles = [{"texts": ["man killed", "man"], "choice": 1}, {"texts": ["flood hit town"], "choice": 0}]
    assert run_summarization.edited_texts(predictions, styled, choice) == ["man", "flood hit town"]
    choice.articles = []  # the evaluations during training keep no beams: the style alone
    assert run_summarization.edited_texts(predictions, styled, choice) == ["man killed", "flood hit town"]
    assert run_summarization.edited_texts(predictions, plain, choice) is None


@pytest.mark.slow
def test_summarization_rerank_beams_refuses_what_it_cannot_do(tmp_path, headlines):
    """--rerank_beams needs generated beams, a validation split to fit on after training, and, applied from a saved
    reranker, the decoding it was fit under."""
    common = ["--num_beams", 2, "--source_span_bonus", 1.0, "--rerank_beams", "--max_steps", 1, *COMMON]
    data = ["--train_file", headlines[0], "--validation_file", headlines[1], "--test_file", headlines[1]]
    for flags, said in (
        (["--do_eval"], "give --predict_with_generate"),
        (["--do_train", "--do_predict", "--predict_with_generate"], "give --do_eval"),
        (["--do_predict", "--predict_with_generate"], "give it"),
    ):
        process = run(run_summarization, "--output_dir", tmp_path / "refused", *common, *data, *flags, check=False)
        assert process.returncode == 1 and said in process.stderr, process.stderr[-2000:]
    folder = tmp_path / "saved"
    folder.mkdir()
    BeamReranker({"bias": 0.0, **dict.fromkeys(FEATURES, 0.0)}, {"num_beams": 4}).save(folder / "beam_reranker.json")
    tokenizer_and_model = ["--model_name_or_path", tmp_path / "model"]
    summarize(tmp_path / "model", headlines)
    (tmp_path / "model" / "beam_reranker.json").write_text((folder / "beam_reranker.json").read_text())
    flags = [*tokenizer_and_model, "--do_predict", "--predict_with_generate"]
    process = run(run_summarization, "--output_dir", tmp_path / "refused", *common, *data, *flags, check=False)
    assert process.returncode == 1 and "fit on beams decoded with num_beams 4 (now 2)" in process.stderr


def test_summarization_copied_punctuation_and_stay_on_span_reach_the_span_processor_and_need_its_bonus(tokenizer):
    """--copied_punctuation and --stay_on_span build the span processor with its ban and its constraint; without
    --source_span_bonus each is refused when the arguments are read."""
    arguments = run_summarization.DataTrainingArguments(source_span_bonus=1.0, copied_punctuation=True)
    (processor,) = run_summarization.logits_processors(tokenizer, arguments, {}, "document", "summary", 102)
    assert processor.copied_punctuation and len(processor.punctuation) > 30 and processor.bonus == 1.0
    assert not processor.stay_on_span
    arguments = run_summarization.DataTrainingArguments(source_span_bonus=1.0, stay_on_span=True)
    (processor,) = run_summarization.logits_processors(tokenizer, arguments, {}, "document", "summary", 102)
    assert processor.stay_on_span and not processor.copied_punctuation
    for flag in ("copied_punctuation", "stay_on_span", "rerank_beams"):
        with pytest.raises(ValueError, match=f"--{flag} reads the article's runs: give --source_span_bonus"):
            run_summarization.DataTrainingArguments(**{flag: True})
    # the span processor comes last, after every other processor that bans tokens: it reads what they banned
    flags = dict(no_repeat_content_words=True, end_on_content_words=True, whole_words=True, source_span_bonus=1.0)
    arguments = run_summarization.DataTrainingArguments(**flags, stay_on_span=True)
    raw = {"train": {"document": ["Floods hit the coast."], "summary": ["Floods hit coast"]}}
    processors = run_summarization.logits_processors(tokenizer, arguments, raw, "document", "summary", 102)
    assert len(processors) == 4 and isinstance(processors[-1], SourceSpanLogitsProcessor)


def test_summarization_texts_read_padding_and_write_headline_style_with_its_flag(tokenizer):
    """The script's decoded texts: -100 (the labels' padding) read as padding, "russia ' s" joined as written, and in
    headline style where --headline_style asks for it (the generated summaries only)."""
    ids = tokenizer(["The man was killed in Russia's capital", "A flood"], padding="max_length", max_length=12)
    ids = np.array(ids["input_ids"])
    ids[ids == tokenizer.pad_token_id] = -100
    assert run_summarization.decoded_texts(tokenizer, ids) == ["the man was killed in russia's capital", "a flood"]
    assert run_summarization.decoded_texts(tokenizer, ids, styled=True) == ["man killed in russia's capital", "flood"]
    assert not run_summarization.DataTrainingArguments().headline_style


@pytest.mark.slow
def test_mlm_streams_line_by_line(tmp_path, newsgroups):
    """--streaming reads a (Hub-like) data set as the Trainer uses it; --max_steps then bounds the training."""
    folder = tmp_path / "texts"
    folder.mkdir()
    for path in newsgroups:
        (folder / path.name).write_text(path.read_text())
    run(
        run_mlm,
        "--output_dir",
        tmp_path / "mlm",
        "--do_train",
        "--do_eval",
        "--dataset_name",
        folder,
        "--streaming",
        "--line_by_line",
        "--pad_to_max_length",
        "--max_seq_length",
        64,
        "--max_eval_samples",
        5,
        "--per_device_train_batch_size",
        8,
        "--max_steps",
        3,
        *from_scratch("fastformer"),
        *COMMON,
    )
    metrics = results(tmp_path / "mlm")
    assert "eval_samples" not in metrics and math.isfinite(metrics["eval_loss"])  # a stream has no length
    assert json.loads((tmp_path / "mlm" / "trainer_state.json").read_text())["global_step"] == 3


METRIC_SCRIPT = """
import datasets
import evaluate


class MeanAbsoluteError(evaluate.Metric):
    def _info(self):
        features = datasets.Features({"predictions": datasets.Value("float"), "references": datasets.Value("float")})
        return evaluate.MetricInfo(description="mean absolute error", citation="", features=features)

    def _compute(self, predictions, references):
        return {"mae": sum(abs(p - r) for p, r in zip(predictions, references)) / len(references)}
"""


@pytest.mark.slow
def test_classification_regression_with_an_evaluate_metric(tmp_path, newsgroups):
    """--do_regression on a float score (MSE, one output), --metric_name from a local evaluate script (offline),
    --remove_columns and --no_pad_to_max_length."""
    data = []
    for path in newsgroups:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        scored = tmp_path / path.name
        scored.write_text(
            "".join(
                json.dumps({"text": row["text"], "score": len(row["text"]) / 1000, "topic": row["label"]}) + "\n"
                for row in rows
            )
        )
        data.append(scored)
    (tmp_path / "mae.py").write_text(METRIC_SCRIPT)
    classify(
        tmp_path / "out",
        data,
        "--do_regression",
        "--label_column_name",
        "score",
        "--remove_columns",
        "topic",
        "--metric_name",
        tmp_path / "mae.py",
        "--no_pad_to_max_length",
        "--do_predict",
        "--test_file",
        data[1],
        "--max_predict_samples",
        3,
    )
    metrics = results(tmp_path / "out")
    assert metrics["eval_mse"] == pytest.approx(metrics["eval_loss"], rel=1e-5) and metrics["eval_mae"] >= 0
    assert "eval_accuracy" not in metrics
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    predictions = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 3 and all(isinstance(row["prediction"], float) for row in predictions)


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_about(native, monkeypatch, caplog, tmp_path):
    from transformers import Seq2SeqTrainingArguments  # noqa: PLC0415

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: native)
    for bf16 in (True, False):
        caplog.clear()
        warn_emulated_bf16(Seq2SeqTrainingArguments(output_dir=str(tmp_path), bf16=bf16, use_cpu=True))
        warned = [record.message for record in caplog.records if record.levelname == "WARNING"]
        assert warned == (
            [
                "--bf16 on a CPU without AVX512-BF16 or AMX instructions: bf16 is emulated here and runs "
                'slower than float32 (about 2x a training step); leave --bf16 out (or set "bf16": false) '
                "on this machine"
            ]
            if bf16 and not native
            else []
        )


def test_defaults_of_a_source_checkout_that_are_missing_say_what_to_pass(tmp_path):
    """Installed without the repository, the bundled tokenizer and data are not there: one line says what to pass."""
    model_args = ModelArguments()
    with pytest.raises(SystemExit, match=r"pass --tokenizer_name \(or --model_name_or_path\): the bundled"):
        load_tokenizer(model_args, tmp_path / "data" / "tokenizers" / "bert-base-uncased")
    data_args = parse_args(run_classification.ARGUMENTS, ["--output_dir", str(tmp_path)])[1]
    missing = {"train": tmp_path / "train.jsonl", "validation": tmp_path / "test.jsonl"}
    with pytest.raises(SystemExit, match=r"pass --train_file and --validation_file \(or --dataset_name\)"):
        load_raw_datasets(data_args, model_args, missing)


def test_a_script_runs_in_process_as_the_interpreter_runs_it(tmp_path):
    """tests.in_process.run_in_process, which these tests and the benchmark tests run scripts with: a path or -m and
    a module, the command line, the exit status and message, the output."""
    script = tmp_path / "script.py"
    script.write_text("import sys\nif __name__ == '__main__':\n    print(sys.argv[1:])\n    sys.exit(sys.argv[1])\n")
    process = run_in_process(["python", script, "a failure"])
    assert (process.returncode, process.stdout, process.stderr) == (1, "['a failure']\n", "a failure\n")
    # a module with no side effects (running a module as __main__ executes it again, registrations included)
    process = run_in_process(["python", "-m", "json.tool", "--help"])
    assert process.returncode == 0 and "usage:" in process.stdout and "json.tool" in process.stdout
    with pytest.raises(ValueError, match="env="):
        run_in_process(["python", script, "x"], env={"A": "1"})
