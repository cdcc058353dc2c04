"""scripts/headline_decoding.py: the logits processors ban exactly what they say (repeated content words, an end
after an open word, pieces that spell no known word) and keep a copied span going where the article's goes on."""

import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration, LogitsProcessorList

from fastformer import FastformerForConditionalGeneration
from headline_decoding import (
    ContentWordEndLogitsProcessor,
    NoRepeatContentWordLogitsProcessor,
    SourceSpanLogitsProcessor,
    WholeWordLogitsProcessor,
)
from headline_rules import headline_quality


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


def test_whole_words_fit_a_model_vocabulary_narrower_than_the_tokenizers(tokenizer):
    """Logits narrower than the tokenizer (a model of 14,000 ids for its 30,522): the bans of the model's own ids, as
    for the full vocabulary, as the other processors fit theirs; a word that only pieces past the model's ids could
    finish ("met" -> "metふ": "##ふ" is id 30,200) is left free, as one that no piece could finish."""
    processor = WholeWordLogitsProcessor(tokenizer, ["kushner", "flynn", "metふ"])
    start, ku, flynn, met, piece = tokenizer.convert_tokens_to_ids(["[CLS]", "ku", "flynn", "met", "##ふ"])
    rows = torch.tensor([[start, ku], [start, flynn], [start, start], [start, met]])
    full = processor(rows, torch.zeros(4, len(tokenizer)))
    narrow = processor(rows, torch.zeros(4, 14000))
    assert torch.equal(narrow[:3], full[:3, :14000]) and torch.isinf(narrow[:3]).any(dim=1).all()
    allowed = torch.isfinite(full[3]).nonzero().flatten().tolist()
    assert piece >= 14000 and allowed == [piece]  # the full vocabulary: "met" must go on as "metふ"
    continuations = torch.tensor([token.startswith("##") for token in tokenizer.convert_ids_to_tokens(range(14000))])
    assert torch.equal(torch.isinf(narrow[3]), continuations)  # the narrow one: no piece, anything else


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
