"""The headline recipe's rules for English news text (scripts/run_summarization.py, scripts/make_pseudo_summaries.py,
benchmarks/quality): news sources without their datelines and share bars (`clean_source`); words as ROUGE reads
them (`headline_words`, `word_stem`) and the function words (`FUNCTION_WORDS`); the untrained baselines (`lead_words`,
`keyword_headline`); English headline style (`headline_style`, with the day of the news: `day_of_the_news`); and what
ROUGE does not see in generated headlines (`headline_quality`)."""

import functools
import re
import string
from collections import Counter

import numpy as np

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


# words that repeat in fluent headlines ("the", "of", the "s" of "russia ' s"): a repeat of any other is degenerate
FUNCTION_WORDS = frozenset(
    """a about after against all also an and any are as at be been before between both but by can could did do does
    for from had has have he her his how i if in into is it its just may me might more most must my no nor not of off
    on or our out over says said she should so some such than that the their them then there these they this those
    to too under up us very was we were what when where which while who whom why will with would you your""".split()
)


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
