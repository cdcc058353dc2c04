"""What summarization with an encoder-decoder needs beside the model: ROUGE scored offline, and what ROUGE does not see
(`headline_quality`: repeated words, one output for many articles, words the article does not have), and a generate()
processor that writes no content word twice (`NoRepeatContentWordLogitsProcessor`); news sources without their
datelines (`clean_source`); the encoder frozen for a decoder-only fine-tune, and its output then computed once per
source (scripts/run_summarization.py and benchmarks/quality use these); pseudo-summaries of unlabeled text for
pretraining the decoder (scripts/make_pseudo_summaries.py)."""

import functools
import re
import string
import unicodedata
from collections import Counter

import numpy as np
import torch
from torch import nn
from transformers import LogitsProcessor
from transformers.modeling_outputs import BaseModelOutput

ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


def encoder_layers(encoder) -> list:
    """The encoder's layers in order: a Fastformer's (one per application: `applied_layers`) or a BERT's."""
    if hasattr(encoder, "applied_layers"):
        return [layer for _, layer in encoder.applied_layers()]
    return list(encoder.encoder.layer)


def untie_encoder_embeddings(model) -> None:
    """Gives a Fastformer encoder-decoder's encoder word embeddings of its own, a copy of the shared matrix, so that
    training the decoder and the LM head (which keep sharing theirs) leaves the encoder's as they are;
    `config.tie_encoder_embeddings` becomes False, is saved with the model, and ties the same way on loading."""
    if not model.config.tie_encoder_embeddings:
        return
    encoder = model.get_encoder()
    shared = encoder.get_input_embeddings()
    own = nn.Embedding(shared.num_embeddings, shared.embedding_dim, padding_idx=shared.padding_idx)
    own.weight = nn.Parameter(shared.weight.detach().clone(), requires_grad=shared.weight.requires_grad)
    encoder.set_input_embeddings(own)
    model.config.tie_encoder_embeddings = False  # the model's tied weights follow it
    model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)


def freeze_encoder(model, train_top_layers: int = 0) -> None:
    """No gradient for any of the encoder's parameters, its word embeddings included: a Fastformer encoder-decoder's
    encoder first gets embeddings of its own (`untie_encoder_embeddings`), so that training the decoder leaves the
    encoder as it was. Refuses a model whose encoder still shares a parameter with the decoder or the LM head.
    `train_top_layers`: the encoder's last layers that still train (refused where they are also lower layers, as
    with a Fastformer's `share_layers`)."""
    if getattr(model.config, "tie_encoder_embeddings", False):
        untie_encoder_embeddings(model)
    shared = {id(parameter) for parameter in model.get_decoder().parameters()}
    shared |= {id(parameter) for parameter in model.get_output_embeddings().parameters()}
    encoder = dict(model.get_encoder().named_parameters())
    also_decoders = [name for name, parameter in encoder.items() if id(parameter) in shared]
    if also_decoders:  # e.g. BART's and T5's shared word embeddings, which their checkpoints tie again on loading
        raise ValueError(
            f"The encoder's {', '.join(also_decoders)} are also the decoder's: a frozen encoder would still change"
        )
    layers = encoder_layers(model.get_encoder())
    if not 0 <= train_top_layers <= len(layers):
        raise ValueError(f"train_top_layers must be between 0 and the encoder's {len(layers)} layers")
    top = layers[len(layers) - train_top_layers :]
    if any(layer in layers[: len(layers) - train_top_layers] for layer in top):
        raise ValueError("The encoder's top layers are also its lower ones (shared layers): they cannot train alone")
    for parameter in encoder.values():
        parameter.requires_grad_(False)
    for layer in top:
        layer.requires_grad_(True)


@torch.no_grad()
def token_state_spread(encoder, input_ids, attention_mask=None, positions: int = 50, **_) -> float:
    """How far apart an encoder keeps its tokens: the mean over features of the last-layer states' standard
    deviation across the first `positions` positions (0: every token alike, as after a collapse: fine-tuning a
    warm-started encoder through a new, random cross-attention does that, docs/RESULTS.md)."""
    states = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return states[:, :positions].std(dim=1).mean().item()


class CachedEncoderStates:
    """Wraps a data collator: every batch also gets `encoder_outputs`, the frozen encoder's output (eval mode, no
    gradient), computed once per distinct source and reused in every epoch, at evaluation and in generate(), so a
    training step costs the decoder only. Only for an encoder that does not change (`freeze_encoder`): the cache
    holds each source's states on the CPU, (real tokens, hidden size) each. The encoder then runs without dropout
    in training too (a frozen encoder run in every step would apply its dropout). For a DataLoader in this
    process (`dataloader_num_workers=0`): a worker process would keep a cache of its own and run the model.
    `sources` (lists of token ids, e.g. every split's `input_ids`) are encoded at the first call, sorted by length
    (`encode_all`), so that the time is counted where the states are first needed."""

    def __init__(self, collator, model, sources=(), batch_size: int = 32):
        self.collator, self.model = collator, model
        self.states = {}  # the real tokens' ids (bytes) -> their encoder states
        self.sources, self.batch_size = list(sources), batch_size

    def __call__(self, features):
        if self.sources:
            sources, self.sources = self.sources, []
            self.encode_all(sources, self.batch_size)
        batch = self.collator(features)
        ids, mask = batch["input_ids"], batch["attention_mask"].to(torch.bool)
        keys = [row[real].numpy().tobytes() for row, real in zip(ids, mask)]
        missing = [index for index, key in enumerate(keys) if key not in self.states]
        if missing:
            self._encode(ids[missing], mask[missing], [keys[index] for index in missing])
        hidden = torch.zeros(*ids.shape, self.states[keys[0]].shape[-1], dtype=self.states[keys[0]].dtype)
        for row, key in enumerate(keys):
            hidden[row, mask[row]] = self.states[key]
        batch["encoder_outputs"] = BaseModelOutput(last_hidden_state=hidden)
        return batch

    def encode_all(self, sources, batch_size: int = 32) -> None:
        """Caches the states of every one of `sources` (lists of token ids) not cached yet, in batches of sources of
        about the same length: the collator's batches come in random order and pad every source to the longest
        (2.4x the real tokens in the bundled headlines' batches of 16 at source 2,048), sorted ones hardly at all.
        The states are the ones a collated batch would get."""
        pending = {}
        for ids in sources:
            ids = torch.tensor(ids, dtype=torch.long)
            pending.setdefault(ids.numpy().tobytes(), ids)
        keys = sorted((key for key in pending if key not in self.states), key=lambda key: len(pending[key]))
        for start in range(0, len(keys), batch_size):
            chunk = keys[start : start + batch_size]
            rows = [pending[key] for key in chunk]
            ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
            mask = torch.nn.utils.rnn.pad_sequence(
                [torch.ones_like(row, dtype=torch.bool) for row in rows], batch_first=True
            )
            self._encode(ids, mask, chunk)

    @torch.no_grad()
    def _encode(self, ids, mask, keys):
        encoder = self.model.get_encoder()
        training = encoder.training
        device = next(encoder.parameters()).device
        try:
            states = encoder.eval()(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state.cpu()
        finally:
            encoder.train(training)
        for row, key in enumerate(keys):
            self.states[key] = states[row, mask[row]]


PSEUDO_SUMMARY_MODES = ("lead", "salient")
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]*[A-Z0-9])")
_PLACE = r"[A-Z][\w.'-]*(?: [A-Z][\w.'-]*){0,3}"
_CAPS = r"[A-Z][A-Z.'-]+(?: [A-Z][A-Z.'-]+)*"  # a place in capitals: "LOS ANGELES", "ST. PETERSBURG"
_DASH = r"(?: ?-{2,3}| [-\u2014\u2013])"  # "--", or a dash after a space (not the hyphen of "R-Iowa")
# what news sources put before their first sentence: "MOSCOW, February 7. /TASS/.", "Geneva, Switzerland - ",
# "LOS ANGELES (Variety.com) - ", "(CNN) -"; the text after a dash must start as a sentence does
DATELINE = re.compile(
    rf"^\s*(?:{_CAPS}, [A-Z][a-z]+ \d{{1,2}}\. /[A-Z]+/\."
    rf"|(?:{_PLACE}(?:, {_PLACE})+|{_CAPS} \([^)]{{1,40}}\)){_DASH} ?(?=[A-Z\"'])"
    rf"|\((?:CNN|AP|AFP|Reuters)\){_DASH}?)\s*"
)
# a share bar copied with the text (Deutsche Welle's articles), and its link
SHARE_BAR = re.compile(
    r"\s*Send Facebook Twitter Google\+ Whatsapp Tumblr linkedin stumble Digg reddit Newsvine Permalink \S*"
)


def clean_source(text: str) -> str:
    """A news article without what is not its text: the dateline before its first sentence (`DATELINE`) and a
    share bar (`SHARE_BAR`); white space as it was otherwise. Text that has neither comes back as it is."""
    return DATELINE.sub("", SHARE_BAR.sub("", text), count=1)


def text_key(text: str) -> str:
    """What identifies a text across copies (one cut shorter, other white space): its first 200 characters of words."""
    return " ".join(text.split())[:200].lower()


def pseudo_summary(
    text: str, mode: str = "lead", lead_words: int | None = 16, keep_gap: bool = False, summary_words: int | None = None
) -> dict | None:
    """A PEGASUS gap-sentence pair (arXiv:1912.08777) from unlabeled `text`: {"document": the text without the gap,
    "summary": the gap}. "lead": the first sentence; "salient": the sentence of highest ROUGE-1 F1 against the rest
    (PEGASUS' Ind-Orig). A text without sentence ends (e.g. lowercased, unpunctuated) gives its first `lead_words`
    words in either mode (None: no pair). `keep_gap`: the document is the whole text, so that the summary can be
    copied from it (PEGASUS' Ind-Orig keeps it in 20% of the pairs); `summary_words`: the summary is cut to its
    first words (headline length). None when one side would be empty."""
    if mode not in PSEUDO_SUMMARY_MODES:
        raise ValueError(f"mode must be one of {PSEUDO_SUMMARY_MODES}, got {mode!r}")
    sentences = [sentence for sentence in SENTENCE_END.split(" ".join(text.split())) if sentence]
    if len(sentences) < 2:
        if lead_words is None:
            return None
        words = text.split()
        sentences = [" ".join(words[:lead_words]), " ".join(words[lead_words:])]
        gap = 0
    elif mode == "lead":
        gap = 0
    else:
        from rouge_score import rouge_scorer  # noqa: PLC0415  (the [train] extra)

        scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
        rest = [" ".join(sentences[:index] + sentences[index + 1 :]) for index in range(len(sentences))]
        scores = [scorer.score(other, sentence)["rouge1"].fmeasure for sentence, other in zip(sentences, rest)]
        gap = int(np.argmax(scores))
    document = " ".join(sentences if keep_gap else sentences[:gap] + sentences[gap + 1 :])
    summary = " ".join(sentences[gap].split()[:summary_words])
    if not document or not summary:
        return None
    return {"document": document, "summary": summary}


def pseudo_summary_pairs(texts, held_out, mode: str = "lead", lead_words: int | None = 16, **options) -> list[dict]:
    """`pseudo_summary` (with `options`) of each of `texts` that is not among `held_out` (texts never to train on: a
    summarization data set's validation and test documents) and not a copy of an earlier one (`text_key`), in
    order."""
    seen = {text_key(text) for text in held_out}
    pairs = []
    for text in texts:
        key = text_key(text)
        if key in seen:
            continue
        seen.add(key)
        pair = pseudo_summary(text, mode, lead_words, **options)
        if pair is not None:
            pairs.append(pair)
    return pairs


@functools.cache
def cached_rouge_scorer():
    """rouge_score's scorer of `ROUGE_TYPES`, with its Porter stemmer, as the `evaluate` rouge metric builds it."""
    try:
        from rouge_score import rouge_scorer  # noqa: PLC0415  (the [train] extra)
    except ImportError as error:
        raise ImportError("ROUGE needs rouge_score: pip install 'fastformer[train]'") from error
    return rouge_scorer.RougeScorer(ROUGE_TYPES, use_stemmer=True)


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """ROUGE F-measures x 100, aggregated as the `evaluate` rouge metric does, without the Hub; the bootstrap
    resampling is seeded, so the same texts always give the same numbers."""
    scorer = cached_rouge_scorer()
    from rouge_score import scoring  # noqa: PLC0415  (the [train] extra: cached_rouge_scorer says where it is missing)

    aggregator = scoring.BootstrapAggregator()
    for prediction, reference in zip(predictions, references):
        aggregator.add_scores(scorer.score(reference, prediction))
    state = np.random.get_state()  # the aggregator draws from numpy's global generator: leave it as it was
    np.random.seed(0)
    try:
        aggregated = aggregator.aggregate()
    finally:
        np.random.set_state(state)
    return {name: 100 * score.mid.fmeasure for name, score in aggregated.items()}


def length_window(tokenizer, targets: list[str], percentiles: tuple[float, float] = (5, 95)) -> dict[str, int]:
    """Generation bounds from training targets: `min_target_length` (min_new_tokens) and `generation_max_length`
    (max_length, the decoder start included) at the given percentiles of the targets' lengths in `tokenizer`'s
    tokens, the end of sequence counted; run_summarization.py's flags of the same names take them."""
    tokens = tokenizer(targets, add_special_tokens=False)["input_ids"]
    low, high = np.percentile([len(ids) + 1 for ids in tokens], percentiles)
    return {"min_target_length": int(low), "generation_max_length": int(np.ceil(high)) + 1}


# words that repeat in fluent headlines ("the", "of", the "s" of "russia ' s"): a repeat of any other is degenerate
FUNCTION_WORDS = frozenset(
    """a about after against all also an and any are as at be been before between both but by can could did do does
    for from had has have he her his how i if in into is it its just may me might more most must my no nor not of off
    on or our out over says said she should so some such than that the their them then there these they this those
    to too under up us very was we were what when where which while who whom why will with would you your""".split()
)

# words that leave a phrase open: the function words, and the prepositions and conjunctions outside them that do not
# end a phrase as an adverb or particle can ("steps down", "turned around", "left behind" end headlines)
OPEN_ENDED_WORDS = FUNCTION_WORDS | frozenset(
    """although amid among because despite during including onto per toward towards unless unlike until upon versus
    via whether""".split()
)


def is_wordpiece(tokenizer) -> bool:
    """Whether `tokenizer` marks the pieces that continue a word with "##" (WordPiece), not the pieces that start one
    ("Ġ" byte-level, "▁" SentencePiece): read from a fast tokenizer's model, else from its tokens (a byte-level
    vocabulary may hold a "##" token of its own)."""
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    if model is not None:
        return type(model).__name__ == "WordPiece"
    return any(token.startswith("##") for token in tokenizer.get_vocab())


def continues_word(token: str, wordpiece: bool) -> bool:
    """Whether a vocabulary `token` continues a word: WordPiece's "##ner", or a byte-level / SentencePiece token
    without the leading "Ġ" / "▁" that starts one."""
    return token.startswith("##") if wordpiece else not token.startswith(("\u0120", "\u2581"))


def token_text(token: str, wordpiece: bool) -> str:
    """A vocabulary token's text, without WordPiece's "##" on a piece that continues a word or the leading "Ġ" / "▁"
    of a byte-level or SentencePiece token that starts one."""
    return token[2:] if wordpiece and continues_word(token, wordpiece) else token.lstrip("\u0120\u2581")


def is_punctuation(text: str) -> bool:
    """Whether `text` is all punctuation and symbols (Unicode categories P and S: ",", "\u2014", "$"), not empty."""
    return bool(text) and all(unicodedata.category(char)[0] in "PS" for char in text)


def fitted_to_vocabulary(values: torch.Tensor, size: int, fill) -> torch.Tensor:
    """`values` (one per tokenizer id) for a model vocabulary of `size` ids: cut, or extended with `fill` for the ids
    past the tokenizer's."""
    fitted = torch.full((size,), fill, dtype=values.dtype)
    known = min(size, len(values))
    fitted[:known] = values[:known]
    return fitted


def headline_words(text: str) -> list[str]:
    """A text's words as ROUGE reads them (rouge_score's tokens before stemming): lowercased runs of letters and
    digits, so that the uncased tokenizer's "russia ' s" and a written "Russia's" are the same words."""
    return re.findall(r"[a-z0-9]+", text.lower())


@functools.cache
def porter_stemmer():
    from nltk.stem import porter  # noqa: PLC0415  (rouge_score's stemmer; the [train] extra)

    return porter.PorterStemmer()


@functools.cache
def word_stem(word: str) -> str:
    """A word as ROUGE compares it with stemming: rouge_score's Porter stemmer, for words of 4 characters or more."""
    return porter_stemmer().stem(word) if len(word) > 3 else word


def is_content_word(word: str) -> bool:
    """A word whose repeat makes a headline degenerate: two characters or more, outside FUNCTION_WORDS."""
    return len(word) > 1 and word not in FUNCTION_WORDS


def lead_words(text: str, k: int) -> str:
    """lead-k: the first k words of `text` as ROUGE reads them (`headline_words`), the unit a headline's length is
    counted in."""
    return " ".join(headline_words(text)[:k])


def keyword_headline(text: str, k: int) -> str:
    """The keyword baseline: the k most frequent content words of `text` (`is_content_word`, counted by stem as ROUGE
    stems them; a tie goes to the word seen first), each as it first appears, in the order they first appear. A bag of
    salient words in article order: what a summarizer that learned keyword extraction, not English, writes."""
    counts, first = Counter(), {}
    for position, word in enumerate(headline_words(text)):
        if is_content_word(word):
            stem = word_stem(word)
            counts[stem] += 1
            first.setdefault(stem, (position, word))
    chosen = sorted(counts, key=lambda stem: (-counts[stem], first[stem][0]))[:k]
    return " ".join(word for _, word in sorted(first[stem] for stem in chosen))


# headline style: what English headlines leave out ("Putin signs law", "Man killed in attack", "Trump to visit")
ARTICLES = frozenset({"a", "an", "the"})
PERFECT_AUXILIARIES = frozenset({"has", "have", "had"})
PASSIVE_AUXILIARIES = frozenset({"is", "are", "was", "were"})
MODALS = frozenset({"can", "could", "may", "might", "must", "shall", "should", "to", "will", "would"})
RELATIVES = frozenset({"who", "which", "that"})  # "blogger who was jailed" keeps its "was"
# a headline's "to" stands for "will" after a noun subject: "will" stays after a pronoun, a relative or a question
# word ("they will vote", "there will be", "when will trump visit"), and at the start ("will trump visit?")
KEEPS_WILL = RELATIVES | frozenset(
    """i you he she it we they there this these those everyone everybody nobody someone something what when where how
    why""".split()
)
# adverbs of likelihood between "will" and its verb: "will likely fall", not "to likely fall" ("to soon hold" stays)
WILL_ADVERBS = frozenset({"likely", "never", "possibly", "probably", "still"})
# irregular past participles that are also the simple past: "has found" says what "found" says
SIMPLE_PAST_PARTICIPLES = frozenset(
    """bent bought brought built caught cut dealt fed felt fled found fought held heard hit hung hurt kept laid led left
    lent let lost made meant met paid put quit read said sent set shed shot shut slept sold sought spent split spread
    stood struck swept taught thought told understood upheld won""".split()
)
# irregular past participles that are not: "was taken" is "taken" in a headline, "has taken" is not
PASSIVE_PARTICIPLES = SIMPLE_PAST_PARTICIPLES | frozenset(
    """arisen beaten become begun bitten blown born borne broken chosen come done drawn driven eaten fallen flown
    forbidden forgiven forgotten frozen given gone grown hidden known ridden risen run seen shaken shown shrunk slain
    spoken sprung stolen stung sunk sworn swung taken thrown torn withdrawn worn written""".split()
)
# the day of the news, which headlines leave out ("trump signs order", not "trump signs order on monday"), with the
# words that go with it ("on", "late", "night"); not after a word that makes it a name ("good friday", "usa today")
DAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday today tonight yesterday".split())
BEFORE_DAYS = frozenset("on last this next early late".split())
PARTS_OF_DAYS = frozenset("morning afternoon evening night".split())
NAMING_DAYS = frozenset("ash black bloody blue cyber easter good holy mail maundy palm russia shrove super usa".split())
# a day after these is what the phrase is about ("set for friday", "deadline is friday"), before these it is joined
# to more ("monday and tuesday", "last sunday of the month"); "said friday was" makes it a subject
NOT_AFTER_DAYS = (FUNCTION_WORDS - {"said", "says"}) | frozenset("each every one same since through till until".split())
NOT_BEFORE_DAYS = DAYS | frozenset("of through till until".split())
JOINING_DAYS = frozenset("and or nor".split())  # "monday and tuesday" (not "yesterday and taken")
NOT_PARTICIPLES = frozenset(  # words in -ed that are no verb's participle
    "bed bleed breed creed embed feed greed hundred indeed naked need red reed seed shed sled speed steed weed".split()
)


def is_participle(word: str, passive: bool = True) -> bool:
    """Whether `word` (lowercased) reads as a past participle: a regular one in "-ed" or an irregular one; with
    `passive=False` only one that is also the simple past, so that leaving out "has" keeps the meaning."""
    irregular = PASSIVE_PARTICIPLES if passive else SIMPLE_PAST_PARTICIPLES
    return word in irregular or (len(word) > 3 and word.endswith("ed") and word not in NOT_PARTICIPLES)


AUXILIARIES = PASSIVE_AUXILIARIES | PERFECT_AUXILIARIES | (MODALS - {"to"})


def day_of_the_news(bare: list[str], alone: list[bool], i: int) -> int:
    """How many words from the `i`th say the day of the news (0 where none): a day with the words before it that go
    with it ("on monday", "on this sunday", "late friday") and the part of the day after it ("tuesday night"), none
    with punctuation attached (`bare`: the words lowercased without it, `alone`: whether a word had none; both with two
    more entries, "" and False, after the words). After "on" (or "late", ...) before any word but one that joins the
    day to more ("on monday and tuesday") and after any word but a verb's auxiliary ("vote is on monday"); otherwise
    not first, not after a function word or a preposition ("deadline is friday", "set for friday"; "said" aside) and
    only before a function word or the end ("said wednesday he plans"; not "sunday times", "said friday was"); never
    after a word that makes the day a name ("good friday", "mail on sunday")."""
    start = i
    while start < i + 2 and alone[start] and bare[start] in BEFORE_DAYS:
        start += 1
    before = bare[i - 1] if i else ""
    if not (alone[start] and bare[start] in DAYS) or before in NAMING_DAYS:
        return 0
    end = start + 1
    if bare[end] in PARTS_OF_DAYS:
        if not alone[end]:  # "tuesday night," ends a clause: left whole
            return 0
        end += 1
    following, last = bare[end], end == len(bare) - 2
    joined = following in JOINING_DAYS and bare[end + 1] in DAYS | BEFORE_DAYS
    if (following in NOT_BEFORE_DAYS or joined) and not last:
        return 0
    if start > i:  # "on monday", "late friday"; not "the vote is on monday"
        return end - i if before not in AUXILIARIES | {"be", "been"} else 0
    ends = last or (following in FUNCTION_WORDS and not (before in ("said", "says") and following in AUXILIARIES))
    return end - i if i > 0 and before not in NOT_AFTER_DAYS and ends else 0


def headline_style(text: str) -> str:
    """`text` as English headlines write it: without articles ("a", "an", "the"); without the auxiliary of a passive
    ("people were killed" -> "people killed", "has been placed" -> "placed"; not after "who", "which" or "that") or of a
    perfect whose participle is also the simple past ("has signed" -> "signed"; "has become" stays, and so does "have"
    after a modal or "to": "could have signed"); "is to" / "are to" -> "to" and "will" before a verb -> "to" ("trump
    will visit" -> "trump to visit"; not after a pronoun, a relative or a question word, nor at the start or before an
    adverb of likelihood: "they will vote", "will likely fall"); without the day of the news ("met on monday" ->
    "met", `day_of_the_news`). Word by word on whitespace: the rules read each word lowercased without the punctuation
    around it ("killed," is a participle), so that tokenizer-decoded and written text give the same headline; a word
    with punctuation attached is never left out, and the others keep their case (a capital left out at the start moves
    to the next word). The rules read words, not grammar: "has limited options" loses its "has", and a capitalised
    "Will" is taken for a name."""
    words = text.split()
    bare = [word.strip(string.punctuation + "\u201c\u201d\u2018\u2019").lower() for word in words] + ["", ""]
    alone = [word.lower() == plain for word, plain in zip(words, bare)] + [False, False]  # no punctuation attached
    kept, i, left_out_day = [], 0, 0  # left_out_day: the words of the day left out just before the ith
    while i < len(words):
        word, after, then = bare[i : i + 3]
        before = bare[i - 1 - left_out_day] if i > left_out_day else ""  # "they on monday will vote": "they"
        day, left_out_day = day_of_the_news(bare, alone, i), 0
        perfect = alone[i] and word in PERFECT_AUXILIARIES and not (word == "have" and before in MODALS)
        if day and day < len(words):  # never the whole text
            i, left_out_day = i + day, day
        elif alone[i] and word in ARTICLES:
            i += 1
        elif perfect and after == "been" and alone[i + 1] and is_participle(then):
            i += 2
        elif perfect and is_participle(after, passive=False):
            i += 1
        elif alone[i] and word in PASSIVE_AUXILIARIES and before not in RELATIVES and is_participle(after):
            i += 1
        elif alone[i] and word in ("is", "are") and after == "to":
            i += 1
        else:
            verb = after.isalpha() and (after not in FUNCTION_WORDS or after in ("be", "have"))
            noun_subject = i > 0 and before not in KEEPS_WILL
            to = words[i] == "will" and verb and after not in WILL_ADVERBS and noun_subject
            kept.append("to" if to else words[i])
            i += 1
    styled = " ".join(kept)
    if styled and words and words[0][0].isupper() and not text.startswith(kept[0]):
        styled = styled[0].upper() + styled[1:]  # the capital of a word left out at the start
    return styled


def choose_k(baseline, documents: list[str], references: list[str], ks=range(1, 41)) -> tuple[int, dict]:
    """The k of `baseline(text, k)` (`lead_words`, `keyword_headline`) with the best ROUGE-1 on `documents` against
    `references` (a validation split), and every k's scores."""
    grid = {k: rouge([baseline(text, k) for text in documents], references) for k in ks}
    return max(grid, key=lambda k: grid[k]["rouge1"]), grid


def text_tokens(text: str) -> list[str]:
    """A text's words and punctuation marks, lowercased: the uncased tokenizer's "russia ' s" and a written "Russia's"
    give the same three tokens."""
    return re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower())


def headline_quality(
    predictions: list[str],
    documents: list[str] | None = None,
    *,
    vocabulary: set[str] | None = None,
    token_counts: list[int] | None = None,
    min_tokens: int | None = None,
) -> dict[str, float]:
    """What ROUGE does not show about generated headlines, counted on words stemmed as ROUGE stems them (Porter,
    words of 4 characters or more), so that "cut cuts" repeats a word. Shares x 100 of the headlines: `repeated` (a
    content word twice: a word of two characters or more outside FUNCTION_WORDS), `shared` (the same words as the
    headlines of 2 or more other articles), `empty` (no word), `degenerate` (any of the three). With the articles
    they summarize, `documents`, also `invented_per_headline` (content words not in the article, per headline) and
    `words_not_in_article` (the share x 100 of all generated words that the article does not have). Always `filler`:
    the share x 100 of the headlines' tokens (`text_tokens`: words and punctuation) that are not content words
    (punctuation, single characters, FUNCTION_WORDS). With the articles and `vocabulary` (the words of the training
    text, as `headline_words` gives them), `non_word`: the share x 100 of headlines with a word in neither (word
    pieces spliced into a word no text has). With `token_counts` (the generated tokens of each headline, special
    tokens left out) and `min_tokens` (the forced minimum), `at_min_length`: the share x 100 at exactly that minimum:
    where the length comes from the decoding settings, not the model."""
    if documents is not None and len(predictions) != len(documents):
        raise ValueError(f"{len(predictions)} predictions for {len(documents)} documents")
    words = [headline_words(text) for text in predictions]
    counts = Counter(" ".join(headline) for headline in words)
    flags, invented, foreign, non_words = {"repeated": [], "shared": [], "empty": []}, 0, 0, []
    for index, headline in enumerate(words):
        content = [word_stem(word) for word in headline if is_content_word(word)]
        flags["repeated"].append(len(content) != len(set(content)))
        flags["shared"].append(counts[" ".join(headline)] >= 3)
        flags["empty"].append(not headline)
        if documents is not None:
            article_words = set(headline_words(documents[index]))
            article = {word_stem(word) for word in article_words}
            invented += sum(word not in article for word in content)
            foreign += sum(word_stem(word) not in article for word in headline)
            if vocabulary is not None:
                non_words.append(any(word not in article_words and word not in vocabulary for word in headline))
    flags["degenerate"] = [any(row) for row in zip(*flags.values())]
    shares = {name: 100 * float(np.mean(values)) for name, values in flags.items()}
    tokens = [token for text in predictions for token in text_tokens(text)]
    shares["filler"] = 100 * sum(not is_content_word(token) for token in tokens) / max(len(tokens), 1)
    if token_counts is not None and min_tokens is not None:
        shares["at_min_length"] = 100 * float(np.mean([count == min_tokens for count in token_counts]))
    if documents is None:
        return shares
    total = max(sum(map(len, words)), 1)
    found = {**shares, "invented_per_headline": invented / len(words), "words_not_in_article": 100 * foreign / total}
    return found | ({"non_word": 100 * float(np.mean(non_words))} if vocabulary is not None else {})


class NoRepeatContentWordLogitsProcessor(LogitsProcessor):
    """A generate() logits processor: no content word twice in one output (a decoder-only model's prompt counts as
    written), and nothing else banned. A token that starts a word is banned once a token that starts a word with
    the same stem (`word_stem`) has been generated, if that word is a content word (`is_content_word`): so "cut"
    and "cuts" count as one word, as in `headline_quality`. Function words, punctuation, special tokens and the
    pieces that continue a word (WordPiece's "##ner"; with byte-level or SentencePiece vocabularies, a token
    without a leading "Ġ" / "▁") may repeat, which is what no_repeat_ngram_size 1 takes away with the repeats. A
    word of several pieces is known by its first: "flynn ##ner" bans "flynn" again, and with it any other word
    that starts with the piece "flynn".

    Pass it to generate() (`logits_processor=LogitsProcessorList([processor])`), or use run_summarization.py's
    `--no_repeat_content_words`. The vocabulary is read once, from `tokenizer`; a call is a scatter and a gather on
    the device, with no synchronization."""

    def __init__(self, tokenizer):
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = set(tokenizer.all_special_ids)
        wordpiece = is_wordpiece(tokenizer)
        groups, stems = {}, []
        for index, token in enumerate(tokens):
            starts_word = not continues_word(token, wordpiece)
            words = headline_words(token.lstrip("\u0120\u2581"))
            content = starts_word and index not in special and len(words) == 1 and is_content_word(words[0])
            stems.append(groups.setdefault(word_stem(words[0]), len(groups)) if content else -1)
        self.groups = len(groups)
        # the stem group of every token id, or `groups` (a column never set) for a token that may repeat
        stems = torch.tensor(stems)
        self.token_groups = torch.where(stems < 0, self.groups, stems)
        self.placed = {}  # (vocabulary size, device) -> token_groups fitted to it

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        token_groups = self.groups_of(scores.shape[-1], scores.device)
        seen = torch.zeros(input_ids.shape[0], self.groups + 1, dtype=torch.bool, device=scores.device)
        seen.scatter_(1, token_groups[input_ids], True)
        seen[:, self.groups] = False
        return scores.masked_fill(seen.gather(1, token_groups.expand(input_ids.shape[0], -1)), -float("inf"))

    def groups_of(self, size: int, device: torch.device) -> torch.Tensor:
        """The stem groups of a model vocabulary of `size` tokens (the ids past the tokenizer's may repeat), made
        once per size and device."""
        if (size, device) not in self.placed:
            self.placed[size, device] = fitted_to_vocabulary(self.token_groups, size, self.groups).to(device)
        return self.placed[size, device]


class ContentWordEndLogitsProcessor(LogitsProcessor):
    """A generate() logits processor: a headline ends on a word that can end a phrase, not on a function word or on
    punctuation that opens or joins ("iran has stepped up its war of words with", "donald trump will ask congress for
    cuts to", "ang lee -"). The end of sequence (`eos_token_id`, one id or several) is banned while the last token
    generated is a function word or another preposition or conjunction (`OPEN_ENDED_WORDS`: "during", "amid"), or
    punctuation other than a closing mark (`CLOSING`); a piece that continues a word (WordPiece's "##ner"; without a
    leading "Ġ" / "▁" in byte-level and SentencePiece vocabularies) ends a word of several pieces, which is never
    one of those words. A possessive does not end either: an "s" after an apostrophe ("budget ' s", as WordPiece
    splits "budget's"; a byte-level "'s" with the ASCII apostrophe is punctuation). Before the first token (a
    decoder's start) nothing is banned, as any token past the tokenizer's. At the length limit (`max_new_tokens`)
    generation ends regardless.

    Pass it to generate() (`logits_processor=LogitsProcessorList([processor])`), or use run_summarization.py's
    `--end_on_content_words`. The vocabulary is read once, from `tokenizer`; a call is a gather and a masked fill on
    the device, with no synchronization."""

    CLOSING = frozenset(')]}.!?%"')
    APOSTROPHES = frozenset("'\u2019")

    def __init__(self, tokenizer, eos_token_id):
        if eos_token_id is None:
            raise ValueError("ContentWordEndLogitsProcessor bans the end of sequence: pass its `eos_token_id`")
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = set(tokenizer.all_special_ids)
        wordpiece = is_wordpiece(tokenizer)
        open_ended, possessive_s, apostrophe = [], [], []
        for index, token in enumerate(tokens):
            continues = continues_word(token, wordpiece)
            text = token_text(token, wordpiece)
            possessive_s.append(index not in special and text == "s")
            apostrophe.append(index not in special and text in self.APOSTROPHES)
            if index in special or (continues and text.isalnum()):
                open_ended.append(False)
            elif text.isalnum():  # a word (any script's letters) or a number
                open_ended.append(text.lower() in OPEN_ENDED_WORDS)
            else:  # punctuation, or a token mixing it with letters
                open_ended.append(not (text and set(text) <= self.CLOSING))
        self.open_ended = torch.tensor(open_ended)
        self.possessive_s, self.apostrophe = torch.tensor(possessive_s), torch.tensor(apostrophe)
        self.eos_token_ids = torch.as_tensor(eos_token_id, dtype=torch.long).flatten()  # an id, a list, a tensor
        self.placed = {}  # (vocabulary size, device) -> `fitted`'s tables

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] < 2:  # only the decoder's start token so far
            return scores
        open_ended, possessive_s, apostrophe, ends = self.fitted(scores.shape[-1], scores.device)
        banned = open_ended[input_ids[:, -1]]
        if input_ids.shape[1] > 2:
            banned = banned | (possessive_s[input_ids[:, -1]] & apostrophe[input_ids[:, -2]])
        return scores.masked_fill(banned[:, None] & ends, -float("inf"))

    def fitted(self, size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Per token id of a model vocabulary of `size` (the ids past the tokenizer's are none of these), whether it
        leaves a phrase open, is an "s", is an apostrophe; and the end-of-sequence columns; made once per size and
        device."""
        if (size, device) not in self.placed:
            ends = torch.zeros(size, dtype=torch.bool)
            ends[self.eos_token_ids] = True
            tables = (self.open_ended, self.possessive_s, self.apostrophe)
            fitted = [fitted_to_vocabulary(table, size, False).to(device) for table in tables]
            self.placed[size, device] = (*fitted, ends.to(device))
        return self.placed[size, device]


class WholeWordLogitsProcessor(LogitsProcessor):
    """A generate() logits processor for WordPiece vocabularies: the pieces of every generated word spell a word of
    `words` (e.g. the training text's and the articles' words, as `headline_words` gives them), so that no piece
    splices onto a word into a non-word ("flynn ##ner"). After the pieces of a word, a continuation piece ("##ner")
    is allowed only where the word so far stays a prefix of a known word, and anything else (a new word, punctuation,
    the end) only once it is a known word. A word that no piece could finish is left free, as are the tokens that
    start no word (punctuation, special tokens), after which no continuation piece comes.

    Each step reads the generated ids on the host (a synchronization on a GPU) and walks each row's last word in
    Python: for the CPU decoding of the recipes. `run_summarization.py --whole_words` passes it."""

    def __init__(self, tokenizer, words):
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        if not any(token.startswith("##") for token in tokens):
            raise ValueError("WholeWordLogitsProcessor takes a WordPiece vocabulary (continuation pieces '##...')")
        self.pieces = [token[2:] if token.startswith("##") else token for token in tokens]
        self.continues = [token.startswith("##") for token in tokens]
        special = set(tokenizer.all_special_ids)
        # a token that starts a word: letters and digits only (WordPiece splits punctuation off), no special token
        self.starts_word = [
            not self.continues[index] and index not in special and re.fullmatch(r"[a-z0-9]+", token) is not None
            for index, token in enumerate(tokens)
        ]
        self.words = set(words)
        self.prefixes = {word[:end] for word in self.words for end in range(1, len(word) + 1)}
        self.continuation_ids = torch.tensor([index for index, flag in enumerate(self.continues) if flag])
        self.other_ids = torch.tensor([index for index, flag in enumerate(self.continues) if not flag])
        self.allowed = {}  # word so far -> the continuation ids that keep it a known word's prefix

    def last_word(self, ids: list[int]) -> str | None:
        """The word the row's last tokens spell (its start token and the continuation pieces after it), or None
        where the last token is no part of a word."""
        end = len(ids)
        while end > 0 and ids[end - 1] < len(self.continues) and self.continues[ids[end - 1]]:
            end -= 1
        if end == 0 or ids[end - 1] >= len(self.continues) or not self.starts_word[ids[end - 1]]:
            return None
        return "".join(self.pieces[index] for index in ids[end - 1 :])

    def continuations(self, word: str) -> torch.Tensor:
        if word not in self.allowed:
            ids = [index for index in self.continuation_ids.tolist() if word + self.pieces[index] in self.prefixes]
            self.allowed[word] = torch.tensor(ids, dtype=torch.long)
        return self.allowed[word]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        banned = torch.zeros(scores.shape, dtype=torch.bool)
        known = len(self.continues)
        for row, ids in enumerate(input_ids.tolist()):
            word = self.last_word(ids)
            banned[row, self.continuation_ids] = True
            if word is None:
                continue
            allowed = self.continuations(word)
            banned[row, allowed] = False
            if word not in self.words and len(allowed):  # unfinished: only a piece that keeps it a word's prefix
                banned[row, self.other_ids] = True
                banned[row, known:] = True
        return scores.masked_fill(banned.to(scores.device), -float("inf"))


class SourceSpanLogitsProcessor(LogitsProcessor):
    """A generate() logits processor for an encoder-decoder that copies: adds `bonus` to the score of every token that
    continues, in the row's source, the longest run of the last generated tokens found there (of `min_match` to
    `max_match` tokens), so that a copied span goes on where that run goes on in the article and does not jump to
    another place where its last word also stands ("kushner and flynn sat down at trump tower", not "... at trump
    campaign relationship"). Where the run ends a clause of the article (`CLAUSE_ENDS` follows it there: not the point
    or comma inside a number, "64.6", nor the point after a one-letter word, "u.s.", or after a title, "gov."), the end
    of sequence (`eos_token_id`; None: no end bonus) gets the bonus too. A token can still leave the span where the
    model wants it enough. The bonus is in the units of the scores the processor is given: log probabilities in beam
    search. With `copied_punctuation`, punctuation (a token whose decoded text is all punctuation or symbols, not the
    end of sequence) is banned except after a token that it follows somewhere in the row's source: no summary starts
    with punctuation (nor with an opening quote or a currency sign), and no mark comes after a word that the article
    never puts it after (": afghan refugees", "lozovoye ( donbass" where the article has no "lozovoye ("); what comes
    after the mark is left to the model and the bonus. Per step it marks, per row, the punctuation allowed (a rows x
    punctuation table on the host) and bans the rest with one masked fill of the punctuation's columns. With
    `stay_on_span`, a row whose last tokens are such a run may only go on as the article goes on there, or end: every
    other token is banned, and so is the mark that ends the article's sentence there (the span stops at its sentence's
    end), so that no summary joins two places of the article once it copies one; a row whose allowed tokens are all
    banned already (by another processor, or the minimum length for the end) is left as it was, and so is a row whose
    continuations lie past a narrower model vocabulary. It reads what the processors before it banned: give it last
    among those that ban tokens. Where a run goes on in more than one place of the article, the mark that ends the
    sentence at one of them is banned at all of them.

    `set_source(input_ids, attention_mask)` gives the sources of the batch that the next generate() reads (in the
    summarizer's vocabulary; rows of beams and of `num_return_sequences` follow their source, as generate() repeats
    them); a generate() that starts without new sources is refused. Special tokens and padding end a run: no run
    reaches across them. The generated ids after the decoder's start token are read, so a prompt given as
    `decoder_input_ids` counts as generated. run_summarization.py's `--source_span_bonus` sets the sources per batch.
    Each step reads the last generated ids on the host (a synchronization on a GPU): for the CPU decoding of the
    recipes."""

    CLAUSE_ENDS = frozenset(".,;:!?")
    SENTENCE_ENDS = frozenset(".!?")
    # words whose point is no clause's end: titles and name parts that a name goes on after ("gov. chris christie",
    # "ret. lt. gen.", "st. petersburg", "martin luther king jr. said")
    TITLES = frozenset(
        """adm capt cmdr col cpl det dr gen gov hon insp jr lt maj mr mrs ms mt prof pvt rep ret rev sen sgt sr st
        supt""".split()
    )
    CLAUSE = -1  # in a run's continuations: the run ends a clause of the article

    def __init__(
        self,
        tokenizer,
        bonus: float,
        eos_token_id=None,
        min_match: int = 2,
        max_match: int = 4,
        copied_punctuation: bool = False,
        stay_on_span: bool = False,
    ):
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, max_match={max_match}")
        self.bonus, self.min_match, self.max_match = bonus, min_match, max_match
        self.special = set(tokenizer.all_special_ids)
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.wordpiece = is_wordpiece(tokenizer)
        texts = [token_text(token, self.wordpiece) for token in tokens]
        self.clause_ends = {index for index, text in enumerate(texts) if text in self.CLAUSE_ENDS}
        self.digits = {index for index, text in enumerate(texts) if text.isdigit()}
        self.letters = {index for index, text in enumerate(texts) if len(text) == 1 and text.isalpha()}
        self.points = {index for index, text in enumerate(texts) if text == "."}
        self.sentence_ends = {index for index, text in enumerate(texts) if text in self.SENTENCE_ENDS}
        self.continuing = {index for index, token in enumerate(tokens) if continues_word(token, self.wordpiece)}
        self.titles = {
            index for index, text in enumerate(texts) if text in self.TITLES and index not in self.continuing
        }
        self.stay_on_span = stay_on_span
        self.eos_token_ids = set() if eos_token_id is None else set(torch.as_tensor(eos_token_id).flatten().tolist())
        # punctuation: a token whose text is all punctuation or symbols (Unicode categories P and S, read from the
        # decoded text, so that a byte-level token is read as the character it encodes); not a special token, nor
        # the end of sequence
        self.copied_punctuation = copied_punctuation
        self.punctuation = torch.tensor(
            [
                index
                for index, token in enumerate(tokens)
                if index not in self.special
                and index not in self.eos_token_ids
                and is_punctuation(tokenizer.convert_tokens_to_string([token]).strip())
            ]
            if copied_punctuation
            else [],
            dtype=torch.long,
        )
        self.punctuation_column = {token: column for column, token in enumerate(self.punctuation.tolist())}
        self.placed = {}  # (vocabulary size, device) -> `placed_punctuation`
        self.continuations, self.sources, self.fresh, self.last_length = None, None, False, None

    def ends_clause(self, row: list[int], position: int) -> bool:
        """Whether the source token at `position` (a `CLAUSE_ENDS` mark) ends a clause: not a point or comma inside
        a number ("64.6", "4,608"; in a byte-level or SentencePiece vocabulary only where the digits after it go on
        the same word) nor a point after a one-letter word ("u.s.": a letter that starts a word or follows a point;
        not the last piece of "kislya ##k .") or after a title ("gov.", `TITLES`)."""
        token = row[position]
        if token not in self.clause_ends:
            return False
        before = row[position - 1] if position else None
        after = row[position + 1] if position + 1 < len(row) else None
        if before in self.digits and after in self.digits and (self.wordpiece or after in self.continuing):
            return False
        if token in self.points and before in self.letters:
            return before in self.continuing and not (position > 1 and row[position - 2] in self.points)
        return not (token in self.points and before in self.titles)

    def set_source(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
        """Per source row, each run of `min_match` to `max_match` of its tokens (of 1 to `max_match` with
        `copied_punctuation`) -> the tokens that follow it, and `CLAUSE` where one of them ends a clause."""
        if input_ids.dim() != 2 or input_ids.shape[0] == 0:
            raise ValueError(
                f"`input_ids` must be a non-empty batch (batch, length), got shape {tuple(input_ids.shape)}"
            )
        rows = input_ids.tolist()
        masks = attention_mask.tolist() if attention_mask is not None else [[1] * len(row) for row in rows]
        shortest = 1 if self.copied_punctuation else self.min_match  # single tokens: what punctuation may follow
        self.continuations = []
        # the rows as a summary may copy them: no run reaches across a special token or padding
        self.sources = [
            [token if real and token not in self.special else None for token, real in zip(row, mask)]
            for row, mask in zip(rows, masks)
        ]
        for row, mask in zip(rows, masks):
            following, run = {}, []
            for position, (token, real) in enumerate(zip(row, mask)):
                if not real or token in self.special:  # a run ends at a special token or padding
                    run = []
                    continue
                after = {token, self.CLAUSE} if self.ends_clause(row, position) else {token}
                for size in range(shortest, min(self.max_match, len(run)) + 1):
                    following.setdefault(tuple(run[-size:]), set()).update(after)
                run.append(token)
            self.continuations.append(following)
        self.fresh, self.last_length = True, None

    def copied_to_clause_end(self, source: int, ids: list[int]) -> bool:
        """Whether a summary's token `ids` (special tokens skipped) are one run of the `source`-th article given to
        `set_source`, copied whole up to where a clause of the article ends (`ends_clause`): no join of two places of
        the article, no phrase cut short."""
        ids = [token for token in ids if token not in self.special]
        row = self.sources[source]
        return bool(ids) and any(
            row[start] == ids[0] and row[start : start + len(ids)] == ids and self.ends_clause(row, start + len(ids))
            for start in range(len(row) - len(ids))
        )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.continuations is None:
            raise ValueError("SourceSpanLogitsProcessor needs the batch's sources: call set_source() before generate()")
        if self.last_length is None or input_ids.shape[1] <= self.last_length:  # a generate() starts
            if not self.fresh:
                raise ValueError(
                    "SourceSpanLogitsProcessor was given no new sources for this generate(): call set_source() with "
                    "each batch's input_ids"
                )
            self.fresh = False
        self.last_length = input_ids.shape[1]
        if input_ids.shape[0] % len(self.continuations):
            raise ValueError(
                f"generate() has {input_ids.shape[0]} rows for {len(self.continuations)} sources given to set_source()"
            )
        per_source = input_ids.shape[0] // len(self.continuations)
        rows, columns = [], []
        copied_rows, copied_columns = [], []  # the punctuation allowed: it follows the row's last token
        span_rows, span_columns = [], []  # with stay_on_span: the tokens a row on a span may take
        last = input_ids[:, max(1, input_ids.shape[1] - self.max_match) :].tolist()  # after the decoder's start
        for row, ids in enumerate(last):
            following = self.continuations[row // per_source]
            if self.copied_punctuation and ids:
                for token in following.get(tuple(ids[-1:]), ()):
                    if token in self.punctuation_column:
                        copied_rows.append(row)
                        copied_columns.append(self.punctuation_column[token])
            for size in range(min(self.max_match, len(ids)), self.min_match - 1, -1):
                tokens = following.get(tuple(ids[-size:]))
                if tokens:
                    ends = self.CLAUSE in tokens
                    if ends:  # the article's clause ends here: so may the summary
                        tokens = (tokens - {self.CLAUSE}) | self.eos_token_ids
                    kept = [token for token in tokens if token < scores.shape[-1]]
                    rows += [row] * len(kept)
                    columns += kept
                    going_on = set(kept) - self.eos_token_ids  # the continuations the model can write
                    if self.stay_on_span and (going_on or ends):  # on: the span's next token, or the end
                        stays = (going_on - (self.sentence_ends if ends else set())) | self.eos_token_ids
                        stays = [token for token in stays if token < scores.shape[-1]]
                        span_rows += [row] * len(stays)
                        span_columns += stays
                    break
        if rows:
            index = (torch.tensor(rows, device=scores.device), torch.tensor(columns, device=scores.device))
            bonus = torch.tensor(self.bonus, dtype=scores.dtype, device=scores.device)
            scores = scores.index_put(index, bonus, accumulate=True)
        elif self.copied_punctuation:
            scores = scores.clone()
        if self.copied_punctuation:  # the punctuation that follows no copied token is banned
            inside, placed = self.placed_punctuation(scores.shape[-1], scores.device)
            banned = torch.ones(input_ids.shape[0], len(self.punctuation), dtype=torch.bool)
            banned[copied_rows, copied_columns] = False
            scores[:, placed] = scores[:, placed].masked_fill(banned[:, inside].to(scores.device), -float("inf"))
        if span_rows:
            scores = self.kept_on_span(scores, span_rows, span_columns)
        return scores

    @staticmethod
    def kept_on_span(scores: torch.Tensor, rows: list[int], columns: list[int]) -> torch.Tensor:
        """`scores` with every token banned but the (row, column) pairs given, in each row given where one of its
        pairs is not banned already; the other rows as they were. No host read."""
        index = (torch.tensor(rows, device=scores.device), torch.tensor(columns, device=scores.device))
        kept = scores[index]
        open_pairs = torch.isfinite(kept).to(scores.dtype)
        stays = torch.zeros(scores.shape[0], dtype=scores.dtype, device=scores.device)
        stays = stays.index_add(0, index[0], open_pairs)
        # the staying rows banned whole, then their pairs given back (the other rows' pairs are as they were)
        return scores.masked_fill((stays > 0)[:, None], -float("inf")).index_put_(index, kept)

    def placed_punctuation(self, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Which of the punctuation ids a model vocabulary of `size` has (it may be narrower than the tokenizer's),
        and those ids on `device`; made once per size and device."""
        if (size, device) not in self.placed:
            inside = self.punctuation < size
            self.placed[size, device] = (inside, self.punctuation[inside].to(device))
        return self.placed[size, device]
