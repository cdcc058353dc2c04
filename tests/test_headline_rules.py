"""scripts/headline_rules.py: news sources without their datelines, words as ROUGE reads them, the baselines, English
headline style and what ROUGE does not see in generated headlines."""

import pytest

from headline_rules import clean_source, headline_quality, headline_style, headline_words, keyword_headline, lead_words


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
