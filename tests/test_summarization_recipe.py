"""The warm-started summarization recipe: configs/summarization/news_headlines.json as run_summarization.py reads
it, a converted seq2seq checkpoint trained by it (tiny random BERT, 2 steps), and the benchmark behind
docs/RESULTS.md's summarization table (`python -m benchmarks.quality.summarization`) at toy size."""

import json
import shlex
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, BertConfig, BertModel, EncoderDecoderConfig, EncoderDecoderModel

from benchmarks import harness
from benchmarks.quality import summarization
from bert2bert import bert2bert_model
from fastformer.cli import convert_bert_to_fastformer, parse_args
from fastformer.conversion import convert_bert
from frozen_encoder import freeze_encoder
from headline_rules import clean_source, headline_style, headline_words, lead_words
from rouge_metric import rouge
from scripts import make_pseudo_summaries, run_summarization
from tests.in_process import run_in_process

RECIPE = Path("configs/summarization/news_headlines.json")
PRETRAINING = Path("configs/summarization/pseudo_summaries.json")
# the copy-head row chosen on the validation split, Fastformer's settings in rows.fastformer
CHOICE = Path("docs/results_summarization/issue34-copy-head.json")
MEASURED = Path("docs/results_summarization/day-of-the-news.json")  # docs/TRAINING.md's scores and the decoding chosen
CONSTRAINTS = Path("configs/summarization/constraints.txt")  # the package versions that wrote MEASURED
PATH_KEYS = ("model_name_or_path", "output_dir", "train_file", "validation_file", "test_file")


@pytest.fixture(scope="module")
def recipe(repo_root):
    return json.loads((repo_root / RECIPE).read_text())


@pytest.fixture(scope="module")
def bert(tokenizer):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    return BertModel(config, add_pooling_layer=False).eval()


@pytest.fixture(scope="module")
def converted(bert, tokenizer, tmp_path_factory):
    """A seq2seq Fastformer converted from the tiny BERT (weights copied, no attention transfer), saved."""
    folder = tmp_path_factory.mktemp("converted-seq2seq")
    convert_bert(bert, max_position_embeddings=128, task="seq2seq").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_argument_file_parses_with_the_script_parser(repo_root, recipe, monkeypatch):
    monkeypatch.chdir(repo_root)
    model_args, data_args, training_args = parse_args(run_summarization.ARGUMENTS, [str(RECIPE)])
    assert model_args.model_name_or_path == recipe["model_name_or_path"]
    assert (data_args.max_source_length, data_args.num_beams) == (recipe["max_source_length"], recipe["num_beams"])
    assert training_args.learning_rate == recipe["learning_rate"] and training_args.predict_with_generate
    # float32 (bf16 is an opt-in for CPUs with native support), the encoder frozen and run once per article
    assert not training_args.bf16 and model_args.freeze_encoder and model_args.cache_encoder_states


def test_argument_file_paths_are_relative_to_the_repository_and_exist(repo_root, recipe):
    for key in PATH_KEYS:
        assert not Path(recipe[key]).is_absolute() and ".." not in Path(recipe[key]).parts, key
    for key in ("train_file", "validation_file", "test_file"):
        assert (repo_root / recipe[key]).is_file(), key
    # the README's commands in order: the conversion writes the model that the pretraining stage starts from (on
    # the pseudo-summaries written just before it), which writes the model that the recipe fine-tunes and saves
    readme = (repo_root / "README.md").read_text()
    pretraining = json.loads((repo_root / PRETRAINING).read_text())
    conversion = next(line for line in readme.splitlines() if "--task seq2seq" in line and "convert_bert" in line)
    assert f"--output_dir {pretraining['model_name_or_path']} " in conversion
    pairs = f"python scripts/make_pseudo_summaries.py --output {pretraining['train_file']}"
    assert pretraining["output_dir"] == recipe["model_name_or_path"] and recipe["output_dir"] == "runs/headlines-minilm"
    commands = [
        conversion,
        pairs,
        f"python scripts/run_summarization.py {PRETRAINING}",
        f"python scripts/run_summarization.py {RECIPE}",
    ]
    assert [readme.index(command) for command in commands] == sorted(readme.index(command) for command in commands)
    config = repo_root / pretraining["model_name_or_path"] / "config.json"
    if config.exists():  # once that command has run
        assert json.loads(config.read_text())["is_encoder_decoder"]


def test_readme_summarization_commands_are_the_ones_measured(repo_root):
    """docs/TRAINING.md's minutes and scores are those of the README's summarization commands as they stand: a
    changed command is measured again before it lands."""
    measured = json.loads((repo_root / MEASURED).read_text())["commands"]
    readme = (repo_root / "README.md").read_text().splitlines()
    assert [line for line in readme if line in measured] == measured


def test_constraints_pin_the_environment_that_wrote_the_record(repo_root):
    """configs/summarization/constraints.txt pins each package the record's environment names to the version it
    names (torch without its local build tag), and the record names the file."""
    lines = [line for line in (repo_root / CONSTRAINTS).read_text().splitlines() if line and not line.startswith("#")]
    assert all(line.count("==") == 1 for line in lines), "one name==version per line (pip freeze --exclude-editable)"
    pins = dict(line.split("==") for line in lines)
    assert all(version and "+" not in version for version in pins.values())  # a local build is no index's version
    record = json.loads((repo_root / MEASURED).read_text())
    assert record["constraints"].startswith(str(CONSTRAINTS))
    environment = record["environment"]
    assert {"torch", "transformers", "accelerate", "datasets", "tokenizers", "numpy"} <= environment.keys()
    assert {name: pins.get(name) for name in environment} == {
        name: version.split("+")[0] for name, version in environment.items()
    }


def test_pretraining_argument_file_is_the_benchmarks_stage(repo_root, monkeypatch):
    """configs/summarization/pseudo_summaries.json is the pretraining stage the summarization benchmark runs, with
    the README's paths, and the copy head, its span gate and source context and the decoder's convolution added (the
    benchmark's start has the head already), and parses with the script's parser."""
    monkeypatch.chdir(repo_root)
    pretraining = json.loads((repo_root / PRETRAINING).read_text())
    args = summarization.parse_args([])
    paths = (pretraining["model_name_or_path"], pretraining["train_file"], pretraining["output_dir"])
    stage = summarization.pretraining(args.base, *paths)
    stage["model_type"] = "fastformer_copy"
    stage["config_overrides"] = "copy_spans=true,copy_context_window=3,decoder_conv_kernel=4"
    assert {key: value for key, value in stage.items() if value is not None} == pretraining
    model_args, data_args, training_args = parse_args(run_summarization.ARGUMENTS, [str(PRETRAINING)])
    assert model_args.freeze_encoder and not model_args.cache_encoder_states and not training_args.do_eval


def test_argument_files_hold_what_was_chosen_on_validation(repo_root, recipe, tmp_path):
    """The recipe is the copy-head row of docs/RESULTS.md's Fastformer at source 512, as chosen on the validation
    split: the start, the pseudo-summaries and the copy head of its pretraining stage, label smoothing, no second
    stage, everything else as the runs had it; then the span gate, the source context and the decoder's convolution,
    and the decoding chosen on the validation split of the recipe's own run with them
    (docs/results_summarization/day-of-the-news.json), and the beam reranker fit after evaluation."""
    record = json.loads((repo_root / CHOICE).read_text())
    row = record["rows"]["fastformer"]
    settings, decoding = row["settings"], dict(row["chosen"])
    assert recipe["max_source_length"] == 512
    readme = (repo_root / "README.md").read_text().splitlines()
    conversion = next(line for line in readme if "--task seq2seq" in line and "convert_bert" in line)
    assert f"--cross_attention_init {settings['cross_attention_init']} " in conversion
    # the README's pairs (the script's default texts: the news training articles only) are the benchmark's
    pairs = next(line for line in readme if line.startswith("python scripts/make_pseudo_summaries.py"))
    readme_flags = shlex.split(pairs.split(" &&")[0])[2:]
    readme_flags[readme_flags.index("--output") + 1] = str(tmp_path / "readme.jsonl")
    held_out = [f"{repo_root / recipe[f'{split}_file']}:document" for split in ("validation", "test")]
    pairing = {**settings["pretrain"], "clean_sources": recipe["clean_sources"], "held_out": held_out}
    pairing |= {"output": tmp_path / "benchmark.jsonl", "texts": [f"{repo_root / recipe['train_file']}:document"]}
    for flags in (readme_flags, harness.flags(pairing)):
        make_pseudo_summaries.main([*flags, "--max_texts", "40"])
    written = [lines_of(tmp_path / name) for name in ("readme.jsonl", "benchmark.jsonl")]
    assert len(written[0]) > 30 and written[0] == written[1]
    pretraining = json.loads((repo_root / PRETRAINING).read_text())
    overrides = "copy_spans=true,copy_context_window=3,decoder_conv_kernel=4"
    assert settings["copy_mechanism"] and pretraining["model_type"] == "fastformer_copy"
    assert pretraining["config_overrides"] == overrides
    assert recipe["label_smoothing_factor"] == settings["label_smoothing_factor"]
    assert recipe["num_beams"] == decoding["num_beams"]
    assert not row["unfreezing"]["kept"] and recipe["output_dir"] == "runs/headlines-minilm"  # the last stage
    assert {key: value for key, value in recipe.items() if key not in summarization.TUNED} == record["recipe"]
    # the decoding chosen on the validation split of the recipe's own run with the decoder's convolution: at least 8
    # tokens, ending on a content word, copied spans going on where the article's go on, punctuation only where the
    # article has it, up to 32 tokens, staying on a span once on one, in headline style
    measured = json.loads((repo_root / MEASURED).read_text())
    assert {key: recipe[key] for key in measured["chosen"]} == measured["chosen"]
    assert recipe["whole_words"] and recipe["min_target_length"] == 8 and recipe["end_on_content_words"]


def test_argument_file_with_an_unknown_key_or_no_file_is_refused(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"output_dir": "x", "learning_rat": 0.1}))
    for path, message in [(tmp_path / "bad.json", "learning_rat"), (tmp_path / "none.json", "no such file")]:
        with pytest.raises(SystemExit, match=message):
            parse_args(run_summarization.ARGUMENTS, [str(path)])


@pytest.mark.parametrize("cross_attention_type", ["softmax", "additive"])
def test_cross_attention_can_start_from_the_same_layers_self_attention(bert, cross_attention_type):
    """convert_bert(cross_attention_init="self_attention"): each decoder layer's cross-attention projections and
    output sub-layer are the source layer's self-attention ones (an additive one has no key; its w_c is as
    initialized); by default the cross-attention is random."""
    model = convert_bert(
        bert, task="seq2seq", cross_attention_init="self_attention", cross_attention_type=cross_attention_type
    )
    default = convert_bert(bert, task="seq2seq", cross_attention_type=cross_attention_type)
    for bert_layer, layer, random_layer in zip(
        bert.encoder.layer, model.get_decoder().layers, default.get_decoder().layers, strict=True
    ):
        source, cross = bert_layer.attention.self, layer.cross_attention
        for name in ("query", "key", "value"):
            if cross_attention_type == "softmax" or name != "key":
                assert torch.equal(getattr(cross, name).weight, getattr(source, name).weight), name
                assert torch.equal(getattr(cross, name).bias, getattr(source, name).bias), name
                assert not torch.equal(getattr(random_layer.cross_attention, name).weight, getattr(source, name).weight)
        assert torch.equal(layer.cross_attention_output.dense.weight, bert_layer.attention.output.dense.weight)
        assert torch.equal(layer.cross_attention_output.layer_norm.weight, bert_layer.attention.output.LayerNorm.weight)
    with pytest.raises(ValueError, match=r"cross_attention_init must be one of \('random', 'self_attention'\)"):
        convert_bert(bert, task="seq2seq", cross_attention_init="copy")
    with pytest.raises(ValueError, match='is for task="seq2seq": an encoder has none'):
        convert_bert(bert, cross_attention_init="self_attention")
    flags = ["--model_name_or_path", "source", "--output_dir", "out", "--cross_attention_init", "self_attention"]
    parsed, _, _ = parse_args(convert_bert_to_fastformer.ARGUMENTS, flags)  # the script's flag
    assert parsed.cross_attention_init == "self_attention"


def test_seq2seq_conversion_decoder_weights_equal_the_source(bert):
    model = convert_bert(bert, task="seq2seq")
    for bert_layer, layer in zip(bert.encoder.layer, model.get_decoder().layers, strict=True):
        source = bert_layer.attention.self
        for projection in ("query", "key", "value"):
            torch.testing.assert_close(getattr(layer.attention, projection).weight, getattr(source, projection).weight)
        torch.testing.assert_close(layer.attention_output.dense.weight, bert_layer.attention.output.dense.weight)
        torch.testing.assert_close(layer.feed_forward.intermediate.weight, bert_layer.intermediate.dense.weight)
        torch.testing.assert_close(layer.feed_forward.output.dense.weight, bert_layer.output.dense.weight)
        torch.testing.assert_close(layer.feed_forward.output.layer_norm.weight, bert_layer.output.LayerNorm.weight)
    word_embeddings = bert.embeddings.word_embeddings.weight
    torch.testing.assert_close(model.get_decoder().embeddings.word_embeddings.weight, word_embeddings)
    torch.testing.assert_close(model.lm_head.weight, word_embeddings)
    source = bert.embeddings  # segment 0's type embedding is folded into the position rows
    positions = source.position_embeddings.weight + source.token_type_embeddings.weight[0]
    torch.testing.assert_close(model.get_decoder().embeddings.position_embeddings.weight, positions)


@pytest.mark.slow
def test_recipe_trains_a_converted_checkpoint_and_generates(repo_root, recipe, converted, tmp_path, monkeypatch):
    """The argument file as it is, but for the tiny model, 8 articles and 2 steps (1 epoch of batch 4)."""
    settings = {
        **recipe,
        "model_name_or_path": str(converted),
        "model_type": "fastformer_copy",  # the recipe's headline stage starts from the pretrained copy model
        "output_dir": str(tmp_path / "run"),
        "max_train_samples": 8,
        "max_eval_samples": 4,
        "max_predict_samples": 4,
        "per_device_train_batch_size": 4,
        "max_source_length": 64,
        "num_train_epochs": 1,
    }
    arguments = tmp_path / "recipe.json"
    arguments.write_text(json.dumps(settings))
    monkeypatch.chdir(repo_root)  # the argument file names the data relative to the repository
    process = run_in_process(["python", run_summarization.__file__, str(arguments)])
    assert process.returncode == 0, process.stderr[-3000:]
    output = tmp_path / "run"
    state = json.loads((output / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    # the model's own summaries, and beside them the recipe's post-edit (the reranker's choice, in headline style)
    for name in ("generated_predictions.txt", "edited_predictions.txt"):
        assert len((output / name).read_text().splitlines()) == 4
    scored = json.loads((output / "all_results.json").read_text())
    assert {"predict_rouge1", "eval_rouge1", "eval_gen_len", "eval_reranked_rouge1"} <= scored.keys()
    assert {"eval_edited_rouge1", "predict_edited_rouge1", "predict_reranked_changed"} <= scored.keys()
    assert (output / "beam_reranker.json").is_file()  # the reranker fit on the validation beams, beside the model
    model = AutoModelForSeq2SeqLM.from_pretrained(output)
    # the decoding the recipe was evaluated with is saved with the model
    for key in ("num_beams", "length_penalty", "no_repeat_ngram_size"):
        assert getattr(model.generation_config, key) == recipe[key], key
    start = AutoModelForSeq2SeqLM.from_pretrained(converted)
    cross_attention = model.get_decoder().layers[0].cross_attention.query.weight
    assert not torch.equal(cross_attention, start.get_decoder().layers[0].cross_attention.query.weight)
    # --freeze_encoder: the encoder is as converted, its word embeddings too (untied from the decoder's, which train)
    assert recipe["freeze_encoder"] and model.config.tie_encoder_embeddings is False
    for name, tensor in start.get_encoder().state_dict().items():
        torch.testing.assert_close(model.get_encoder().state_dict()[name], tensor, msg=name)
    assert not torch.equal(model.lm_head.weight, start.lm_head.weight)
    generated = model.generate(torch.tensor([[101, 2023, 2003, 1037, 3231, 102]]), max_new_tokens=5)
    assert generated.shape[0] == 1 and 1 < generated.shape[1] <= 6


@pytest.mark.slow
def test_benchmark_tunes_each_family_by_levers_and_scores_the_test_split(
    repo_root, recipe, bert, converted, tmp_path, monkeypatch, capsys
):
    """lead-k and the Fastformer family at toy size (8 training, 6 validation and 6 test articles, one epoch of
    source 48), the scripts run in this process: the levers, the decodings, the test split, each run once."""
    argv, validation, ran = toy_benchmark(repo_root, recipe, bert, converted, tmp_path, monkeypatch)
    unlabeled = tmp_path / "unlabeled.jsonl"
    # a lever of each kind (the start, a pretraining stage, a flag, a second stage) and two decodings
    kinds = ("cross-attention init", "copyable pseudo-summaries", "copy mechanism", "unfreezing")
    monkeypatch.setattr(summarization, "LEVERS", {name: summarization.LEVERS[name] for name in kinds})
    monkeypatch.setattr(summarization, "DECODING", [summarization.GREEDY, summarization.DECODING[4]])
    argv = ["--rows", "lead", "fastformer-512", *argv]
    summarization.main([*argv, "--unlabeled", f"{unlabeled}:text"])

    lead, model = (json.loads((tmp_path / "records" / f"{row}.json").read_text()) for row in ("lead", "fastformer-512"))
    assert 1 <= lead["chosen"]["k"] <= 40 and len(lead["predictions"]) == 6 and lead["test"]["rouge1"] > 0
    # the other baselines, k from validation as well: the keywords, and lead-k in headline style (no article)
    styled = lead["styled_lead"]
    assert 1 <= lead["keywords"]["chosen"]["k"] <= 40 and 1 <= styled["chosen"]["k"] <= 40
    first = clean_source(json.loads(lines_of(tmp_path / "test.jsonl")[0])["document"])
    assert styled["predictions"][0] == headline_style(" ".join(headline_words(first)[: styled["chosen"]["k"]]))
    assert not any({"a", "an", "the"} & set(prediction.split()) for prediction in styled["predictions"])
    levers = model["tuning"]["levers"]
    assert [run["lever"] for run in levers] == ["recipe", *summarization.LEVERS]
    best = dict(summarization.LEVER_BASE)  # each lever adds its settings to the best so far: the kept accumulate
    for run, changes in zip(levers[1:], summarization.LEVERS.values()):
        assert run["settings"] == {**best, **changes}
        best = run["settings"] if run["kept"] else best
    assert model["chosen"]["training"] == best
    # unfreezing records the encoder's token-state spread before and after, and is kept only while it stays up
    before, after = levers[-1]["spread"]
    assert before > 0 and (after >= summarization.SPREAD_KEPT * before or not levers[-1]["kept"])
    decodings = model["tuning"]["decoding"]
    assert [run["setting"] for run in decodings] == summarization.DECODING
    readable = [run for run in decodings if run["degenerate"] <= summarization.DEGENERATE_MAX] or decodings
    assert model["chosen"]["decoding"] == max(readable, key=lambda run: run["rouge1"])["setting"]
    assert len(model["predictions"]) == 6 and model["decode_ms"] > 0 and model["train_seconds"] > 0
    assert model["machine"]["command"] and model["recipe"] == summarization.parse_args(argv).base
    # the pseudo-summaries: from the training and unlabeled articles, never the validation article
    folder = harness.cell(summarization.LEVERS["copyable pseudo-summaries"]["pretrain"])
    pairs = [
        json.loads(line) for line in lines_of(tmp_path / "headlines" / "pseudo_summaries" / folder / "pairs.jsonl")
    ]
    assert pairs and all(validation.split(". ")[1][:40] not in pair["document"] for pair in pairs)
    # the article whole, cleaned as the headline runs read it, and its lead cut to 12 words
    assert all(pair["document"].startswith(pair["summary"]) and len(pair["summary"].split()) <= 12 for pair in pairs)
    # the start with the copied cross-attention equals the source's self-attention
    start = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "headlines" / "starts" / "fastformer-self_attention")
    torch.testing.assert_close(
        start.get_decoder().layers[1].cross_attention.key.weight, bert.encoder.layer[1].attention.self.key.weight
    )
    # the pseudo-summaries; the recipe, each lever, each pretraining stage (once per model: with the copy head, the
    # stage trains it too), each decoding but greedy search, the test split: each script ran once (lead-k runs none)
    with_stage = [run["settings"] for run in levers if run["settings"]["pretrain"]]
    stages = {(harness.cell(settings["pretrain"]), settings["copy_mechanism"]) for settings in with_stage}
    assert len(ran) == 1 + 1 + len(summarization.LEVERS) + len(stages) + len(summarization.DECODING) - 1 + 1
    pretrainings = [command for command in ran if "pseudo_summaries" in " ".join(command) and "--train_file" in command]
    starts = [command[command.index("--model_name_or_path") + 1] for command in pretrainings]
    assert sorted(start.endswith("-copy") for start in starts) == sorted(copy for _, copy in stages)
    (copy_start,) = (path for path in (tmp_path / "headlines" / "starts").iterdir() if path.name.endswith("-copy"))
    assert AutoModelForSeq2SeqLM.from_pretrained(copy_start).copy_head is not None
    printed = capsys.readouterr().out
    assert "| lead-k (first k words) |" in printed and "| Fastformer, warm-started, source 512 |" in printed
    assert "| lead-k in headline style |" in printed and "| styled lead-k rouge2 |" in printed
    # a second call reads every stored run back
    monkeypatch.setattr(harness, "run", lambda *args: pytest.fail("a stored run ran again"))
    summarization.main([*argv, "--unlabeled", f"{unlabeled}:text", "--rows", "fastformer-512"])
    assert json.loads((tmp_path / "records" / "fastformer-512.json").read_text())["test"] == model["test"]


def toy_benchmark(repo_root, recipe, bert, converted, tmp_path, monkeypatch):
    """The benchmark's arguments at toy size, its scripts run in this process: a toy recipe of 8 training, 6
    validation and 6 test articles (source 48, one epoch, cleaned), unlabeled.jsonl (8 texts and the first validation
    article, which the pseudo-summaries must leave out), the conversion's source BERT saved; the argv, that
    validation article, and the list of commands run."""
    toy = {**recipe, "max_source_length": 48, "per_device_train_batch_size": 8, "num_train_epochs": 1}
    toy["clean_sources"] = True  # the articles without their datelines, for every row, lead-k and the pretraining
    for split, rows in (("train", 8), ("validation", 6), ("test", 6)):
        lines = (repo_root / recipe[f"{split}_file"]).read_text().splitlines()[:rows]
        toy[f"{split}_file"] = str(tmp_path / f"{split}.jsonl")
        Path(toy[f"{split}_file"]).write_text("\n".join(lines) + "\n")
    (tmp_path / "recipe.json").write_text(json.dumps(toy))
    validation = json.loads(lines_of(tmp_path / "validation.jsonl")[0])["document"]
    texts = [json.loads(line)["document"] for line in lines_of(repo_root / recipe["train_file"])[100:108]]
    unlabeled = tmp_path / "unlabeled.jsonl"
    unlabeled.write_text("".join(json.dumps({"text": text}) + "\n" for text in [*texts, validation]))
    bert.save_pretrained(tmp_path / "bert")  # the conversion's source, for the cross-attention from self-attention
    ran = []
    monkeypatch.setattr(harness, "run", lambda command, env=None: ran.append(command) or run_in_process(command, env))
    monkeypatch.setattr(summarization, "PRETRAIN", {**summarization.PRETRAIN, "max_source_length": 48})
    argv = ["--recipe", str(tmp_path / "recipe.json"), "--runs", str(tmp_path), "--records", str(tmp_path / "records")]
    return [*argv, "--converted", str(converted), "--source", str(tmp_path / "bert")], validation, ran


def test_benchmark_rows_train_with_a_given_choice_without_tuning(
    repo_root, recipe, bert, converted, tmp_path, monkeypatch
):
    """--chosen: the rows train and decode with that choice, their family not tuned, and score their own predictions
    (the choice's headline style kept apart); the 1,024-token row reads the 512-token row's pretraining stage back."""
    argv, _, ran = toy_benchmark(repo_root, recipe, bert, converted, tmp_path, monkeypatch)
    test_lines = lines_of(tmp_path / "test.jsonl")
    training = {**summarization.LEVER_BASE, **summarization.LEVERS["copyable pseudo-summaries"], "copy_mechanism": True}
    chosen = {"training": training, "decoding": {**summarization.DECODING[4], "headline_style": True}}
    argv += ["--chosen", json.dumps(chosen)]
    label, family, _ = summarization.ROWS["fastformer-1024"]  # a longer source within the toy model's positions
    monkeypatch.setitem(summarization.ROWS, "fastformer-1024", (label, family, {"max_source_length": 96}))
    summarization.main([*argv, "--rows", "fastformer-512", "fastformer-1024"])
    # the pseudo-summaries and the pretraining stage once, each row's headline run and its test split's prediction
    assert len(ran) == 2 + 2 * 2 and not (tmp_path / "headlines" / "fastformer" / "decoding").exists()
    for row, source_length in (("fastformer-512", 48), ("fastformer-1024", 96)):
        record = json.loads((tmp_path / "records" / f"{row}.json").read_text())
        assert record["chosen"] == chosen and "tuning" not in record and len(record["predictions"]) == 6
        # the scores are the model's own predictions'; headline style's post-edit of them is kept apart
        assert record["test"] == rouge(record["predictions"], [json.loads(line)["summary"] for line in test_lines])
        assert record["edited"]["predictions"] == [headline_style(text) for text in record["predictions"]]
        assert record["recipe"]["max_source_length"] == source_length  # the settings the row ran with
        pretrained, headline, predicted = (shlex.split(command) for command in record["commands"])
        assert "pseudo_summaries" in pretrained[pretrained.index("--train_file") + 1]
        for command in (headline, predicted):
            assert command[command.index("--max_source_length") + 1] == str(source_length)
        assert predicted[predicted.index("--no_repeat_ngram_size") + 1] == "1"
        model = AutoModelForSeq2SeqLM.from_pretrained(predicted[predicted.index("--model_name_or_path") + 1])
        assert model.copy_head is not None


@pytest.mark.parametrize(
    "chosen",
    [
        "{not json",
        '{"training": {"copy_mechanism": true}, "decoding": {}}',
        '{"training": {}}',
        '{"training": {"copy_mechanism": true, "cross_attention_init": "random", "pretrain": null}, "decoding": 4}',
        "[1]",
    ],
)
def test_benchmark_refuses_a_choice_without_its_settings(chosen, capsys):
    with pytest.raises(SystemExit):
        summarization.parse_args(["--chosen", chosen])
    assert "--chosen" in capsys.readouterr().err


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_bert2bert_cross_attention_can_start_from_the_same_layers_self_attention(bert, tokenizer, tmp_path):
    """The BERT2BERT rows' lever alike: each decoder layer's cross-attention a copy of its self-attention."""
    bert.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    random, _ = bert2bert_model(str(tmp_path))
    copied, _ = bert2bert_model(str(tmp_path), cross_attention_init="self_attention")
    for layer, before in zip(copied.decoder.bert.encoder.layer, random.decoder.bert.encoder.layer, strict=True):
        for name, tensor in layer.attention.state_dict().items():
            torch.testing.assert_close(layer.crossattention.state_dict()[name], tensor, msg=name)
        assert not torch.equal(before.crossattention.self.key.weight, before.attention.self.key.weight)
    torch.testing.assert_close(copied.encoder.embeddings.word_embeddings.weight, bert.embeddings.word_embeddings.weight)


def test_fastformer_start_with_random_cross_attention_from_a_self_attention_conversion(bert, tokenizer, tmp_path):
    """The Fastformer family's random-cross-attention start, derived from a conversion that copied the
    self-attention: new weights (transformers' own init would keep the loaded ones), the rest as converted."""
    converted = convert_bert(bert, max_position_embeddings=128, task="seq2seq", cross_attention_init="self_attention")
    converted.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "conversion.json").write_text(json.dumps({"cross_attention_init": "self_attention"}))
    model, _ = summarization.fastformer_start(str(tmp_path), "random")
    std = model.config.initializer_range
    for layer, source in zip(model.get_decoder().layers, bert.encoder.layer, strict=True):
        key = layer.cross_attention.key
        assert not torch.allclose(key.weight, source.attention.self.key.weight)
        assert abs(key.weight.std().item() - std) < 0.25 * std and not key.bias.any()
        assert torch.equal(layer.cross_attention_output.layer_norm.weight, torch.ones(32))
    for name, tensor in converted.state_dict().items():
        if ".cross_attention" not in name:
            torch.testing.assert_close(model.state_dict()[name], tensor, msg=name)


def test_freeze_encoder_fixes_all_of_a_bert2bert_encoder_and_nothing_of_its_decoder(bert):
    """BERT2BERT (EncoderDecoderModel) shares no parameter between encoder and decoder: freezing fixes the whole
    encoder and leaves the decoder trainable (tests/test_frozen_encoder.py: the Fastformer's, untied first)."""
    decoder_config = BertConfig(**{**bert.config.to_dict(), "is_decoder": True, "add_cross_attention": True})
    model = EncoderDecoderModel(EncoderDecoderConfig.from_encoder_decoder_configs(bert.config, decoder_config))
    freeze_encoder(model)
    assert not any(parameter.requires_grad for parameter in model.encoder.parameters())
    assert all(parameter.requires_grad for parameter in model.get_decoder().parameters())


def test_early_stopping_needs_the_best_model_kept(repo_root, converted, tmp_path):
    process = run_in_process(
        [
            "python",
            run_summarization.__file__,
            "--model_name_or_path",
            str(converted),
            "--output_dir",
            str(tmp_path),
            "--do_train",
            "--early_stopping_patience",
            "2",
            "--max_source_length",
            "64",
            "--use_cpu",
            "--report_to",
            "none",
        ],
    )
    assert process.returncode == 1
    assert "--early_stopping_patience needs --load_best_model_at_end" in process.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--model_name_or_path", "runs/not-converted-yet"],
            "--model_name_or_path runs/not-converted-yet: no such folder, and the Hub did not serve it",
        ),
        (
            ["--model_name_or_path", "runs/quality/not-converted-yet"],
            "--model_name_or_path runs/quality/not-converted-yet: no such folder, and the Hub did not serve it",
        ),
        (["--max_source_length", "256"], "--max_source_length 256 is longer than the model reads: 128 positions"),
    ],
    # a name the Hub could hold (owner/name: OSError) and one it cannot (three parts: ValueError)
    ids=["hub-shaped-name", "not-a-hub-name", "source-too-long"],
)
def test_a_missing_checkpoint_or_a_source_longer_than_the_positions_is_refused(
    repo_root, converted, tmp_path, flags, message, monkeypatch
):
    monkeypatch.chdir(repo_root)  # the relative names are looked up from the repository, as a user runs it
    process = run_in_process(
        [
            "python",
            run_summarization.__file__,
            "--model_name_or_path",
            str(converted),
            "--output_dir",
            str(tmp_path),
            "--do_train",
            "--use_cpu",
            "--report_to",
            "none",
            *flags,
        ],
    )
    assert process.returncode == 1
    assert message in process.stderr.strip().splitlines()[-1]


def test_choose_k_takes_the_k_of_the_best_validation_rouge1():
    article = "Trump advisers met Russia's ambassador. The ambassador met Trump twice, advisers said; Russia denied it."
    references = ["trump advisers met", "floods hit the coast"]
    documents = [article, "Floods hit the coast on Monday and closed roads."]
    k, grid = summarization.choose_k(lead_words, documents, references, ks=range(1, 6))
    assert set(grid) == {1, 2, 3, 4, 5} and k == max(grid, key=lambda k: grid[k]["rouge1"]) and k in (3, 4)


def test_length_window_bounds_generation_by_the_targets_lengths_in_tokens(tokenizer):
    """Targets of 1 to 20 tokens: with the end of sequence 2 to 21, whose 5th and 95th percentiles are 2.95 and
    20.05; the minimum rounds down, the maximum up and counts the decoder start."""
    targets = [" ".join(["news"] * length) for length in range(1, 21)]
    window = summarization.length_window
    assert window(tokenizer, targets) == {"min_target_length": 2, "generation_max_length": 22}
    assert window(tokenizer, targets, (0, 100)) == {"min_target_length": 2, "generation_max_length": 22}
    assert window(tokenizer, targets, (50, 50)) == {"min_target_length": 11, "generation_max_length": 13}


def test_compared_records_are_read_by_their_keys(tmp_path):
    """--compare FILE#KEY.KEY: another record's test scores and predictions, as a row of the tables."""
    record = {"rows": {"fastformer": {"test_rouge": {"rouge1": 26.0}, "predictions": ["a b", "c"]}}}
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    row = summarization.compared(f"{path}#rows.fastformer")
    assert row == {"label": "record#rows.fastformer", "test": {"rouge1": 26.0}, "predictions": ["a b", "c"]}
    edited = {"test": {"rouge1": 27.0}, "predictions": ["A b", "C"]}
    path.write_text(json.dumps({**record["rows"]["fastformer"], "edited": edited}))
    assert summarization.compared(str(path))["edited"] == edited
