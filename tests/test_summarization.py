"""fastformer/summarization.py: a frozen encoder stays fixed (its word embeddings too), and its output, computed
once per source by CachedEncoderStates, gives the training loss and the generated tokens of the end-to-end model;
pseudo-summaries of unlabeled text (scripts/make_pseudo_summaries.py) never use a held-out article."""

import json

import datasets
import numpy
import pytest
import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    DataCollatorForSeq2Seq,
    EncoderDecoderConfig,
    EncoderDecoderModel,
    LogitsProcessorList,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from fastformer import FastformerForConditionalGeneration
from fastformer.summarization import (
    CachedEncoderStates,
    ContentWordEndLogitsProcessor,
    NoRepeatContentWordLogitsProcessor,
    SourceSpanLogitsProcessor,
    WholeWordLogitsProcessor,
    choose_k,
    clean_source,
    freeze_encoder,
    headline_quality,
    headline_style,
    headline_words,
    keyword_headline,
    lead_words,
    length_window,
    pseudo_summary,
    pseudo_summary_pairs,
)
from scripts import make_pseudo_summaries
from tests.in_process import run_in_process

VOCAB, PAD, START, EOS = 61, 0, 1, 2


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return lambda **overrides: tiny_config(
        **{
            **dict(
                vocab_size=VOCAB,
                pad_token_id=PAD,
                bos_token_id=START,
                decoder_start_token_id=START,
                eos_token_id=EOS,
                hidden_dropout_prob=0.1,
            ),
            **overrides,
        }
    )


class Tokenizer:
    """What DataCollatorForSeq2Seq reads of a tokenizer: the padding of token ids and labels."""

    pad_token_id, padding_side = PAD, "right"

    def pad(self, features, return_tensors="pt", **kwargs):
        length = max(len(feature["input_ids"]) for feature in features)
        ids = [feature["input_ids"] + [PAD] * (length - len(feature["input_ids"])) for feature in features]
        mask = [[1] * len(feature["input_ids"]) + [0] * (length - len(feature["input_ids"])) for feature in features]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def articles(count=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 12, (count,), generator=generator).tolist()
    return [
        {
            "input_ids": torch.randint(3, VOCAB, (n,), generator=generator).tolist(),
            "labels": torch.randint(3, VOCAB, (4,), generator=generator).tolist() + [EOS],
        }
        for n in lengths
    ]


def collators(model):
    plain = DataCollatorForSeq2Seq(Tokenizer(), model=model, label_pad_token_id=-100)
    return plain, CachedEncoderStates(plain, model)


def test_cached_states_give_the_loss_of_the_end_to_end_forward_with_an_eval_mode_encoder(build):
    model = build(FastformerForConditionalGeneration, share_layers=False)
    freeze_encoder(model)
    plain, cached = collators(model)
    batch = articles()  # lengths differ: padding in every batch
    with torch.no_grad():
        end_to_end = model(**plain(batch)).loss
        model.get_decoder().train()  # a training step's decoder; the cache computes the encoder in eval mode
        torch.manual_seed(3)
        with_cache = model(**cached(batch)).loss
        model.get_encoder().eval()
        torch.manual_seed(3)
        decoder_only_dropout = model(**plain(batch)).loss
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**cached(batch)).loss, end_to_end, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(with_cache, decoder_only_dropout, rtol=1e-6, atol=1e-6)
    assert len(cached.states) == len(batch)  # one entry per source, real tokens only
    assert [tuple(state.shape) for state in cached.states.values()] == [(len(a["input_ids"]), 32) for a in batch]


def test_sources_encoded_up_front_in_sorted_batches_get_the_states_of_collated_batches(build):
    model = build(FastformerForConditionalGeneration, share_layers=False)
    freeze_encoder(model)
    batch = articles(count=7, seed=1)
    plain, lazy = collators(model)
    sources = [article["input_ids"] for article in batch]
    up_front = CachedEncoderStates(plain, model, sources + sources[:2], batch_size=3)  # a repeat is encoded once
    model.get_encoder().train()
    expected, found = lazy(batch), up_front(batch[2:5])  # the first call encodes all 7, in sorted batches of 3
    assert up_front.states.keys() == lazy.states.keys() and not up_front.sources
    for key, states in lazy.states.items():
        torch.testing.assert_close(up_front.states[key], states, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        found["encoder_outputs"].last_hidden_state, lazy(batch[2:5])["encoder_outputs"].last_hidden_state
    )
    assert expected["encoder_outputs"].last_hidden_state.shape[:2] == expected["input_ids"].shape
    assert model.get_encoder().training  # the encoder's mode is as it was


def test_cached_states_serve_bert2bert_alike():
    """The same collator and freezing for transformers' EncoderDecoderModel (the BERT2BERT rows)."""
    bert = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(**bert), BertConfig(**bert, is_decoder=True, add_cross_attention=True)
    )
    config.update(dict(pad_token_id=PAD, decoder_start_token_id=START, eos_token_id=EOS))
    torch.manual_seed(0)
    model = EncoderDecoderModel(config).eval()
    freeze_encoder(model)
    assert not any(parameter.requires_grad for parameter in model.encoder.parameters())
    plain, cached = collators(model)
    batch = articles()
    with torch.no_grad():
        torch.testing.assert_close(model(**cached(batch)).loss, model(**plain(batch)).loss, rtol=1e-6, atol=1e-6)


def test_freezing_unties_the_embeddings_and_training_leaves_every_encoder_parameter_as_it_was(build, tmp_path):
    model = build(FastformerForConditionalGeneration).train()
    assert model.get_input_embeddings().weight is model.lm_head.weight  # one matrix, before freezing
    freeze_encoder(model)
    assert model.config.tie_encoder_embeddings is False
    assert model.get_input_embeddings().weight is not model.lm_head.weight
    assert "model.encoder.embeddings.word_embeddings.weight" not in model.all_tied_weights_keys.values()
    assert model.get_decoder().embeddings.word_embeddings.weight is model.lm_head.weight  # the decoder's stay tied
    encoder = {name: p.clone() for name, p in model.get_encoder().named_parameters()}
    head = model.lm_head.weight.clone()
    _, cached = collators(model)
    train = datasets.Dataset.from_list(articles(8))
    args = Seq2SeqTrainingArguments(
        tmp_path / "run",
        use_cpu=True,
        per_device_train_batch_size=4,
        num_train_epochs=3,
        learning_rate=1e-2,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    Seq2SeqTrainer(model=model, args=args, train_dataset=train, data_collator=cached).train()
    for name, parameter in model.get_encoder().named_parameters():
        assert torch.equal(parameter, encoder[name]), name
    assert not torch.equal(model.lm_head.weight, head)
    assert len(cached.states) == 8  # each source encoded once in 3 epochs
    model.save_pretrained(tmp_path / "saved")  # reloaded, the encoder keeps its matrix and the decoder its own
    reloaded = FastformerForConditionalGeneration.from_pretrained(tmp_path / "saved")
    assert torch.equal(reloaded.get_input_embeddings().weight, encoder["embeddings.word_embeddings.weight"])
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)
    assert reloaded.get_decoder().embeddings.word_embeddings.weight is reloaded.lm_head.weight


def test_the_encoders_top_layers_can_train_while_the_rest_stays_frozen(build):
    model = build(FastformerForConditionalGeneration, share_layers=False, num_hidden_layers=3).train()
    freeze_encoder(model, train_top_layers=1)
    encoder = model.get_encoder()
    trainable = {name for name, p in encoder.named_parameters() if p.requires_grad}
    assert trainable and all(name.startswith("layers.2.") for name in trainable)
    assert {name for name, _ in encoder.layers[2].named_parameters()} == {
        name[len("layers.2.") :] for name in trainable
    }
    before = {name: p.clone() for name, p in encoder.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    plain, _ = collators(model)
    for _ in range(2):
        model(**plain(articles())).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, parameter in encoder.named_parameters():
        assert torch.equal(parameter, before[name]) != (name in trainable), name
    with pytest.raises(ValueError, match="between 0 and the encoder's 3 layers"):
        freeze_encoder(build(FastformerForConditionalGeneration, share_layers=False, num_hidden_layers=3), 4)
    with pytest.raises(ValueError, match="shared layers"):
        freeze_encoder(build(FastformerForConditionalGeneration, share_layers=True, num_hidden_layers=3), 1)


def test_generation_from_cached_states_gives_the_end_to_end_tokens(build):
    model = build(FastformerForConditionalGeneration, initializer_range=0.2)
    freeze_encoder(model)
    _, cached = collators(model)
    batch = articles(seed=1)
    with torch.no_grad():
        inputs = {key: value for key, value in cached(batch).items() if key not in ("labels", "decoder_input_ids")}
        expected = model.generate(**{key: inputs[key] for key in ("input_ids", "attention_mask")}, max_new_tokens=8)
        assert torch.equal(model.generate(**inputs, max_new_tokens=8, num_beams=1), expected)
        beams = model.generate(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=3, max_new_tokens=8
        )
        assert torch.equal(model.generate(**inputs, max_new_tokens=8, num_beams=3), beams)


def test_trainer_predicts_from_cached_states_with_beams_as_end_to_end(build, tmp_path):
    """run_summarization.py's trainer generates with beams and computes the loss from one cached batch: generate()
    expands given encoder_outputs in place, which broke the loss forward after it (batch 6 against 18 rows)."""
    from scripts.run_summarization import SummarizationTrainer  # noqa: PLC0415

    model = build(FastformerForConditionalGeneration, initializer_range=0.2).eval()
    freeze_encoder(model)
    plain, cached = collators(model)
    test = datasets.Dataset.from_list(articles(6, seed=2))
    args = Seq2SeqTrainingArguments(
        tmp_path / "run",
        use_cpu=True,
        per_device_eval_batch_size=6,
        predict_with_generate=True,
        generation_num_beams=3,
        generation_max_length=8,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    found = [
        SummarizationTrainer(model=model, args=args, data_collator=collator).predict(test)
        for collator in (plain, cached)
    ]
    assert numpy.array_equal(found[1].predictions, found[0].predictions)
    assert found[1].metrics["test_loss"] == pytest.approx(found[0].metrics["test_loss"], rel=1e-6)


def test_freezing_refuses_an_encoder_that_shares_with_the_decoder_and_freezes_nothing(build):
    model = build(FastformerForConditionalGeneration)
    model.get_decoder().layers[0].feed_forward = model.get_encoder().layers[0].feed_forward  # shared by hand
    with pytest.raises(ValueError, match="are also the decoder's: a frozen encoder would still change"):
        freeze_encoder(model)
    bart = BartForConditionalGeneration(
        BartConfig(
            vocab_size=VOCAB,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
        )
    )
    with pytest.raises(ValueError, match=r"The encoder's embed_tokens.weight are also the decoder's"):
        freeze_encoder(bart)  # its shared embeddings: its checkpoints tie them again on loading
    assert all(parameter.requires_grad for parameter in bart.parameters())  # refused before freezing any


def test_pseudo_summaries_are_the_lead_or_the_most_salient_sentence_of_the_rest():
    text = (
        "The council approved the new bridge on Monday. Work starts in May. The U.S. firm that won "
        "the bid builds bridges. The new bridge crosses the river at the old ferry."
    )
    lead = pseudo_summary(text, "lead")
    assert lead == {
        "summary": "The council approved the new bridge on Monday.",
        "document": text.removeprefix("The council approved the new bridge on Monday. "),
    }
    salient = pseudo_summary(text, "salient")  # the sentence sharing most words with the others
    assert salient["summary"] == "The new bridge crosses the river at the old ferry."
    assert salient["document"] == text.removesuffix(" The new bridge crosses the river at the old ferry.")
    words = [f"w{index}" for index in range(20)]  # no sentence ends (the 20 Newsgroups texts): the first words
    assert pseudo_summary(" ".join(words), "salient", lead_words=5) == {
        "summary": " ".join(words[:5]),
        "document": " ".join(words[5:]),
    }
    assert pseudo_summary("Too short.") is None


def test_pseudo_summaries_can_keep_their_gap_cut_to_headline_length():
    text = "The council approved the new bridge on Monday after a long debate. Work starts in May."
    pair = pseudo_summary(text, "lead", keep_gap=True, summary_words=6)
    assert pair == {"summary": "The council approved the new bridge", "document": text}
    assert pseudo_summary("no sentence ends in this lowercased text at all", lead_words=None) is None


@pytest.mark.parametrize(
    ("text", "clean"),
    [
        ("MOSCOW, February 7. /TASS/. Russian athletes won 12 medals.", "Russian athletes won 12 medals."),
        ("ST. PETERSBURG, March 3. /TASS/. A text.", "A text."),
        ("Geneva, Switzerland - Talks resumed.", "Talks resumed."),
        ("Glasgow, Scotland --If the UK government", "If the UK government"),
        ("LOS ANGELES (Variety.com) - A film.", "A film."),
        ("(CNN) - A report.", "A report."),
        (
            "Kim said. Send Facebook Twitter Google+ Whatsapp Tumblr linkedin stumble Digg reddit Newsvine "
            "Permalink http://dw.com/p/2YSTy The rest.",
            "Kim said. The rest.",
        ),
        ("Seoul, South Korea-- The movement grew.", "The movement grew."),
        # no dateline: as it is
        ("President Donald Trump took aim at the Freedom Caucus - a group.", None),
        ("Rep. Steve King, R-Iowa, says the base would leave.", None),
        ("However, Microsoft -- which owns GitHub -- said it would.", None),
        ("Toronto, Ontario-based Shopify said.", None),
        ("Apple (AAPL) - Shares rose.", None),
        ("John Smith, Jane Doe - two teachers - were hurt.", None),
        ("Anti-abortion groups rallied, organizers said.", None),
        ("Gladbach 0-1 Bayern (Muller 63') Second-placed Leipzig lost.", None),
    ],
)
def test_clean_source_strips_datelines_and_share_bars_only(text, clean):
    assert clean_source(text) == (text if clean is None else clean)


def test_headline_words_are_the_words_rouge_reads():
    # the uncased tokenizer decodes "Russia's (Page 24)" as "russia ' s ( page 24 )": the same words for ROUGE
    assert (
        headline_words("russia ' s ( page 24 )")
        == headline_words("Russia's (Page 24)")
        == ["russia", "s", "page", "24"]
    )
    assert headline_words("U.S. news") == ["u", "s", "news"] and headline_words("") == []


def test_length_window_bounds_generation_by_the_targets_lengths_in_tokens(tokenizer):
    """Targets of 1 to 20 tokens: with the end of sequence 2 to 21, whose 5th and 95th percentiles are 2.95 and
    20.05; the minimum rounds down, the maximum up and counts the decoder start."""
    targets = [" ".join(["news"] * length) for length in range(1, 21)]
    assert length_window(tokenizer, targets) == {"min_target_length": 2, "generation_max_length": 22}
    assert length_window(tokenizer, targets, (0, 100)) == {"min_target_length": 2, "generation_max_length": 22}
    assert length_window(tokenizer, targets, (50, 50)) == {"min_target_length": 11, "generation_max_length": 13}


def test_headline_quality_counts_what_rouge_does_not_see():
    documents = ["Russia hosts the winter games in Sochi.", "A plane crashed in Nepal.", "Talks in Geneva."] * 2
    documents.append("Heart disease rates fell.")
    predictions = [
        "russia ' s winter winter games",  # a content word twice ("s" is no content word)
        "plane crashes in nepal",  # "crashes" and the article's "crashed" are one stem, as ROUGE counts them
        "in brief",  # shared by 3 articles
        "in brief",
        "in brief",
        "",
        "heart disease : hearts fall",  # a stem twice; "fall" is not the article's "fell"
    ]
    quality = headline_quality(predictions, documents)
    assert quality["repeated"] == pytest.approx(200 / 7)
    assert quality["shared"] == pytest.approx(300 / 7)
    assert quality["empty"] == pytest.approx(100 / 7)
    assert quality["degenerate"] == pytest.approx(600 / 7)
    # content words not in the article: brief three times and fall; words: those and the "s" of "russia ' s"
    assert quality["invented_per_headline"] == pytest.approx(4 / 7)
    assert quality["words_not_in_article"] == pytest.approx(100 * 5 / 19)  # of 5 + 4 + 2 + 2 + 2 + 4 words
    # tokens that are no content words: "'" and "s"; "in"; "in" three times; ":" (7 of 6 + 4 + 6 + 0 + 5 tokens)
    assert quality["filler"] == pytest.approx(100 * 7 / 21)
    keys = ("repeated", "shared", "empty", "degenerate", "filler")
    assert headline_quality(predictions) == {key: quality[key] for key in keys}
    with pytest.raises(ValueError, match="2 predictions for 1 documents"):
        headline_quality(["a", "b"], ["c"])


def test_headline_quality_finds_non_words_and_headlines_at_the_forced_minimum_length():
    """A non-word is in neither the article nor the training text (word pieces spliced together); the share at the
    minimum length compares each headline's generated token count with the forced minimum."""
    documents = ["Flynn met the Russian ambassador.", "Floods hit the coast.", "Markets rallied on Friday."]
    predictions = ["flynnner met russia", "floods hit coast", "markets rally friday"]
    vocabulary = {"russia", "rally"}  # the training text's words: "russia" and "rally" are words
    quality = headline_quality(predictions, documents, vocabulary=vocabulary, token_counts=[7, 9, 7], min_tokens=7)
    assert quality["non_word"] == pytest.approx(100 / 3)  # "flynnner" only
    assert quality["at_min_length"] == pytest.approx(200 / 3)
    assert "non_word" not in headline_quality(predictions, documents)
    assert "at_min_length" not in headline_quality(predictions, token_counts=[7, 9, 7])


def test_baselines_lead_k_and_keywords_in_article_order():
    article = "Trump advisers met Russia's ambassador. The ambassador met Trump twice, advisers said; Russia denied it."
    assert lead_words(article, 5) == "trump advisers met russia s"  # words as ROUGE reads them
    # counts by stem: trump 2, advis(ers) 2, met 2, russia 2, ambassador 2, ...; ties go to the word seen first
    assert keyword_headline(article, 3) == "trump advisers met"
    assert keyword_headline(article, 5) == "trump advisers met russia ambassador"
    assert keyword_headline("Cuts and more cuts: the cut deepens.", 2) == "cuts deepens"  # "cut" is the stem of "cuts"
    references = ["trump advisers met", "floods hit the coast"]
    documents = [article, "Floods hit the coast on Monday and closed roads."]
    k, grid = choose_k(lead_words, documents, references, ks=range(1, 6))
    assert set(grid) == {1, 2, 3, 4, 5} and k == max(grid, key=lambda k: grid[k]["rouge1"]) and k in (3, 4)


@pytest.mark.parametrize(
    "text, styled",
    [
        ("Pakistan has extended a deadline for the refugees", "Pakistan extended deadline for refugees"),
        (
            "three people were killed and lee has been placed under arrest",
            "three people killed and lee placed under arrest",
        ),
        ("man was taken to hospital", "man taken to hospital"),  # any participle after a passive's auxiliary
        ("china has taken steps", "china has taken steps"),  # "taken" is no simple past: "has" stays
        ("hawaii has become the first state", "hawaii has become first state"),
        ("he has a need", "he has need"),  # "has" before no participle, "need" is none
        ("garda is to brief cabinet", "garda to brief cabinet"),
        ("Will Smith will visit the UK", "Will Smith to visit UK"),  # a capitalised "Will" is a name
        ("The man was killed, police said", "Man killed, police said"),  # punctuation attached; the capital moves
        ("conservative party has been fined?", "conservative party fined?"),
        ("blogger who was jailed twice", "blogger who was jailed twice"),  # a relative clause keeps its auxiliary
        ("he could have signed", "he could have signed"),  # a perfect's "have" after a modal or "to" stays
        ("theresa may has kicked off the process", "theresa may kicked off process"),  # no modal before "has"
        ("is said to have paid", "said to have paid"),
        ("if they were to win", "if they were to win"),  # only "is to" and "are to" are "to"
        ("the, a", "the,"),  # a word with punctuation attached is never left out
        ("ryabkov will have a meeting", "ryabkov to have meeting"),
        ("trump will not go", "trump will not go"),  # "will" before a function word stays
        ("democrats said they will vote", "democrats said they will vote"),  # after a pronoun, a relative, "when"
        ("He will step down", "He will step down"),
        ('colvin. " we will allege', 'colvin. " we will allege'),
        ("there will be a vote", "there will be vote"),
        ("a scheme that will help", "scheme that will help"),
        ("the man who will lead", "man who will lead"),
        ("when will trump visit", "when will trump visit"),
        ("will trump visit?", "will trump visit?"),  # a question
        ("chris christie ( r ) will lead", "chris christie ( r ) to lead"),  # after a mark, not at the start
        ("the rate will likely fall", "rate will likely fall"),  # before an adverb of likelihood
        ("the union will soon hold talks", "union to soon hold talks"),
        ("acaba will fly to the station", "acaba to fly to station"),
        ("the will of the people", "will of people"),
        ("russia ' s   ambassador", "russia ' s ambassador"),  # tokenizer-decoded text; whitespace made single
        # the day of the news, with the words that go with it ("on", "last", "night"), before a function word or the end
        ("ministers met in tokyo on Monday", "ministers met in tokyo"),
        ("comey said wednesday he plans to serve", "comey said he plans to serve"),
        ("an address on tuesday night has drawn praise", "address has drawn praise"),
        ("a wall released late friday", "wall released"),
        ("four tornadoes touched down today", "four tornadoes touched down"),
        ("trump on thursday renewed his call", "trump renewed his call"),  # "on" makes it a date before any word
        ("a vote friday, police said", "vote friday, police said"),  # punctuation attached: never left out
        ("the sunday times reported", "sunday times reported"),  # a day before a content word names something
        ("the good friday agreement", "good friday agreement"),
        ("crowds marked ash wednesday at galway", "crowds marked ash wednesday at galway"),  # a day's name
        ("he told usa today on monday", "he told usa today"),
        ("monday's morning email", "monday's morning email"),
        ("today is the day", "today is day"),  # the first word, not "on" before it: a subject
        # a day that is what a phrase is about, not when: after a preposition, joined to another day, a subject
        ("the deadline is friday", "deadline is friday"),
        ("a vote set for friday", "vote set for friday"),
        ("polls closed until monday", "polls closed until monday"),
        ("talks from monday to friday", "talks from monday to friday"),
        ("he said friday was the deadline", "he said friday was deadline"),
        ("they met on monday and tuesday", "they met on monday and tuesday"),
        ("held on the last sunday of the month", "held on last sunday of month"),
        ("minister cavusoglu late wednesday threatened", "minister cavusoglu threatened"),
        ("he was arrested yesterday and taken to court", "he arrested and taken to court"),
        ("i had a dead leg one sunday morning and", "i had dead leg one sunday morning and"),
        ("they met on this sunday", "they met"),
        ("met on tuesday night, police said", "met on tuesday night, police said"),  # "night," ends a clause
        ("the mail on sunday said", "mail on sunday said"),
        ("remembering bloody sunday", "remembering bloody sunday"),
        ("they on monday will vote", "they will vote"),  # "will" after the pronoun before the day
        ("on monday", "on monday"),  # never the whole text
        ("the vote is on monday", "vote is on monday"),
        ("On Monday the president spoke", "President spoke"),
        ("", ""),
    ],
)
def test_headline_style_leaves_out_what_headlines_leave_out(text, styled):
    assert headline_style(text) == styled


@pytest.fixture(scope="module")
def no_repeat_content_words(tokenizer):
    return NoRepeatContentWordLogitsProcessor(tokenizer)


def test_no_repeat_content_words_bans_the_stems_of_generated_content_words_only(tokenizer, no_repeat_content_words):
    generated = tokenizer("russia's winter olympics flynner: the cuts")["input_ids"][:-1]  # [CLS] ... no [SEP]
    assert tokenizer.convert_ids_to_tokens(generated)[6:8] == ["flynn", "##er"]
    rows = torch.tensor([generated, [tokenizer.cls_token_id] * len(generated)])
    scores = torch.randn(2, len(tokenizer) + 6)  # a model vocabulary larger than the tokenizer's
    processed = no_repeat_content_words(rows, scores.clone())
    banned = {token for token in tokenizer.convert_ids_to_tokens(torch.isinf(processed[0]).nonzero().flatten())}
    # each content word's stem, in every form that is one token: "cut cuts cutting", "olympic olympics"
    assert {"russia", "winter", "winters", "olympics", "olympic", "flynn", "cut", "cuts", "cutting"} <= banned
    # function words, punctuation, word pieces, one-letter words, special tokens and other stems stay
    kept = ["the", "'", ":", "s", "##er", "##s", "russian", "winner", "[SEP]", "[CLS]"]
    assert not banned & set(kept) and all(len(word) > 1 for word in banned)
    assert {"olympian", "russians"}.isdisjoint(banned)
    assert torch.equal(processed[~torch.isinf(processed)], scores[~torch.isinf(processed)])
    assert not torch.isinf(processed[1]).any() and not torch.isinf(processed[0, len(tokenizer) :]).any()


def test_no_repeat_content_words_reads_byte_level_and_sentencepiece_word_starts():
    from tokenizers import Tokenizer as Vocabulary  # noqa: PLC0415
    from tokenizers.models import WordLevel  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    for mark in ("\u0120", "\u2581"):
        words = ["<pad>", f"{mark}cut", f"{mark}cuts", "cuts", f"{mark}the", f"{mark}report"]
        vocabulary = Vocabulary(WordLevel({word: index for index, word in enumerate(words)}, unk_token="<pad>"))
        processor = NoRepeatContentWordLogitsProcessor(PreTrainedTokenizerFast(tokenizer_object=vocabulary))
        processed = processor(torch.tensor([[1, 4, 4]]), torch.zeros(1, len(words)))
        # "cuts" without the mark continues a word; "the" repeats
        assert torch.isinf(processed[0]).tolist() == [False, True, True, False, False, False]


@pytest.mark.parametrize("family", ["fastformer", "bart"])
def test_generate_with_no_repeat_content_words_drops_exactly_the_banned_scores(
    tokenizer, tokenizer_fields, tiny_config, no_repeat_content_words, family
):
    """With the processor a random model's greedy output repeats no content word, and each step's scores are the
    model's logits with exactly the banned tokens at -inf: ours and BART alike."""
    torch.manual_seed(1)  # a model that repeats words without the processor
    if family == "bart":
        small = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32)
        config = BartConfig(**small, encoder_attention_heads=2, decoder_attention_heads=2, **tokenizer_fields)
        config.forced_eos_token_id = None
        model = BartForConditionalGeneration(config).eval()
    else:
        model = FastformerForConditionalGeneration(tiny_config(**tokenizer_fields, num_decoder_layers=1)).eval()
    inputs = tokenizer(["plane crashes in nepal", "winter games in russia"], padding=True, return_tensors="pt")
    settings = dict(max_new_tokens=24, do_sample=False, return_dict_in_generate=True, output_scores=True)
    plain = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], **settings)
    assert headline_quality(tokenizer.batch_decode(plain.sequences, skip_special_tokens=True))["repeated"] > 0
    processor = LogitsProcessorList([no_repeat_content_words])
    found = model.generate(
        inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        logits_processor=processor,
        **settings,
        output_logits=True,
    )
    assert headline_quality(tokenizer.batch_decode(found.sequences, skip_special_tokens=True))["repeated"] == 0
    for step, (scores, logits) in enumerate(zip(found.scores, found.logits)):
        expected = no_repeat_content_words(found.sequences[:, : step + 1], logits.clone())
        assert torch.equal(scores, expected)


def test_pseudo_summary_pairs_never_take_a_held_out_article(tmp_path):
    held_out = "A test article about the vote. " + "It has more sentences after the first one. " * 6
    copy = "  a TEST article about the vote.  " + held_out[31:250]  # cut shorter, other spaces and case
    texts = [
        "A training article. Its second sentence.",
        held_out,
        copy,
        "A training article. Its second sentence.",
        "Another training text. With more.",
    ]
    pairs = pseudo_summary_pairs(texts, held_out=[held_out])
    assert [pair["summary"] for pair in pairs] == ["A training article.", "Another training text."]
    source = tmp_path / "texts.jsonl"  # the script: files and fields, the held-out ones by content
    source.write_text("".join(json.dumps({"body": text}) + "\n" for text in texts))
    (tmp_path / "test.jsonl").write_text(json.dumps({"document": held_out}) + "\n")
    output = tmp_path / "pseudo.jsonl"
    process = run_in_process(
        [
            "python",
            make_pseudo_summaries.__file__,
            "--output",
            output,
            "--texts",
            f"{source}:body",
            "--held_out",
            f"{tmp_path / 'test.jsonl'}:document",
        ]
    )
    assert process.returncode == 0, process.stderr
    assert [json.loads(line) for line in output.read_text().splitlines()] == pairs


def test_whole_words_lets_pieces_spell_known_words_only(tokenizer):
    """After "flynn" (a known word) no piece splices on ("flynn ##ner"); after "ku" only the pieces towards "kushner"
    come, and nothing else until the word is whole; after punctuation or the start, no continuation piece."""
    processor = WholeWordLogitsProcessor(tokenizer, ["kushner", "flynn", "russia", "met"])
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ("ku", "##sh", "##ner", "flynn", "met", "'")}
    start = tokenizer.cls_token_id

    def allowed(*tokens):
        scores = processor(torch.tensor([[start, *(ids[token] for token in tokens)]]), torch.zeros(1, len(tokenizer)))
        return torch.isfinite(scores[0])

    after_flynn = allowed("flynn")
    assert not after_flynn[ids["##ner"]] and after_flynn[ids["met"]] and after_flynn[tokenizer.sep_token_id]
    after_ku = allowed("ku")
    assert after_ku[ids["##sh"]] and not after_ku[ids["##ner"]]  # "kush..." is a prefix of kushner, "kuner" not
    assert not after_ku[ids["met"]] and not after_ku[tokenizer.sep_token_id]  # "ku" is no word: it must go on
    after_kush = allowed("ku", "##sh")
    assert after_kush[ids["##ner"]] and not after_kush[ids["flynn"]]
    assert allowed("ku", "##sh", "##ner")[ids["met"]]  # whole: anything may follow
    for tokens in ((), ("'",)):  # no word to continue
        assert not allowed(*tokens)[ids["##ner"]] and allowed(*tokens)[ids["flynn"]]


def test_content_word_end_bans_the_end_after_function_words_and_open_punctuation(tokenizer):
    """The end of sequence ([SEP]) is banned after "with", "said", "during", "'", "-" or a possessive ("budget ' s"),
    and allowed after a content word, a word of several pieces, a closing mark, a word "s" after no apostrophe, or
    the decoder's start alone; no other score changes, and in a model vocabulary larger than the tokenizer's, its extra
    ids end freely."""
    processor = ContentWordEndLogitsProcessor(tokenizer, tokenizer.sep_token_id)
    start, end = tokenizer.cls_token_id, tokenizer.sep_token_id
    head = [start, *tokenizer.convert_tokens_to_ids(["iran", "has", "stepped"])]

    def may_end(ids):
        scores = torch.randn(1, len(tokenizer) + 4)
        processed = processor(torch.tensor([ids]), scores.clone())
        others = torch.arange(scores.shape[-1]) != end
        assert torch.equal(processed[:, others], scores[:, others])
        return bool(torch.isfinite(processed[0, end]))

    def after(*tokens):
        return may_end(head + tokenizer.convert_tokens_to_ids(list(tokens)))

    assert not any(after(token) for token in ("with", "said", "the", "during", "'", "-", "(", ","))
    assert not after("budget", "'", "s") and not after("'", "s")
    assert all(after(*tokens) for tokens in (("words",), ("ku", "##sh", "##ner"), (")",), (".",), ("%",)))
    assert after("plan", "s") and after("budget", "'", "s", "cuts")
    assert may_end([start]) and may_end([start, len(tokenizer) + 2])
    with pytest.raises(ValueError, match="pass its `eos_token_id`"):
        ContentWordEndLogitsProcessor(tokenizer, None)


def test_source_span_continues_the_longest_run_found_in_the_rows_source(tokenizer):
    """After "at trump tower" the bonus goes to what follows it in the article ("in"), not to what follows "trump
    tower" elsewhere ("stays"); a run the article does not have gets none; the rows of each source's beams read that
    source; where the article's clause ends (",") the end of sequence gets the bonus too (not without an
    `eos_token_id`); padding and special tokens ([UNK]) end a run; nothing else changes."""
    end = tokenizer.sep_token_id

    def ids(text):
        return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))

    first = ids("flynn met kislyak at trump tower in december , aides said trump tower stays open")
    # the second article: "the senate" then [UNK] "voted", and a masked (padding) "today" in a non-special token
    second = [*ids("the senate"), tokenizer.unk_token_id, *ids("voted today")]
    width = max(len(first), len(second))
    source = torch.tensor([first + [0] * (width - len(first)), second + [0] * (width - len(second))])
    mask = torch.tensor(
        [[1] * len(first) + [0] * (width - len(first)), [1] * (len(second) - 1) + [0] * (width - len(second) + 1)]
    )
    source[1, len(second) :] = ids("today")[0]  # padding that is a word: only the mask says it is none
    processor = SourceSpanLogitsProcessor(tokenizer, 1.5, eos_token_id=end)
    processor.set_source(source, mask)

    # 2 sources x 3 beams, each the decoder's start and three tokens
    prefixes = ["at trump tower", "tower in december", "said open trump", "at the senate", "senate voted today"]
    rows = torch.tensor([[tokenizer.cls_token_id, *ids(text)] for text in [*prefixes, "at trump tower"]])
    scores = torch.randn(6, len(tokenizer) + 3)
    bonus = processor(rows, scores.clone()) - scores
    given = [set(torch.nonzero(row).flatten().tolist()) for row in bonus]
    assert given[0] == set(ids("in"))  # not "stays"
    assert given[1] == {*ids(","), end}  # the article's clause ends after "in december"
    assert given[2] == set()  # "open trump" is not in the article, and one token is no run
    assert given[3] == set()  # "the senate" is followed by [UNK], which is no token of the article
    assert given[4] == set()  # "senate voted" is no run across the [UNK], and "voted today" crosses the padding
    assert given[5] == set()  # beams of the second source read the second source
    assert torch.allclose(bonus[bonus != 0], torch.tensor(1.5))

    without_end = SourceSpanLogitsProcessor(tokenizer, 1.5)
    without_end.set_source(source, mask)
    assert set(torch.nonzero(without_end(rows, scores.clone()) - scores)[:, 1].tolist()) == {*ids("in"), *ids(",")}


def test_source_span_clause_ends_and_copied_punctuation(tokenizer):
    """A point or comma inside a number ("64.6", "4,608") or after a one-letter word ("u.s.") ends no clause: no end
    bonus there, as after a clause's own comma, or a point after a word's last one-letter piece ("kislya ##k .").
    With `copied_punctuation`, punctuation comes only after a token it follows in the article: never first, never
    where the article has no such mark ("tower -"), and the rest keeps its score; a model vocabulary narrower than the
    tokenizer's is banned only within it."""
    end = tokenizer.sep_token_id

    def ids(text):
        return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))

    text = "consumption rose 64.6 % to 4,608 , the u.s. said ( reuters ) on trump ' s tower , met kislyak . then"
    source = torch.tensor([ids(text)])
    assert tokenizer.tokenize("kislyak")[-1] == "##k"
    punctuation = ids(". , % ( ) ' - : ?")
    processor = SourceSpanLogitsProcessor(tokenizer, 1.0, eos_token_id=end, copied_punctuation=True)
    processor.set_source(source)
    prefixes = ["rose 64", "to 4", "the u", "to 4,608", "said", "trump", "tower", "met kislyak"]
    rows = [[tokenizer.cls_token_id, *ids(text)] for text in prefixes]
    width = max(map(len, rows))
    rows = torch.tensor([[tokenizer.cls_token_id] * (width - len(row)) + row for row in rows])
    scores = torch.zeros(len(prefixes), len(tokenizer))
    changed = processor(rows, scores.clone())
    given = [set(torch.nonzero(row > 0).flatten().tolist()) for row in changed]
    assert given[0] == set(ids(".")) and given[1] == set(ids(",")) and given[2] == set(ids("."))  # no end bonus
    assert given[3] == {*ids(","), end} and given[7] == {*ids("."), end}  # "4,608 ," and "kislyak ." end clauses
    allowed = [{token for token in punctuation if changed[row, token] > -1} for row in range(len(prefixes))]
    assert allowed[:4] == [set(ids(".")), set(ids(",")), set(ids(".")), set(ids(","))]
    assert allowed[4] == set(ids("("))  # "said (" in the article; not "said ," nor "said -"
    assert allowed[5] == set(ids("'")) and allowed[6] == set(ids(","))  # the possessive's apostrophe; "tower ,"
    assert (changed[6] == -float("inf")).sum() == len(processor.punctuation) - 1
    assert not {end, *ids("trump")} & set(processor.punctuation.tolist())  # the end and words are never banned
    processor.set_source(source)  # a new generate(): its first step
    first = processor(torch.tensor([[tokenizer.cls_token_id]]).expand(len(prefixes), 1), scores.clone())
    assert torch.isinf(first[:, punctuation]).all() and not torch.isinf(first[:, ids("trump")]).any()
    narrow = int(processor.punctuation.max())  # the last punctuation id falls outside the model's vocabulary
    processor.set_source(source)
    first = processor(torch.tensor([[tokenizer.cls_token_id]]), torch.zeros(1, narrow))
    assert torch.isinf(first[0, processor.punctuation[processor.punctuation < narrow]]).all()


def test_source_span_stays_on_the_span_up_to_its_sentence_end(tokenizer):
    """With `stay_on_span`, a row whose last tokens are a run of the article may only go on as the article goes on
    there, or end: no other word, nor the point that ends the article's sentence (a clause's comma may follow); a
    row on no run, and a row whose allowed tokens are all banned already, keep their scores. A point after a title
    ("gov.") ends no clause: no end bonus there, and the span may go on past it."""
    end = tokenizer.sep_token_id

    def ids(text):
        return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))

    source = torch.tensor([ids("the judge ruled that gov. chris christie can go , the court said . then trump spoke")])
    processor = SourceSpanLogitsProcessor(tokenizer, 1.0, eos_token_id=end, stay_on_span=True)
    prefixes = ["judge ruled", "that gov", "can go", "court said", "flood hit"]
    rows = [[tokenizer.cls_token_id, *ids(text)] for text in prefixes]
    assert {len(row) for row in rows} == {3}
    rows, scores = torch.tensor(rows), torch.randn(len(prefixes), len(tokenizer))
    processor.set_source(source)
    changed = processor(rows, scores.clone())
    allowed = [set(torch.isfinite(row).nonzero().flatten().tolist()) for row in changed]
    assert allowed[:4] == [{*ids("that"), end}, {*ids("."), end}, {*ids(","), end}, {end}]
    given = changed - scores
    assert given[0, ids("that")] == 1 and given[1, ids(".")] == 1 and given[1, end] == 0  # "gov ." ends nothing
    assert given[2, end] == given[3, end] == 1  # the article's clause and sentence end there
    torch.testing.assert_close(changed[4], scores[4])  # "flood hit" is on no run of the article
    narrow = scores[:, : ids("that")[0]]  # a model vocabulary without the span's next token: the row stays free
    processor.set_source(source)
    torch.testing.assert_close(processor(rows, narrow.clone())[0], narrow[0])
    scores[0, [*ids("that"), end]] = -float("inf")  # banned already: the row is left as it was
    processor.set_source(source)
    torch.testing.assert_close(processor(rows, scores.clone())[0], scores[0])


def test_source_span_refuses_missing_stale_or_mismatched_sources(tokenizer):
    processor = SourceSpanLogitsProcessor(tokenizer, 1.0)
    rows = torch.tensor([[tokenizer.cls_token_id, 5, 6]] * 6)
    scores = torch.zeros(6, len(tokenizer))
    with pytest.raises(ValueError, match="call set_source"):
        processor(rows, scores)
    processor.set_source(torch.tensor([[7, 8, 9]] * 3))
    processor(rows[:, :2], scores)
    processor(rows, scores)  # the same generate(), one step on
    with pytest.raises(ValueError, match="no new sources for this generate"):
        processor(rows[:, :2], scores)  # a new generate() without set_source()
    processor.set_source(torch.tensor([[7, 8, 9]] * 4))
    with pytest.raises(ValueError, match="6 rows for 4 sources"):
        processor(rows, scores)
    with pytest.raises(ValueError, match="`input_ids` must be a non-empty batch"):
        processor.set_source(torch.tensor([7, 8, 9]))
    with pytest.raises(ValueError, match="min_match <= max_match"):
        SourceSpanLogitsProcessor(tokenizer, 1.0, min_match=3, max_match=2)


def test_content_word_end_reads_byte_level_and_sentencepiece_word_starts():
    from tokenizers import Tokenizer as Vocabulary  # noqa: PLC0415
    from tokenizers.models import WordLevel  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    for mark in ("\u0120", "\u2581"):
        # a "##" token of its own (byte-level vocabularies have one) makes it no WordPiece vocabulary
        words = ["<pad>", f"{mark}with", f"{mark}cut", "with", f"{mark}(", f"{mark}café", "##", "</s>"]
        vocabulary = Vocabulary(WordLevel({word: index for index, word in enumerate(words)}, unk_token="<pad>"))
        processor = ContentWordEndLogitsProcessor(PreTrainedTokenizerFast(tokenizer_object=vocabulary), 7)
        rows = torch.tensor([[0, 2, last] for last in range(1, 6)])
        # after " with" and " (" the end is banned; after " cut", "with" continuing a word ("forthwith"), " café" not
        assert torch.isinf(processor(rows, torch.zeros(5, 8))[:, 7]).tolist() == [True, False, False, True, False]
