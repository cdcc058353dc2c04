"""scripts/make_pseudo_summaries.py: PEGASUS gap-sentence pairs of unlabeled text, never of a held-out article."""

import json

from scripts import make_pseudo_summaries
from scripts.make_pseudo_summaries import pseudo_summary, pseudo_summary_pairs
from tests.in_process import run_in_process


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
