"""The logits processors the headline recipe decodes with (scripts/run_summarization.py's `--no_repeat_content_words`,
`--end_on_content_words`, `--whole_words`, `--source_span_bonus`): constraints on what generate() writes, read from
the tokenizer's vocabulary (WordPiece, byte-level or SentencePiece word starts) and the recipe's English word lists."""

import re
import unicodedata

import torch
from transformers import LogitsProcessor

from headline_rules import FUNCTION_WORDS, headline_words, is_content_word, word_stem

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
    start no word (punctuation, special tokens), after which no continuation piece comes. A model vocabulary narrower
    than the tokenizer's (the scores' last dimension) gets the bans of its own ids: a word that only pieces past them
    could finish is left free too.

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
        self.placed = {}  # model vocabulary size -> the continuation ids and the other ids below it

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
        size = scores.shape[-1]
        if size not in self.placed:
            self.placed[size] = (
                self.continuation_ids[self.continuation_ids < size],
                self.other_ids[self.other_ids < size],
            )
        continuation_ids, other_ids = self.placed[size]
        banned = torch.zeros(scores.shape, dtype=torch.bool)
        known = len(self.continues)
        for row, ids in enumerate(input_ids.tolist()):
            word = self.last_word(ids)
            banned[row, continuation_ids] = True
            if word is None:
                continue
            allowed = self.continuations(word)
            allowed = allowed[allowed < size]
            banned[row, allowed] = False
            if word not in self.words and len(allowed):  # unfinished: only a piece that keeps it a word's prefix
                banned[row, other_ids] = True
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
