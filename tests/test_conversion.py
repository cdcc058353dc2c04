"""BERT-family checkpoints converted to Fastformer (fastformer.conversion, scripts/convert_bert_to_fastformer.py) and
the attention transfer from the teacher (fastformer.distillation), on tiny random BERTs (and RoBERTa, XLM-R,
DistilBERT, ELECTRA models) built here."""

import json
import random

import datasets
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BartConfig,
    BartModel,
    BertConfig,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    DataCollatorWithPadding,
    DistilBertConfig,
    DistilBertModel,
    ElectraConfig,
    ElectraModel,
    RobertaConfig,
    RobertaModel,
    TrainingArguments,
    XLMRobertaConfig,
    XLMRobertaModel,
    pipeline,
)

from fastformer import FastformerForConditionalGeneration, FastformerForSequenceClassification, FastformerModel
from fastformer.cli import convert_bert_to_fastformer
from fastformer.conversion import (
    classifier_head,
    convert_bert,
    copy_encoder_layers,
    extend_positions,
    load_bert_source,
)
from fastformer.distillation import (
    AttentionTransfer,
    embedding_cosine,
    logit_distillation_loss,
    teacher_targets,
    transfer_attention,
    transfer_errors,
)
from fastformer.model_card import write_conversion_card

POSITIONS = 24  # the tiny teacher's learned positions
TEXTS = [
    "the shuttle launch was delayed by a day because of the weather",
    "a new graphics card renders the scene twice as fast",
    "the hockey team won its third game in a row",
    "doctors recommend a short walk after every meal",
    "the encryption key was published by mistake",
    "prices of used cars rose again this spring",
    "the motorcycle needs new brakes before the race",
    "believers gathered for the evening service",
]


@pytest.fixture(scope="module")
def bert(tokenizer):
    """A tiny random BERT with the bundled tokenizer's vocabulary, both token types used in training, and
    weights larger than BERT's initializer so that every term of the mapping matters."""
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=POSITIONS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


@pytest.fixture(scope="module")
def bert_folder(bert, tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-bert")
    bert.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def batch(tokenizer):
    return tokenizer(TEXTS[:4], padding=True, return_tensors="pt")


def test_shared_weights_map_exactly(bert, batch):
    """Single-segment embeddings equal BERT's (segment 0 folded into the positions); every layer's Q/K/V,
    attention output dense + LayerNorm and feed-forward block compute what BERT's do."""
    model = convert_bert(bert)
    length = batch["input_ids"].shape[1]
    positions = torch.arange(length).expand(len(batch["input_ids"]), -1)
    with torch.no_grad():
        expected = bert.embeddings(input_ids=batch["input_ids"], token_type_ids=torch.zeros_like(batch["input_ids"]))
        torch.testing.assert_close(model.embeddings(batch["input_ids"], positions), expected)
        x = torch.randn(2, 5, bert.config.hidden_size)
        for bert_layer, layer in zip(bert.encoder.layer, model.layers, strict=True):
            for name in ("query", "key", "value"):
                expected = getattr(bert_layer.attention.self, name)(x)
                torch.testing.assert_close(getattr(layer.attention, name)(x), expected)
            residual = torch.randn_like(x)
            torch.testing.assert_close(layer.attention_output(x, residual), bert_layer.attention.output(x, residual))
            expected = bert_layer.output(bert_layer.intermediate(x), x)
            torch.testing.assert_close(layer.feed_forward(x), expected)


def test_a_text_pair_embeds_as_in_bert(bert, batch):
    """Segment 1 as segment 0 above: the converted table holds each segment's embedding less segment 0's (which the
    positions hold), so the hidden states before the first layer are BERT's for a text pair too."""
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    segments = torch.zeros_like(input_ids)
    segments[:, 3:] = 1
    positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)  # BERT's, padding included
    model = convert_bert(bert)
    assert model.embeddings.token_type_embeddings.weight.shape[0] == bert.config.type_vocab_size == 2
    assert not model.embeddings.token_type_embeddings.weight[0].any()
    with torch.no_grad():
        expected = bert(input_ids, attention_mask, segments, output_hidden_states=True).hidden_states[0]
        found = model(input_ids, attention_mask, segments, positions, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(found, expected)


def test_new_parameters_start_as_documented(bert):
    model = convert_bert(bert)
    config = model.config
    assert (config.share_layers, config.share_query_value, config.query_residual) == (False, False, False)
    for layer in model.layers:
        torch.testing.assert_close(layer.attention.transform.weight, torch.eye(config.hidden_size))
        assert not layer.attention.transform.bias.any()
        assert not layer.attention.query_weight.any() and not layer.attention.key_weight.any()


def test_heads_are_a_free_choice_of_the_conversion(bert, batch):
    """The projections are copied whole, and w_q and w_k start at zero (plain means), so that before any transfer the
    converted model computes the same with any number of heads; the transfer then learns one pooling per head."""
    default = convert_bert(bert).eval()
    with torch.no_grad():
        expected = default(**batch).last_hidden_state
        for heads in (1, 2, 8):
            model = convert_bert(bert, num_attention_heads=heads).eval()
            assert model.config.num_attention_heads == heads and model.layers[0].attention.query_weight.numel() == 32
            torch.testing.assert_close(model(**batch).last_hidden_state, expected)
    assert convert_bert(bert, num_attention_heads=None).config.num_attention_heads == bert.config.num_attention_heads


def test_script_names_heads_that_do_not_divide_the_width(bert_folder, tmp_path):
    arguments = ["--model_name_or_path", str(bert_folder), "--output_dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"divisible by `num_attention_heads` \(5\)"):
        convert_bert_to_fastformer.main([*arguments, "--num_attention_heads", "5"])
    convert_bert_to_fastformer.main([*arguments, "--num_attention_heads", "2"])
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_attention_heads"] == 2


def test_position_extension_keeps_the_learned_positions(bert):
    model = convert_bert(bert, max_position_embeddings=2 * POSITIONS + 5)
    learned = bert.embeddings.position_embeddings.weight + bert.embeddings.token_type_embeddings.weight[0]
    extended = model.embeddings.position_embeddings.weight
    assert extended.shape[0] == 2 * POSITIONS + 5
    torch.testing.assert_close(extended[:POSITIONS], learned)
    torch.testing.assert_close(extended[POSITIONS : 2 * POSITIONS], learned)  # then repeated, as Longformer
    torch.testing.assert_close(extended[2 * POSITIONS :], learned[:5])
    torch.testing.assert_close(extend_positions(learned, 3), learned[:3])
    with pytest.raises(ValueError, match="below the source's"):
        convert_bert(bert, max_position_embeddings=POSITIONS - 1)


def test_long_inputs_run_past_the_source_positions(bert, tokenizer):
    model = convert_bert(bert, max_position_embeddings=4 * POSITIONS)
    ids = tokenizer(" ".join(TEXTS), return_tensors="pt")["input_ids"][:, : 3 * POSITIONS]
    assert ids.shape[1] > POSITIONS
    with torch.no_grad():
        assert torch.isfinite(model(ids).last_hidden_state).all()


def test_non_bert_sources_are_refused_by_name(tmp_path):
    BartModel(
        BartConfig(
            vocab_size=50,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=8,
            decoder_ffn_dim=8,
        )
    ).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"is a 'bart' model; only BERT-family checkpoints .*\('bert', 'roberta', "
        r"'xlm-roberta', 'distilbert', 'electra'\)",
    ):
        load_bert_source(str(tmp_path))


def noisy(model):
    """`model` in eval mode, its weights moved off their initialization so that every term of a mapping matters."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model.eval()


# the other BERT-family sources, tiny and random: the sizes of the tiny BERT, the bundled tokenizer's vocabulary
# and padding id (a RoBERTa's positions then start at row padding_idx + 1 = 1); an ELECTRA with narrower embeddings
SIZES = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
CONFIGS = {  # (vocabulary size, other fields) -> the config
    "bert": lambda vocab, **fields: BertConfig(vocab_size=vocab, max_position_embeddings=POSITIONS, **SIZES, **fields),
    "roberta": lambda vocab, **fields: RobertaConfig(
        vocab_size=vocab, pad_token_id=0, type_vocab_size=1, max_position_embeddings=POSITIONS + 1, **SIZES, **fields
    ),
    "xlm-roberta": lambda vocab, **fields: XLMRobertaConfig(
        vocab_size=vocab, pad_token_id=0, type_vocab_size=1, max_position_embeddings=POSITIONS + 1, **SIZES, **fields
    ),
    "distilbert": lambda vocab, **fields: DistilBertConfig(
        vocab_size=vocab,
        pad_token_id=0,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=37,
        dropout=0.0,
        attention_dropout=0.0,
        max_position_embeddings=POSITIONS,
        **fields,
    ),
    "electra": lambda vocab, **fields: ElectraConfig(
        vocab_size=vocab, pad_token_id=0, embedding_size=16, max_position_embeddings=POSITIONS, **SIZES, **fields
    ),
}
SOURCES = {
    "roberta": lambda vocab: RobertaModel(CONFIGS["roberta"](vocab), add_pooling_layer=False),
    "xlm-roberta": lambda vocab: XLMRobertaModel(CONFIGS["xlm-roberta"](vocab), add_pooling_layer=False),
    "distilbert": lambda vocab: DistilBertModel(CONFIGS["distilbert"](vocab)),
    "electra": lambda vocab: ElectraModel(CONFIGS["electra"](vocab)),
}


@pytest.fixture(scope="module", params=list(SOURCES))
def source_folder(request, tokenizer, tmp_path_factory):
    """A tiny random checkpoint of each other BERT-family type, saved with the bundled tokenizer."""
    folder = tmp_path_factory.mktemp(request.param)
    noisy(SOURCES[request.param](len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def source_embeddings(model, input_ids):
    """What the source's first layer reads for single-segment `input_ids` (no padding), computed by its own modules."""
    if isinstance(model, DistilBertModel):
        return model.embeddings(input_ids)
    embedded = model.embeddings(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids))
    return model.embeddings_project(embedded) if hasattr(model, "embeddings_project") else embedded


def source_feed_forwards(model) -> list:
    """Each of the source's layers' feed-forward block with its residual and LayerNorm, as its own modules run it."""
    if isinstance(model, DistilBertModel):
        return [lambda x, block=block: block.output_layer_norm(block.ffn(x) + x) for block in model.transformer.layer]
    return [lambda x, layer=layer: layer.output(layer.intermediate(x), x) for layer in model.encoder.layer]


def test_other_bert_family_sources_map_exactly(source_folder, tokenizer):
    """RoBERTa, XLM-R, DistilBERT and ELECTRA: the converted embeddings equal the source's (position 0 is the
    source's first real position; ELECTRA's projection included) and so do the feed-forward blocks; the teacher the
    distillation reads (a DistilBERT as its BertModel) computes the source's function."""
    original = AutoModel.from_pretrained(source_folder).eval()
    source = load_bert_source(str(source_folder))
    model = convert_bert(source.model, max_position_embeddings=2 * POSITIONS)
    ids = tokenizer(TEXTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        positions = torch.arange(ids.shape[1])[None]
        torch.testing.assert_close(model.embeddings(ids, positions), source_embeddings(original, ids))
        x = torch.randn(2, 5, 32)
        for feed_forward, layer in zip(source_feed_forwards(original), model.layers, strict=True):
            torch.testing.assert_close(layer.feed_forward(x), feed_forward(x))
        batch = tokenizer(TEXTS[:3], padding=True, return_tensors="pt")
        real = batch["attention_mask"].bool()
        expected = original(**batch).last_hidden_state[real]
        torch.testing.assert_close(source.model(**batch).last_hidden_state[real], expected)
        # the distillation's targets: the input of the first layer is the student's embedding output
        hidden_states, attention_outputs = teacher_targets(source.model, batch["input_ids"], batch["attention_mask"])
        student = model.embeddings(batch["input_ids"], torch.arange(batch["input_ids"].shape[1]).expand_as(real))
        torch.testing.assert_close(student[real], hidden_states[0][real])
        assert len(hidden_states) == 3 and len(attention_outputs) == 2
    assert model.config.max_position_embeddings == 2 * POSITIONS
    # the positions past the source's repeat its readable rows (a RoBERTa's from row padding_idx + 1)
    torch.testing.assert_close(
        model.embeddings.position_embeddings.weight[POSITIONS:], model.embeddings.position_embeddings.weight[:POSITIONS]
    )
    loss = AttentionTransfer(model, source.model, "end_to_end")(**batch).loss
    assert torch.isfinite(loss) and loss > 0


def test_electra_with_narrower_embeddings_converts_to_an_encoder_only(tokenizer):
    electra = noisy(SOURCES["electra"](len(tokenizer)))
    model = convert_bert(electra)
    assert model.config.embedding_size == 16 and model.embeddings.projection.in_features == 16
    with pytest.raises(ValueError, match="needs embedding_size == hidden_size .* embedding_size=16, hidden_size=32"):
        convert_bert(electra, task="seq2seq")


@pytest.mark.parametrize("kernel", [0, 3], ids=["plain", "short-convolution"])
def test_seq2seq_conversion_starts_encoder_and_decoder_from_bert(bert, tokenizer, kernel):
    """Both sides from BERT's layers; a decoder's short convolution (which BERT lacks) stays as it is when the
    decoder takes the distilled encoder's layers (`copy_encoder_layers`)."""
    model = convert_bert(bert, task="seq2seq", decoder_conv_kernel=kernel)
    assert isinstance(model, FastformerForConditionalGeneration)
    if kernel:
        weights = [layer.attention.convolution.weight for layer in model.get_decoder().layers]
        before = [weight.detach().clone() for weight in weights]
        copy_encoder_layers(model.get_encoder(), model.get_decoder().layers)
        assert all(torch.equal(weight, kept) for weight, kept in zip(weights, before, strict=True))
    encoder = convert_bert(bert)
    expected = encoder.embeddings.state_dict()
    for part in (model.get_encoder(), model.get_decoder()):  # the decoder has no token types (as BART's)
        for name, tensor in part.embeddings.state_dict().items():
            torch.testing.assert_close(tensor, expected[name])
        for layer, decoder_layer in zip(encoder.layers, part.layers, strict=True):
            for name in ("attention", "attention_output", "feed_forward"):
                for key, tensor in getattr(layer, name).state_dict().items():
                    torch.testing.assert_close(getattr(decoder_layer, name).state_dict()[key], tensor, msg=key)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    article = tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    generated = model.generate(**article, max_new_tokens=4, num_beams=2)
    assert generated.shape[0] == 2 and generated[0, 0] == tokenizer.cls_token_id


def dataset_of(tokenizer, texts):
    return datasets.Dataset.from_dict(dict(tokenizer(texts, truncation=True, max_length=POSITIONS)))


def held_out(tokenizer):
    return [tokenizer(TEXTS[4:], padding=True, return_tensors="pt")]


def transfer_args(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path),
        max_steps=12,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        save_strategy="no",
        report_to="none",
        seed=0,
        disable_tqdm=True,
        use_cpu=True,
    )
    return TrainingArguments(**{**settings, **overrides})


@pytest.mark.parametrize("stage", ["layerwise", "end_to_end"])
def test_transfer_lowers_the_per_layer_error(bert, tokenizer, tmp_path, stage):
    student = convert_bert(bert, pooler_type="mean")
    evaluation = held_out(tokenizer)
    before = transfer_errors(student, bert, evaluation)
    cosine_before = embedding_cosine(student, bert, evaluation)
    frozen = {name: tensor.clone() for name, tensor in student.state_dict().items()}
    teacher = {name: tensor.clone() for name, tensor in bert.state_dict().items()}
    transfer_attention(
        student,
        bert,
        stage,
        dataset_of(tokenizer, TEXTS[:4] * 4),
        transfer_args(tmp_path),
        DataCollatorWithPadding(tokenizer),
    )
    after = transfer_errors(student, bert, evaluation)
    measured = "attention" if stage == "layerwise" else "hidden"
    for layer, (error_before, error_after) in enumerate(zip(before[measured], after[measured], strict=True)):
        assert error_after < error_before, (stage, layer, before, after)
    assert embedding_cosine(student, bert, evaluation) > cosine_before
    # both models come back trainable as they were
    assert all(parameter.requires_grad for parameter in (*student.parameters(), *bert.parameters()))
    # the teacher never changes; the layerwise stage trains only the attention sub-layers
    for name, tensor in bert.state_dict().items():
        assert torch.equal(tensor, teacher[name]), name
    changed = {name for name, tensor in student.state_dict().items() if not torch.equal(tensor, frozen[name])}
    assert changed
    if stage == "layerwise":
        assert all(".attention." in name or ".attention_output.dense." in name for name in changed), changed
    else:
        assert not any(name.startswith("embeddings.") for name in changed), changed


def test_end_to_end_stage_can_match_the_last_layer_only(bert, tokenizer, tmp_path):
    student = convert_bert(bert, pooler_type="mean")
    batch = tokenizer(TEXTS[:3], padding=True, return_tensors="pt")
    every_layer = AttentionTransfer(student, bert, "end_to_end")(**batch).layer_errors
    last = AttentionTransfer(student, bert, "end_to_end", matched="last")(**batch)
    assert last.layer_errors.shape == (1,) and last.loss.item() == pytest.approx(every_layer[-1].item())
    with pytest.raises(ValueError, match="`matched` must be one of"):
        AttentionTransfer(student, bert, "end_to_end", matched="first")
    evaluation = held_out(tokenizer)
    before = transfer_errors(student, bert, evaluation)["hidden"][-1]
    transfer_attention(
        student,
        bert,
        "end_to_end",
        dataset_of(tokenizer, TEXTS[:4] * 4),
        transfer_args(tmp_path),
        DataCollatorWithPadding(tokenizer),
        matched="last",
    )
    assert transfer_errors(student, bert, evaluation)["hidden"][-1] < before


@pytest.mark.slow
def test_end_to_end_stage_can_match_the_pooled_embedding(bert, tokenizer, tmp_path, converted):
    """The pooled target adds the unexplained variance of the batch's sentence embeddings (the student's pooler on
    both models' last layer) to the last layer's; training on it brings the embeddings closer to the teacher's."""
    student = convert_bert(bert, pooler_type="mean")
    batch = tokenizer(TEXTS[:3], padding=True, return_tensors="pt")
    last = AttentionTransfer(student, bert, "end_to_end", matched="last")(**batch).loss
    pooled = AttentionTransfer(student, bert, "end_to_end", matched="pooled")(**batch)
    mask = batch["attention_mask"][..., None].float()
    with torch.no_grad():
        ours, theirs = ((model(**batch).last_hidden_state * mask).sum(1) / mask.sum(1) for model in (student, bert))
    by_hand = (ours - theirs).square().sum() / (theirs - theirs.mean(0)).square().sum()
    assert pooled.layer_errors.shape == (2,) and pooled.layer_errors[0].item() == pytest.approx(last.item())
    assert pooled.layer_errors[1].item() == pytest.approx(by_hand.item(), rel=1e-4)
    one = tokenizer(TEXTS[:1], return_tensors="pt")  # one embedding has no spread: the last layer alone
    assert AttentionTransfer(student, bert, "end_to_end", matched="pooled")(**one).layer_errors.shape == (1,)
    with pytest.raises(ValueError, match="pooler, which must have no weights.*additive"):
        AttentionTransfer(convert_bert(bert, pooler_type="additive"), bert, "end_to_end", matched="pooled")
    evaluation = held_out(tokenizer)
    before = embedding_cosine(student, bert, evaluation)
    transfer_attention(
        student,
        bert,
        "end_to_end",
        dataset_of(tokenizer, TEXTS[:4] * 4),
        transfer_args(tmp_path),
        DataCollatorWithPadding(tokenizer),
        matched="pooled",
    )
    assert embedding_cosine(student, bert, evaluation) > before
    settings = json.loads((converted / "conversion.json").read_text())
    settings["distillation"]["stages"]["end_to_end"]["matched"] = "last"  # the card names the target
    (tmp_path / "card").mkdir()
    card = write_conversion_card(tmp_path / "card", model=student, settings=settings)
    assert "learns the teacher's last hidden state end to end" in str(card)


def test_transfer_stage_refuses_unknown_stages_and_shared_layers(bert, build):
    with pytest.raises(ValueError, match="`stage` must be one of"):
        AttentionTransfer(convert_bert(bert), bert, "attention")
    with pytest.raises(ValueError, match="one unshared layer per teacher layer"):
        AttentionTransfer(build(FastformerModel, share_layers=True), bert, "layerwise")


def test_transfer_is_deterministic_and_resumes_where_it_stopped(bert, tokenizer, tmp_path):
    data, collator = dataset_of(tokenizer, TEXTS * 2), DataCollatorWithPadding(tokenizer)

    def run(folder, resume=None):
        torch.manual_seed(123)  # the resumed run must not depend on the global state either
        student = convert_bert(bert)
        args = transfer_args(folder, max_steps=4, save_strategy="steps", save_steps=2, lr_scheduler_type="linear")
        transfer_attention(student, bert, "layerwise", data, args, collator, resume_from_checkpoint=resume)
        return student.state_dict()

    whole = run(tmp_path / "whole")
    again = run(tmp_path / "again")
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "whole" / "checkpoint-2"))
    for name, tensor in whole.items():
        assert torch.equal(again[name], tensor), name
        torch.testing.assert_close(resumed[name], tensor, msg=name)
    assert any(not torch.equal(tensor, convert_bert(bert).state_dict()[name]) for name, tensor in whole.items())


@pytest.fixture(scope="module")
def converted(bert_folder, repo_root, tmp_path_factory):
    """The script's folder for the tiny BERT: positions extended, a few steps of both transfer stages."""
    texts = tmp_path_factory.mktemp("texts") / "texts.jsonl"
    texts.write_text("".join(json.dumps({"body": text}) + "\n" for text in TEXTS * 3))
    output = tmp_path_factory.mktemp("converted") / "tiny-fastformer"
    convert_bert_to_fastformer.main(
        [
            "--model_name_or_path",
            str(bert_folder),
            "--output_dir",
            str(output),
            "--max_position_embeddings",
            str(2 * POSITIONS),
            "--distill_file",
            str(texts),
            "--text_column",
            "body",
            "--max_seq_length",
            str(POSITIONS),
            "--max_steps",
            "3",
            "--end_to_end_steps",
            "2",
            "--save_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--validation_split_percentage",
            "20",
            "--use_cpu",
            "--disable_tqdm",
            "true",
        ]
    )
    return output


def test_converted_folder_is_a_hub_ready_checkpoint(converted, bert):
    names = {path.name for path in converted.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "modeling_fastformer.py",
        "tokenizer.json",
        "README.md",
        "conversion.json",
    } <= names
    assert "distillation" not in names  # the transfer's checkpoints are gone once the folder is saved
    settings = json.loads((converted / "conversion.json").read_text())
    report = settings["distillation"]
    assert [stage["max_steps"] for stage in report["stages"].values()] == [3, 2]
    assert report["stages"]["end_to_end"]["matched"] == "pooled"  # the default: the last layer and its embedding
    assert len(report["before"]["attention"]) == bert.config.num_hidden_layers
    card = (converted / "README.md").read_text()
    assert "converted-from-bert" in card and "Attention transfer" in card and "| end_to_end | 2 |" in card
    assert "learns the teacher's last hidden state and sentence embedding end to end" in card
    config = json.loads((converted / "config.json").read_text())
    assert config["max_position_embeddings"] == 2 * POSITIONS and config["query_residual"] is False


@pytest.mark.parametrize(
    "auto_class", [AutoModel, AutoModelForSequenceClassification, AutoModelForMaskedLM, AutoModelForSeq2SeqLM]
)
def test_converted_folder_loads_with_every_auto_class(converted, auto_class, bert):
    model = auto_class.from_pretrained(converted)
    encoder = model.get_encoder() if model.config.is_encoder_decoder else getattr(model, "fastformer", model)
    # the feed-forward blocks train only in the end-to-end stage (2 steps here): close to BERT's, not equal
    expected = bert.encoder.layer[0].intermediate.dense.weight
    torch.testing.assert_close(encoder.layers[0].feed_forward.intermediate.weight, expected, rtol=0, atol=0.1)
    assert not torch.equal(encoder.layers[0].attention.query_weight, torch.zeros_like(expected[:4, :8]))


@pytest.mark.slow
def test_converted_folder_loads_as_hub_code_without_the_package(converted, hide_fastformer, fresh_python):
    script = hide_fastformer + (
        "from transformers import AutoModel, AutoTokenizer\n"
        f"model = AutoModel.from_pretrained({str(converted)!r}, trust_remote_code=True)\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(converted)!r}, trust_remote_code=True)\n"
        "batch = tokenizer(['a long text ' * 10], return_tensors='pt')  # past the source's 24 positions\n"
        "print(type(model).__module__, tuple(model(**batch).last_hidden_state.shape))\n"
    )
    module, shape = fresh_python(script, converted.parent).strip().splitlines()[-1].split(" ", 1)
    assert module.startswith("transformers_modules.") and shape == "(1, 32, 32)"


def test_script_refuses_to_overwrite_a_converted_folder(converted, bert_folder):
    with pytest.raises(SystemExit, match="already holds a converted model: pass --overwrite_output_dir"):
        convert_bert_to_fastformer.main(["--model_name_or_path", str(bert_folder), "--output_dir", str(converted)])


def test_script_resumes_only_the_same_conversion(bert_folder, tmp_path):
    """Checkpoints of an unfinished transfer are resumed by the same command, refused for another one (whose
    student they would replace), and deleted with --overwrite_output_dir."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    output = tmp_path / "out"
    arguments = [
        "--model_name_or_path",
        str(bert_folder),
        "--output_dir",
        str(output),
        "--distill_file",
        str(texts),
        "--max_steps",
        "2",
        "--end_to_end_steps",
        "0",
        "--max_seq_length",
        "16",
        "--use_cpu",
        "--disable_tqdm",
        "true",
    ]
    work = output / "distillation"
    work.mkdir(parents=True)
    (work / "run.json").write_text(json.dumps({"source": "another-model"}))
    with pytest.raises(SystemExit, match="holds the checkpoints of another conversion"):
        convert_bert_to_fastformer.main(arguments)
    (work / "modules.json").write_text("stale")
    convert_bert_to_fastformer.main([*arguments, "--overwrite_output_dir"])
    assert not work.exists() and (output / "config.json").exists()
    assert "sentence-transformers" not in (output / "README.md").read_text()


@pytest.mark.slow
def test_script_rerun_reads_back_a_stage_that_had_finished(bert_folder, tmp_path, monkeypatch):
    """A conversion stopped in its end-to-end stage reruns that stage only, from the layerwise stage's student as it
    ended (Trainer resumed from a stage's last checkpoint would train it one step more), to the same weights as an
    uninterrupted run."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")

    def arguments(output):
        return [
            "--model_name_or_path",
            str(bert_folder),
            "--output_dir",
            str(output),
            "--distill_file",
            str(texts),
            "--max_steps",
            "2",
            "--end_to_end_steps",
            "2",
            "--save_steps",
            "1",
            "--max_seq_length",
            "16",
            "--lr_scheduler_type",
            "cosine",
            "--use_cpu",
            "--disable_tqdm",
            "true",
        ]

    convert_bert_to_fastformer.main(arguments(tmp_path / "whole"))
    transfer = convert_bert_to_fastformer.transfer_attention
    stages = []

    def stopped_in_the_end_to_end_stage(student, teacher, stage, *args, **kwargs):
        stages.append(stage)
        if stage == "end_to_end":
            raise KeyboardInterrupt
        return transfer(student, teacher, stage, *args, **kwargs)

    monkeypatch.setattr(convert_bert_to_fastformer, "transfer_attention", stopped_in_the_end_to_end_stage)
    with pytest.raises(KeyboardInterrupt):
        convert_bert_to_fastformer.main(arguments(tmp_path / "stopped"))
    with pytest.raises(KeyboardInterrupt):
        convert_bert_to_fastformer.main(arguments(tmp_path / "stopped"))
    assert stages == ["layerwise", "end_to_end", "end_to_end"]
    monkeypatch.setattr(convert_bert_to_fastformer, "transfer_attention", transfer)
    convert_bert_to_fastformer.main(arguments(tmp_path / "stopped"))
    whole, resumed = (FastformerModel.from_pretrained(tmp_path / name).state_dict() for name in ("whole", "stopped"))
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, msg=name)
    reports = [
        json.loads((tmp_path / name / "conversion.json").read_text())["distillation"]["stages"]
        for name in ("whole", "stopped")
    ]
    assert reports[1]["layerwise"]["after"] == reports[0]["layerwise"]["after"]


def test_script_names_the_supported_sources(tmp_path):
    source = tmp_path / "bart"
    BartModel(
        BartConfig(
            vocab_size=50,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=8,
            decoder_ffn_dim=8,
        )
    ).save_pretrained(source)
    with pytest.raises(SystemExit, match="only BERT-family checkpoints can be converted"):
        convert_bert_to_fastformer.main(["--model_name_or_path", str(source), "--output_dir", str(tmp_path / "out")])


@pytest.fixture(scope="module")
def distilbert_folder(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-distilbert")
    noisy(SOURCES["distilbert"](len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("transformer", ["bert_folder", "distilbert_folder"])
def test_sentence_transformers_model_stays_one(transformer, request, tmp_path):
    """A sentence-transformers source (mean pooling, normalization; on a BERT or a DistilBERT) converts into a
    folder that SentenceTransformer loads as Hub code, with the same pooling and normalization."""
    folder = request.getfixturevalue(transformer)
    source = SentenceTransformer(
        modules=[Transformer(str(folder), max_seq_length=POSITIONS), Pooling(32, pooling_mode="mean"), Normalize()]
    )
    source.save(str(tmp_path / "source"))
    loaded = load_bert_source(str(tmp_path / "source"))
    assert loaded.pooler_type == "mean"
    output = tmp_path / "converted"
    convert_bert_to_fastformer.main(
        [
            "--model_name_or_path",
            str(tmp_path / "source"),
            "--output_dir",
            str(output),
            "--max_position_embeddings",
            str(3 * POSITIONS),
        ]
    )

    model = SentenceTransformer(str(output), trust_remote_code=True, device="cpu")
    assert model.max_seq_length == 3 * POSITIONS  # the converted positions, not the source's
    embeddings = model.encode(TEXTS[:3], convert_to_tensor=True)
    fastformer = FastformerModel.from_pretrained(output)
    batch = model.tokenize(TEXTS[:3])
    with torch.no_grad():
        pooled = fastformer(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).pooler_output
    torch.testing.assert_close(embeddings, torch.nn.functional.normalize(pooled, dim=-1), rtol=1e-4, atol=1e-5)
    assert "sentence-transformers" in (output / "README.md").read_text()


def test_sentence_transformers_pooling_without_a_fastformer_pooler_is_refused(bert_folder, tmp_path):
    SentenceTransformer(modules=[Transformer(str(bert_folder)), Pooling(32, pooling_mode="max")]).save(str(tmp_path))
    with pytest.raises(ValueError, match=r"pools with \['max'\]; a converted model pools with exactly one of"):
        load_bert_source(str(tmp_path))


def test_sentence_transformers_modules_a_fastformer_cannot_carry_are_refused(bert_folder, tmp_path):
    modules = [Transformer(str(bert_folder)), Pooling(32, pooling_mode="mean"), Dense(32, 8)]
    SentenceTransformer(modules=modules).save(str(tmp_path))
    with pytest.raises(ValueError, match=r"with the modules \[.*Dense'\], which a converted model cannot carry"):
        load_bert_source(str(tmp_path))


@pytest.mark.parametrize("model_type", ["roberta", "electra"])
def test_script_converts_other_sources_with_the_attention_transfer(model_type, tokenizer, tmp_path):
    """A RoBERTa (positions after padding_idx) and an ELECTRA (narrower embeddings) through the whole script, with
    the attention transfer: it lowers the error against the teacher, and the folder loads with
    the Auto classes of an encoder."""
    source = tmp_path / model_type
    noisy(SOURCES[model_type](len(tokenizer))).save_pretrained(source)
    tokenizer.save_pretrained(source)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS * 3) + "\n")
    output = tmp_path / "converted"
    convert_bert_to_fastformer.main(
        [
            "--model_name_or_path",
            str(source),
            "--output_dir",
            str(output),
            "--distill_file",
            str(texts),
            "--max_seq_length",
            str(POSITIONS),
            "--max_steps",
            "6",
            "--end_to_end_steps",
            "2",
            "--learning_rate",
            "1e-2",
            "--per_device_train_batch_size",
            "4",
            "--validation_split_percentage",
            "20",
            "--use_cpu",
            "--disable_tqdm",
            "true",
            "--save_strategy",
            "no",
        ]
    )
    report = json.loads((output / "conversion.json").read_text())
    assert report["source_max_position_embeddings"] == POSITIONS
    distillation = report["distillation"]
    before = distillation["before"]["attention"]
    after = distillation["stages"]["layerwise"]["after"]
    assert all(error < start for start, error in zip(before, after["attention"], strict=True))
    encoder = AutoModel.from_pretrained(output)
    assert isinstance(encoder, FastformerModel) and encoder.config.max_position_embeddings == POSITIONS
    masked_lm = AutoModelForMaskedLM.from_pretrained(output)  # its head maps back to the embeddings' width
    batch = tokenizer(TEXTS[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = masked_lm(**batch).logits
    assert logits.shape == (*batch["input_ids"].shape, len(tokenizer)) and torch.isfinite(logits).all()
    assert AutoModelForSequenceClassification.from_pretrained(output, num_labels=3).config.num_labels == 3
    assert f"converted-from-{model_type}" in (output / "README.md").read_text()


def test_script_seq2seq_decoder_starts_from_the_distilled_encoder(bert_folder, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS * 2) + "\n")
    output = tmp_path / "seq2seq"
    convert_bert_to_fastformer.main(
        [
            "--model_name_or_path",
            str(bert_folder),
            "--output_dir",
            str(output),
            "--task",
            "seq2seq",
            "--distill_file",
            str(texts),
            "--max_steps",
            "2",
            "--end_to_end_steps",
            "1",
            "--max_seq_length",
            "16",
            "--use_cpu",
            "--disable_tqdm",
            "true",
        ]
    )
    model = AutoModelForSeq2SeqLM.from_pretrained(output)
    assert isinstance(model, FastformerForConditionalGeneration)
    encoder, decoder = model.get_encoder(), model.get_decoder()
    for layer, decoder_layer in zip(encoder.layers, decoder.layers, strict=True):
        for key, tensor in layer.attention.state_dict().items():
            torch.testing.assert_close(decoder_layer.attention.state_dict()[key], tensor, msg=key)
    assert not torch.equal(encoder.layers[0].attention.query_weight, torch.zeros(4, 8))  # distilled
    assert json.loads((output / "conversion.json").read_text())["task"] == "seq2seq"


def test_script_refuses_texts_longer_than_the_teacher_reads(bert_folder, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    with pytest.raises(SystemExit, match=f"--max_seq_length 256 is more than the teacher's {POSITIONS} positions"):
        convert_bert_to_fastformer.main(
            [
                "--model_name_or_path",
                str(bert_folder),
                "--output_dir",
                str(tmp_path / "o"),
                "--distill_file",
                str(texts),
            ]
        )


# ---- fine-tuned sequence classifiers ------------------------------------------------------------------------------
LABELS = {0: "science", 1: "sport", 2: "daily life"}
TOPICS = [0, 0, 1, 2, 0, 2, 1, 2]  # the label of each of TEXTS
CLASSIFIER_FIELDS = dict(
    id2label=LABELS,
    label2id={name: index for index, name in LABELS.items()},
    problem_type="single_label_classification",
)


def topic_texts(seed: int, count: int) -> list[tuple[str, int]]:
    """(text, label): most words of one of TEXTS, shuffled with a few of the others', labelled with its topic."""
    generator, words = random.Random(seed), " ".join(TEXTS).split()
    examples = []
    for _ in range(count):
        index = generator.randrange(len(TEXTS))
        own = TEXTS[index].split()
        chosen = generator.sample(own, generator.randint(3, min(8, len(own)))) + generator.choices(words, k=3)
        generator.shuffle(chosen)
        examples.append((" ".join(chosen), TOPICS[index]))
    return examples


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_classifier_heads_map_exactly(model_type, tokenizer, tmp_path):
    """A fine-tuned *ForSequenceClassification of each source type converts to a FastformerForSequenceClassification
    with its labels; before any distillation its head (BERT's pooler and classifier, RoBERTa's, XLM-R's and ELECTRA's
    classification head, DistilBERT's pre-classifier and classifier) on the teacher's last hidden states gives the
    teacher's logits, as does the teacher the distillation reads (its encoder and `head`); its last layer's [CLS]
    attention (`cls_attention_heads`) gives the teacher's."""
    teacher = noisy(
        AutoModelForSequenceClassification.from_config(CONFIGS[model_type](len(tokenizer), **CLASSIFIER_FIELDS))
    )
    teacher.save_pretrained(tmp_path)
    source = load_bert_source(str(tmp_path))
    assert source.task == "classification"
    model = convert_bert(source.model, task="classification", head=source.head)
    assert isinstance(model, FastformerForSequenceClassification)
    assert model.config.pooler_type == {"distilbert": "cls_relu", "electra": "cls_gelu"}.get(model_type, "cls_tanh")
    for name, value in {"num_labels": 3, **CLASSIFIER_FIELDS}.items():
        assert getattr(model.config, name) == value, name
    batch = tokenizer(TEXTS[:4], padding=True, return_tensors="pt", return_token_type_ids=False)
    with torch.no_grad():
        expected = teacher(**batch, output_hidden_states=True)
        pooled = model.fastformer.pooler(expected.hidden_states[-1], batch["attention_mask"])
        torch.testing.assert_close(model.classifier(model.dropout(pooled)), expected.logits)
        hidden_states = source.model(**batch).last_hidden_state
        torch.testing.assert_close(source.head(hidden_states, batch["attention_mask"]), expected.logits)
        # [CLS] keeps the teacher's softmax attention in the last layer: exactly, before any transfer
        assert model.config.cls_attention_heads == source.model.config.num_attention_heads
        inputs, attention_outputs = teacher_targets(source.model, batch["input_ids"], batch["attention_mask"])
        last = model.fastformer.layers[-1]
        found = last.attention_sublayer(inputs[-2], batch["attention_mask"], cls=True)[0]
        torch.testing.assert_close(found[:, 0], attention_outputs[-1][:, 0])
    additive = convert_bert(source.model, task="classification", head=source.head, cls_attention_heads=0)
    assert additive.config.cls_attention_heads == 0  # every token additive, as the paper


@pytest.mark.parametrize("head", [BertForTokenClassification, BertForQuestionAnswering, None], ids=str)
def test_sources_whose_head_is_no_sequence_classifier_are_refused(head, tmp_path):
    """A token-classification or QA head, and a fine-tuned checkpoint (labels set) that records no `architectures`,
    stop the command naming --model_name_or_path; a headless checkpoint converts as an encoder, as before."""
    config = CONFIGS["bert"](99, **CLASSIFIER_FIELDS)
    (head or BertForSequenceClassification)(config).save_pretrained(tmp_path)
    if head is None:
        saved = json.loads((tmp_path / "config.json").read_text())
        del saved["architectures"]
        (tmp_path / "config.json").write_text(json.dumps(saved))
    found = f"\\['{head.__name__}'\\]" if head else "none in its config"
    with pytest.raises(
        SystemExit, match=f"--model_name_or_path {tmp_path} has the architectures {found}; a fine-tuned"
    ):
        convert_bert_to_fastformer.main(["--model_name_or_path", str(tmp_path), "--output_dir", str(tmp_path / "o")])
    assert load_bert_source(str(tmp_path), task="encoder").task == "encoder"  # its encoder alone, when asked for
    if head is None:  # without labels, nothing says a head is missing
        saved.update(
            id2label={"0": "LABEL_0", "1": "LABEL_1"}, label2id={"LABEL_0": 0, "LABEL_1": 1}, problem_type=None
        )
        (tmp_path / "config.json").write_text(json.dumps(saved))
        assert load_bert_source(str(tmp_path)).task == "encoder"


def test_classification_of_an_encoder_is_refused(bert_folder):
    with pytest.raises(ValueError, match=r"has the architectures \['BertModel'\]; a fine-tuned"):
        load_bert_source(str(bert_folder), task="classification")
    with pytest.raises(ValueError, match="task 'classification' takes the source's classifier `head`"):
        convert_bert(load_bert_source(str(bert_folder)).model, task="classification")


def test_logit_distillation_loss_is_the_softened_kl():
    torch.manual_seed(0)
    student, teacher = torch.randn(4, 3), torch.randn(4, 3)
    soft = (teacher / 2).softmax(-1)
    expected = (soft * (soft.log() - (student / 2).log_softmax(-1))).sum(-1).mean() * 4
    torch.testing.assert_close(logit_distillation_loss(student, teacher, 2.0), expected)
    assert logit_distillation_loss(teacher, teacher, 2.0).item() == pytest.approx(0.0, abs=1e-6)
    ours, theirs = torch.sigmoid(student / 2), torch.sigmoid(teacher / 2)  # each label a Bernoulli distribution
    bernoulli = theirs * (theirs / ours).log() + (1 - theirs) * ((1 - theirs) / (1 - ours)).log()
    found = logit_distillation_loss(student, teacher, 2.0, "multi_label_classification")
    torch.testing.assert_close(found, bernoulli.mean() * 4)
    torch.testing.assert_close(
        logit_distillation_loss(student, teacher, 2.0, "regression"), (student - teacher).square().mean()
    )


def test_classifier_transfer_adds_the_logit_and_label_losses(tokenizer):
    """The end-to-end loss of a classifier student: the hidden-state error (`hidden_weight`), the logit loss against
    the teacher's head (`logit_weight`, `temperature`) and the cross-entropy of the labels given (-100: none)."""
    teacher = noisy(BertForSequenceClassification(CONFIGS["bert"](len(tokenizer), **CLASSIFIER_FIELDS)))
    head = classifier_head(teacher, teacher.bert)
    student = convert_bert(teacher.bert, task="classification", head=head)
    batch = tokenizer(TEXTS[:4], padding=True, return_tensors="pt", return_token_type_ids=False)
    labels = torch.tensor([0, 2, -100, 1])

    def loss(matched="last", **settings):
        return AttentionTransfer(student, teacher.bert, "end_to_end", matched, teacher_head=head, **settings)

    hidden = loss(logit_weight=0.0)(**batch).loss
    with torch.no_grad():
        logits, theirs = student(**batch).logits, teacher(**batch).logits
    distance = logit_distillation_loss(logits, theirs, 3.0)
    assert distance > 0  # the attention is not yet the teacher's
    transfer = loss(logit_weight=0.5, temperature=3.0, hidden_weight=2.0)
    torch.testing.assert_close(transfer(**batch).loss, 2 * hidden + 0.5 * distance)
    real = labels != -100
    cross_entropy = torch.nn.functional.cross_entropy(logits[real], labels[real])
    torch.testing.assert_close(transfer(**batch, labels=labels).loss, 2 * hidden + 0.5 * distance + cross_entropy)
    assert set(transfer.state_dict()) == {f"student.{name}" for name in student.state_dict()}
    with pytest.raises(ValueError, match="a classifier student learns from a `teacher_head`, and only it does"):
        AttentionTransfer(student, teacher.bert, "end_to_end")
    pooled = loss(matched="pooled", logit_weight=0.0)(**batch).layer_errors
    with torch.no_grad():  # the features each head's pooler gives its classifier
        ours = student.fastformer.pooler(student(**batch, output_hidden_states=True).hidden_states[-1])
        theirs = teacher.bert.pooler(teacher.bert(**batch).last_hidden_state)
    by_hand = (ours - theirs).square().sum() / (theirs - theirs.mean(0)).square().sum()
    assert pooled.shape == (2,) and pooled[0].item() == pytest.approx(hidden.item())
    assert pooled[1].item() == pytest.approx(by_hand.item(), rel=1e-4) and by_hand > 0


@pytest.fixture(scope="module")
def classifier_folder(tokenizer, tmp_path_factory):
    """A tiny BERT classifier fine-tuned on the topics of `topic_texts` (its predictions spread over the labels),
    saved with the bundled tokenizer."""
    torch.manual_seed(0)
    teacher = noisy(BertForSequenceClassification(CONFIGS["bert"](len(tokenizer), **CLASSIFIER_FIELDS))).train()
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=3e-3)
    examples = topic_texts(2, 960)
    for start in range(0, len(examples), 16):
        texts, labels = zip(*examples[start : start + 16], strict=True)
        batch = tokenizer(list(texts), padding=True, return_tensors="pt", return_token_type_ids=False)
        teacher(**batch, labels=torch.tensor(labels)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = tmp_path_factory.mktemp("tiny-bert-classifier")
    teacher.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_script_converts_a_classifier_that_agrees_with_its_teacher(classifier_folder, tokenizer, tmp_path):
    """From the tiny fine-tuned BERT classifier and unlabeled texts, with the logit distillation (the default for a
    classifier), to a FastformerForSequenceClassification that predicts what its teacher does on new texts."""
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"body": text}) + "\n" for text, _ in topic_texts(0, 120)))
    output = tmp_path / "converted"
    arguments = ["--model_name_or_path", str(classifier_folder), "--output_dir", str(output)]
    arguments += ["--base_model", "someone/tiny-bert-classifier", "--max_position_embeddings", str(2 * POSITIONS)]
    arguments += ["--distill_file", str(texts), "--text_column", "body", "--max_seq_length", str(POSITIONS)]
    arguments += ["--max_steps", "20", "--end_to_end_steps", "40", "--learning_rate", "1e-2"]
    arguments += ["--end_to_end_learning_rate", "3e-3", "--lr_scheduler_type", "constant"]
    arguments += ["--per_device_train_batch_size", "8", "--validation_split_percentage", "20", "--save_strategy", "no"]
    convert_bert_to_fastformer.main([*arguments, "--use_cpu", "--disable_tqdm", "true"])

    model = AutoModelForSequenceClassification.from_pretrained(output)
    teacher = AutoModelForSequenceClassification.from_pretrained(classifier_folder)
    assert isinstance(model, FastformerForSequenceClassification) and model.config.id2label == LABELS
    new_texts = [text for text, _ in topic_texts(1, 48)]
    batch = AutoTokenizer.from_pretrained(output)(new_texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = teacher(**batch).logits.argmax(-1)
        ours = model(**batch).logits.argmax(-1)
    assert theirs.bincount(minlength=3).min() >= 8  # every label predicted: agreement is no constant's
    agreement = (ours == theirs).float().mean().item()
    assert agreement >= 0.85, agreement
    report = json.loads((output / "conversion.json").read_text())
    assert report["task"] == "classification"
    end_to_end = report["distillation"]["stages"]["end_to_end"]
    assert (end_to_end["matched"], end_to_end["logit_weight"], end_to_end["temperature"]) == ("last", 1.0, 2.0)
    assert report["distillation"]["before"]["agreement"] < end_to_end["after"]["agreement"]
    card = " ".join((output / "README.md").read_text().split())
    assert "base_model: someone/tiny-bert-classifier" in card and "pipeline_tag: text-classification" in card
    assert "and its logits (KL divergence at temperature 2.0, weight 1.0) end to end" in card
    assert "3 labels (science, sport, daily life)" in card and "| agreement |" in card
    assert "the first token ([CLS]) keeps the source's softmax attention over every token (4 heads" in card
    assert pipeline("text-classification", model=str(output))(TEXTS[2])[0]["label"] in LABELS.values()


@pytest.mark.parametrize(
    "content, flags, message",
    [
        ("", [], "--distill_file .*texts.jsonl is empty"),
        ("\n \n", [], "--distill_file .*texts.jsonl is empty"),
        (
            '{"text": "one text"}\n',
            [],
            "--distill_file .* has 1 texts in --text_column 'text'; the distillation needs 2",
        ),
        ('{"body": "a text"}\n' * 4, [], r"--text_column 'text' is not a column of --distill_file; it has \['body'\]"),
        ('{"text": "a text"}\n' * 4, ["--label_column", "label"], "--label_column 'label' is not a column"),
        (
            '{"text": "a", "label": "nope"}\n' * 4,
            ["--label_column", "label"],
            r"--label_column 'label' holds \['nope'\]",
        ),
        ('{"text": "a text"}\n' * 4, ["--temperature", "0"], "--temperature must be positive"),
        ('{"text": "a text"}\n' * 4, ["--mask_probability", "1"], "--mask_probability must be at least 0 and below 1"),
    ],
    ids=["empty", "blank", "one-text", "no-text-column", "no-label-column", "unknown-label", "temperature", "mask"],
)
def test_script_names_the_argument_of_bad_distillation_input(classifier_folder, tmp_path, content, flags, message):
    texts = tmp_path / "texts.jsonl"
    texts.write_text(content)
    arguments = ["--model_name_or_path", str(classifier_folder), "--output_dir", str(tmp_path / "o")]
    with pytest.raises(SystemExit, match=message):
        convert_bert_to_fastformer.main([*arguments, "--distill_file", str(texts), "--max_seq_length", "16", *flags])


def test_masking_collator_masks_real_tokens_but_the_special_ones(tokenizer):
    """--mask_probability's batches: the padded batch with some real, non-special tokens (about the share asked)
    replaced by the mask token, the rest (the labels too) as padding alone gives them."""
    torch.manual_seed(0)
    features = [{**tokenizer(text), "labels": index} for index, text in enumerate(TEXTS * 4)]
    plain = DataCollatorWithPadding(tokenizer)(features)
    batch = convert_bert_to_fastformer.MaskingCollator(tokenizer, 0.3)(features)
    changed = batch["input_ids"] != plain["input_ids"]
    assert (batch["input_ids"][changed] == tokenizer.mask_token_id).all()
    special = torch.isin(plain["input_ids"], torch.tensor(tokenizer.all_special_ids))
    candidates = plain["attention_mask"].bool() & ~special
    assert not changed[~candidates].any()
    assert 0.2 < changed.sum() / candidates.sum() < 0.4
    assert all(torch.equal(batch[name], plain[name]) for name in ("attention_mask", "labels"))


def test_script_distils_on_masked_batches_with_mask_probability(classifier_folder, tmp_path, monkeypatch):
    """--mask_probability reaches the distillation: every training batch of both stages goes through
    `MaskingCollator` with the share asked, and masks tokens."""
    collated = []
    collate = convert_bert_to_fastformer.MaskingCollator.__call__

    def spy(self, features):
        batch = collate(self, features)
        collated.append((self.probability, (batch["input_ids"] == self.tokenizer.mask_token_id).sum().item()))
        return batch

    monkeypatch.setattr(convert_bert_to_fastformer.MaskingCollator, "__call__", spy)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS * 2) + "\n")
    arguments = ["--model_name_or_path", str(classifier_folder), "--output_dir", str(tmp_path / "o")]
    arguments += ["--distill_file", str(texts), "--max_seq_length", "16", "--mask_probability", "0.5"]
    arguments += ["--max_steps", "1", "--end_to_end_steps", "1", "--per_device_train_batch_size", "4"]
    convert_bert_to_fastformer.main([*arguments, "--save_strategy", "no", "--use_cpu", "--disable_tqdm", "true"])
    assert len(collated) >= 2 and all(probability == 0.5 and masks > 0 for probability, masks in collated)


def test_script_refuses_classifier_flags_for_an_encoder(bert_folder, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    arguments = ["--model_name_or_path", str(bert_folder), "--output_dir", str(tmp_path / "o")]
    arguments += ["--distill_file", str(texts), "--max_seq_length", "16", "--logit_distillation_weight", "1"]
    with pytest.raises(SystemExit, match="--logit_distillation_weight and --label_column are a classifier's"):
        convert_bert_to_fastformer.main(arguments)


def test_script_learns_the_labels_where_given(classifier_folder, tmp_path, monkeypatch):
    """--label_column: label names or ids, null where a text has none (-100, which the cross-entropy ignores)."""
    rows = [
        {"text": text, "label": [LABELS[label], label, None][index % 3]}
        for index, (text, label) in enumerate(topic_texts(3, 24))
    ]
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    trained = []
    transfer = convert_bert_to_fastformer.transfer_attention

    def recording(student, teacher, stage, train_dataset, *args, **kwargs):
        trained.extend(train_dataset["labels"])
        return transfer(student, teacher, stage, train_dataset, *args, **kwargs)

    monkeypatch.setattr(convert_bert_to_fastformer, "transfer_attention", recording)
    output = tmp_path / "converted"
    arguments = ["--model_name_or_path", str(classifier_folder), "--output_dir", str(output)]
    arguments += ["--distill_file", str(texts), "--label_column", "label", "--max_seq_length", "16"]
    arguments += ["--max_steps", "0", "--end_to_end_steps", "2", "--save_strategy", "no"]
    convert_bert_to_fastformer.main([*arguments, "--use_cpu", "--disable_tqdm", "true"])
    assert len(trained) == 23 and set(trained) == {0, 1, 2, -100} and trained.count(-100) in (7, 8)
    end_to_end = json.loads((output / "conversion.json").read_text())["distillation"]["stages"]["end_to_end"]
    assert end_to_end["label_column"] == "label"
    assert "cross-entropy on the labels of `label`" in " ".join((output / "README.md").read_text().split())
