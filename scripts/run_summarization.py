"""Fine-tune (or train from scratch) a Fastformer encoder-decoder for summarization, as transformers'
run_summarization.py.

With no data arguments it trains on the bundled news articles -> headlines subset (data/news_headlines).
Reports ROUGE-1/2/L/Lsum through `evaluate` (the metric of rouge_metric.py beside this script, loaded by its path,
offline), the shares of degenerate headlines (headline_rules.headline_quality) and the generation length, writes
eval_results.json / predict_results.json / all_results.json and generated_predictions.txt, and saves a Hub-ready
folder (weights, config, code for trust_remote_code, tokenizer, generation config, model card). Any transformers
seq2seq model type trains too (--model_type bart) for comparisons.

The scores and generated_predictions.txt are the model's own output: what generate() writes, with the decoding
flags' logits processors, decoded. The recipe's post-edits of that text (--headline_style, --rerank_beams) are scored
apart, as {eval,predict}_edited_*, and written to edited_predictions.txt.

    python scripts/run_summarization.py --output_dir runs/headlines --do_train --do_eval --predict_with_generate
"""

import json
import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    LogitsProcessorList,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)
from transformers.utils import cached_file

import bert2bert  # noqa: F401  (registers the BERT2BERT baseline with the copy head for the Auto classes)
from beam_reranking import (
    BeamReranker,
    candidate_features,
    candidate_targets,
    cross_validated_choices,
)
from fastformer.cli import fail, parse_args
from frozen_encoder import CachedEncoderStates, freeze_encoder
from headline_decoding import (
    ContentWordEndLogitsProcessor,
    NoRepeatContentWordLogitsProcessor,
    SourceSpanLogitsProcessor,
    WholeWordLogitsProcessor,
)
from headline_rules import clean_source, headline_quality, headline_style, headline_words
from rouge_metric import rouge
from training_utils import (
    SPLIT_FLAGS,
    DataArguments,
    ModelArguments,
    ModelCardTrainerMixin,
    SplitOrderTrainerMixin,
    dataset_name,
    load_config,
    load_model,
    load_raw_datasets,
    load_tokenizer,
    padding,
    publish,
    require_columns,
    setup_logging,
    tokenize_splits,
    train_and_evaluate,
)

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]  # the source checkout this script is part of
BUNDLED_TOKENIZER = REPO / "data" / "tokenizers" / "bert-base-uncased"
BUNDLED_DATA = REPO / "data" / "news_headlines"
BUNDLED = {split: BUNDLED_DATA / f"{split}.jsonl" for split in ("train", "validation", "test")}


@dataclass
class DataTrainingArguments(DataArguments):
    text_column: str | None = field(default=None, metadata={"help": "Input column (default: document)."})
    summary_column: str | None = field(default=None, metadata={"help": "Target column (default: summary)."})
    source_prefix: str | None = field(
        default=None, metadata={"help": "Text put before every input (e.g. 'summarize: ' for T5)."}
    )
    max_source_length: int = field(default=512, metadata={"help": "Longer inputs are truncated."})
    max_target_length: int = field(default=64, metadata={"help": "Longer training targets are truncated."})
    val_max_target_length: int | None = field(
        default=None,
        metadata={
            "help": "Target length for evaluation and prediction, and generate's max_length there unless "
            "--generation_max_length is given (default: --max_target_length)."
        },
    )
    num_beams: int | None = field(
        default=None,
        metadata={
            "help": "Beams for generate in evaluation and prediction (default: --generation_num_beams, else the "
            "model's generation config)."
        },
    )
    forced_bos_token: str | None = field(
        default=None,
        metadata={
            "help": "The token generate() writes first, after the decoder's start (e.g. the target language's code "
            "for a multilingual model); saved in the generation config as forced_bos_token_id."
        },
    )
    length_penalty: float | None = field(
        default=None,
        metadata={"help": "Beam search's length penalty (> 1 favours longer outputs); saved in the generation config."},
    )
    min_target_length: int | None = field(
        default=None,
        metadata={
            "help": "Generate at least this many tokens in evaluation and prediction (min_new_tokens); saved in "
            "the generation config."
        },
    )
    no_repeat_ngram_size: int | None = field(
        default=None,
        metadata={
            "help": "Never generate an n-gram of this size twice (1: no token twice); saved in the generation config."
        },
    )
    repetition_penalty: float | None = field(
        default=None,
        metadata={
            "help": "Divide the scores of tokens already generated by this (> 1 repeats less; CTRL's penalty); saved "
            "in the generation config."
        },
    )
    whole_words: bool = field(
        default=False,
        metadata={
            "help": "Generate whole words only in evaluation and prediction: the word pieces of every generated word "
            "spell a word of the training split's articles and summaries or of the articles being summarized "
            "(headline_decoding.WholeWordLogitsProcessor; a host read per step)."
        },
    )
    no_repeat_content_words: bool = field(
        default=False,
        metadata={
            "help": "Never generate a content word twice in evaluation and prediction, but let function words, "
            "punctuation and word pieces repeat (headline_decoding.NoRepeatContentWordLogitsProcessor; not "
            "in the generation config: pass the processor to generate() with the saved model)."
        },
    )
    end_on_content_words: bool = field(
        default=False,
        metadata={
            "help": "End a summary only after a word that can end a phrase: not after a function word or another "
            "preposition or conjunction, after punctuation that opens or joins, or after a possessive "
            "(headline_decoding.ContentWordEndLogitsProcessor; not in the generation config: pass the "
            "processor to generate() with the saved model)."
        },
    )
    source_span_bonus: float | None = field(
        default=None,
        metadata={
            "help": "In evaluation and prediction, add this to the scores of the tokens that continue, in the "
            "article, the longest run of the last generated tokens found there, so that a copied span goes on "
            "where it goes on in the article, and to the end of sequence where that run ends a clause of the "
            "article (headline_decoding.SourceSpanLogitsProcessor; a host read per step; not in the "
            "generation config)."
        },
    )
    copied_punctuation: bool = field(
        default=False,
        metadata={
            "help": "With --source_span_bonus: punctuation only after a token that it follows in the article, so "
            "that no summary starts with punctuation and no mark comes after a word the article never puts it after."
        },
    )
    stay_on_span: bool = field(
        default=False,
        metadata={
            "help": "With --source_span_bonus: once the last generated tokens are a run of the article, only the "
            "tokens that continue it there (not past its sentence's end) or the end of sequence, so that a summary "
            "does not join two places of the article."
        },
    )
    headline_style: bool = field(
        default=False,
        metadata={
            "help": "Post-edit the generated summaries into headline style: without articles, without the "
            'auxiliary of a passive or of a perfect in the simple past\'s form, "will", "is to" and "are to" as '
            '"to" (headline_rules.headline_style; on the decoded text, after generate()). The edited summaries are '
            "written to edited_predictions.txt and scored as {eval,predict}_edited_*, beside the model's own "
            "(generated_predictions.txt, {eval,predict}_rouge*)."
        },
    )
    rerank_beams: bool = field(
        default=False,
        metadata={
            "help": "Post-edit by choosing among the beams: the beam that a linear reranker chooses from the top beam "
            "and the beams that copy one span of the article up to a clause's end, by their rank, score, length and "
            "the article's keywords held (beam_reranking.BeamReranker). Fit after --do_eval on the validation "
            "split's beams (eval_reranked_* score its 5-fold estimate there), saved as beam_reranker.json in "
            "--output_dir and applied to the test split: the chosen beams (in headline style with --headline_style) "
            "are written to edited_predictions.txt and scored as predict_edited_*, while predict_rouge* and "
            "generated_predictions.txt stay the model's own top beams. --do_predict without --do_eval reads the "
            "reranker from --model_name_or_path. Needs --predict_with_generate, --source_span_bonus (its clause "
            "ends) and more than one beam; each split's beams go to {eval,predict}_beams.jsonl. generate() keeps "
            "every step's scores for this: a (batch x beams, vocabulary) copy per step, so a smaller "
            "--per_device_eval_batch_size may be needed."
        },
    )
    clean_sources: bool = field(
        default=False,
        metadata={
            "help": 'Strip what news sources put before their first sentence ("MOSCOW, February 7. /TASS/.") and '
            "share bars from every input (headline_rules.clean_source)."
        },
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "Stop training after this many evaluations without improving --metric_for_best_model (needs "
            "--load_best_model_at_end, which keeps the best checkpoint)."
        },
    )
    ignore_pad_token_for_loss: bool = field(
        default=True, metadata={"help": "Leave the labels' padding out of the loss (label -100)."}
    )

    def __post_init__(self):
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length
        for flag in ("copied_punctuation", "stay_on_span", "rerank_beams"):
            if getattr(self, flag) and self.source_span_bonus is None:
                raise ValueError(f"--{flag} reads the article's runs: give --source_span_bonus as well")


@dataclass
class SummarizationModelArguments(ModelArguments):
    resize_position_embeddings: bool | None = field(
        default=None,
        metadata={
            "help": "Where --max_source_length is longer than the encoder's position embeddings, resize them (the "
            "model's resize_position_embeddings, e.g. PEGASUS'; Fastformer, BART and BERT2BERT have none); by "
            "default too, with a warning, as in transformers' example; False: refuse instead."
        },
    )
    freeze_encoder: bool = field(
        default=False,
        metadata={
            "help": "Train the decoder only (as the transformers legacy seq2seq examples' --freeze_encoder): the "
            "encoder stays as loaded, its word embeddings included (a Fastformer's encoder gets its own copy of the "
            "matrix it shared with the decoder). For an encoder-decoder warm-started from an encoder checkpoint: "
            "fine-tuning the encoder through the new, random cross-attention collapses its token representations "
            "(docs/RESULTS.md)."
        },
    )
    train_encoder_layers: int = field(
        default=0,
        metadata={
            "help": "With --freeze_encoder: the encoder's top layers that still train (e.g. once the decoder has "
            "settled, at a small learning rate)."
        },
    )
    cache_encoder_states: bool = field(
        default=False,
        metadata={
            "help": "With --freeze_encoder: compute the encoder's output once per article (eval mode: no encoder "
            "dropout in training either) and reuse it in every epoch, at evaluation and in generation, so a step "
            "costs the decoder only (frozen_encoder.CachedEncoderStates)."
        },
    )


ARGUMENTS = (SummarizationModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments)


def label_pad_token_id(tokenizer, data_args) -> int:
    return -100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id


def tokenize(batch, *, tokenizer, data_args, text_column, summary_column, eos_token_id, max_target_length):
    """Inputs (cleaned with --clean_sources, after --source_prefix) cut to --max_source_length. Labels: the target
    ids cut to `max_target_length` - 1, then end-of-sequence; the decoder starts from decoder_start_token_id by
    itself. With --pad_to_max_length both are padded to their maximum length."""
    texts = map(clean_source, batch[text_column]) if data_args.clean_sources else batch[text_column]
    sources = [(data_args.source_prefix or "") + text for text in texts]
    encoded = tokenizer(sources, max_length=data_args.max_source_length, padding=padding(data_args), truncation=True)
    targets = tokenizer(text_target=batch[summary_column], add_special_tokens=False)["input_ids"]
    labels = [ids[: max_target_length - 1] + [eos_token_id] for ids in targets]
    if data_args.pad_to_max_length:
        pad = label_pad_token_id(tokenizer, data_args)
        labels = [ids + [pad] * (max_target_length - len(ids)) for ids in labels]
    encoded["labels"] = labels
    return encoded


def decoded_texts(tokenizer, ids, styled: bool = False) -> list[str]:
    """Token ids as text, -100 read as padding; "russia ' s" and "won ' t" joined as written ("russia's"); with
    `styled`, in headline style (--headline_style's post-edit)."""
    ids = np.where(ids != -100, ids, tokenizer.pad_token_id)
    decoded = tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True)
    return [headline_style(text) if styled else text.strip() for text in decoded]


def fit_source_positions(model, max_source_length: int, resize: bool | None) -> None:
    """--max_source_length against the positions the model's encoder reads: where they are fewer, resized as
    transformers' example does (--resize_position_embeddings: by default too, with a warning; False refuses), or
    refused where the model cannot resize them."""
    config = getattr(model.config, "encoder", model.config)  # EncoderDecoderModel (BERT2BERT) nests its encoder's
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None or max_source_length <= positions:
        return
    too_long = (
        f"--max_source_length {max_source_length} is longer than the model reads: {positions} positions "
        "(max_position_embeddings)"
    )
    if resize is False:
        fail(f"{too_long}, and --resize_position_embeddings is False")
    try:
        model.resize_position_embeddings(max_source_length)
    except NotImplementedError:
        fail(f"{too_long}, which {type(model).__name__} cannot resize (--resize_position_embeddings)")
    if resize is None:
        logger.warning(f"Resized the model's position embeddings from {positions} to {max_source_length}")


def token_id(tokenizer, token: str | None, flag: str) -> int | None:
    """The id of `token` in the tokenizer's vocabulary (None for None); a token it does not have stops the script."""
    if token is None:
        return None
    found = tokenizer.convert_tokens_to_ids(token)
    if found is None or (found == tokenizer.unk_token_id and token != tokenizer.unk_token):
        fail(f"{flag} {token!r}: not a token of the tokenizer")
    return found


def logits_processors(tokenizer, data_args, raw, text_column, summary_column, eos_token_id) -> list | None:
    """What --no_repeat_content_words, --end_on_content_words, --whole_words and --source_span_bonus add to
    generate(); --whole_words' words: the training split's articles and summaries, and every split's articles (what
    the summaries are written from)."""
    processors = []
    if data_args.no_repeat_content_words:
        processors.append(NoRepeatContentWordLogitsProcessor(tokenizer))
    if data_args.end_on_content_words:
        processors.append(ContentWordEndLogitsProcessor(tokenizer, eos_token_id))
    if data_args.whole_words:
        texts = [text for split in raw.values() for text in split[text_column]]
        texts += raw["train"][summary_column] if "train" in raw else []
        words = {word for text in texts for word in headline_words(text)}
        processors.append(WholeWordLogitsProcessor(tokenizer, words))
    if data_args.source_span_bonus is not None:  # last: --stay_on_span reads what the others banned
        processors.append(
            SourceSpanLogitsProcessor(
                tokenizer,
                data_args.source_span_bonus,
                eos_token_id,
                copied_punctuation=data_args.copied_punctuation,
                stay_on_span=data_args.stay_on_span,
            )
        )
    return processors or None


class BeamChoice:
    """--rerank_beams: generate() returns every beam of each article with its score, and the trainer sees the top
    beam, the model's own output; each article's candidates are kept in `articles` (texts as edited, features, which
    end a clause of the article, the reference, and the beam that `reranker` chooses: the top beam while there is
    none yet) until `take()`."""

    def __init__(self, tokenizer, styled: bool, span: SourceSpanLogitsProcessor, reranker=None, decoding=None):
        self.tokenizer, self.styled, self.span, self.reranker = tokenizer, styled, span, reranker
        self.decoding = decoding  # the settings a reranker fit here is saved with
        self.articles = []

    def generate(self, generate, beams: int, *positional, **named) -> torch.Tensor:
        output = generate(
            *positional, **named, num_return_sequences=beams, return_dict_in_generate=True, output_scores=True
        )
        sequences = output.sequences.view(-1, beams, output.sequences.shape[-1])
        scores = output.sequences_scores.view(-1, beams).tolist()
        sources = self.tokenizer.batch_decode(named["input_ids"], skip_special_tokens=True)
        labels = named.get("labels")
        references = decoded_texts(self.tokenizer, labels.cpu().numpy()) if labels is not None else None
        for article, candidates in enumerate(sequences.tolist()):
            texts = decoded_texts(self.tokenizer, np.array(candidates), self.styled)
            features = candidate_features(texts, scores[article], sources[article])
            allowed = [self.span.copied_to_clause_end(article, ids) for ids in candidates]
            choice = 0 if self.reranker is None else self.reranker.choose(features, allowed)
            reference = None if references is None else references[article]
            self.articles.append(
                {
                    "texts": texts,
                    "scores": scores[article],
                    "features": features,
                    "allowed": allowed,
                    "reference": reference,
                    "choice": choice,
                }
            )
        return sequences[:, 0]

    def take(self) -> list[dict]:
        articles, self.articles = self.articles, []
        return articles


def edited_texts(predictions: list[str], data_args, beam_choice: BeamChoice | None) -> list[str] | None:
    """The recipe's post-edit of the model's own summaries `predictions` (one per article, as generated): with
    --rerank_beams the beam its reranker chose, where this evaluation kept the beams (`beam_choice.articles`: not in
    the evaluations during training), with --headline_style in headline style; None where nothing is edited."""
    if beam_choice is not None and len(beam_choice.articles) == len(predictions):
        return [article["texts"][article["choice"]] for article in beam_choice.articles]
    if data_args.headline_style:
        return [headline_style(text) for text in predictions]
    return None


class SummarizationTrainer(ModelCardTrainerMixin, SplitOrderTrainerMixin, Seq2SeqTrainer):
    def __init__(self, *args, logits_processor=None, beam_choice: BeamChoice | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.logits_processor = logits_processor
        self.beam_choice = beam_choice

    def evaluate(self, *args, **gen_kwargs):
        """As Seq2SeqTrainer's, with the trainer's `logits_processor` (a list: --no_repeat_content_words,
        --end_on_content_words, --source_span_bonus, --whole_words) in generate(); with --rerank_beams, `beam_choice`
        keeps this evaluation's beams only."""
        if self.beam_choice is not None:
            self.beam_choice.take()
        return super().evaluate(*args, **self.with_logits_processor(gen_kwargs))

    def predict(self, *args, **gen_kwargs):
        if self.beam_choice is not None:
            self.beam_choice.take()
        return super().predict(*args, **self.with_logits_processor(gen_kwargs))

    def with_logits_processor(self, gen_kwargs: dict) -> dict:
        if self.logits_processor is None:
            return gen_kwargs
        return {"logits_processor": LogitsProcessorList(self.logits_processor), **gen_kwargs}

    def prediction_step(self, model, inputs, prediction_loss_only, *args, **kwargs):
        """As Seq2SeqTrainer's, but --source_span_bonus's processor is given the batch's articles first, a batch's
        `encoder_outputs` (--cache_encoder_states) reach generate() as a copy (generate() expands them for beam search
        in place, transformers 5.24, and the loss forward that follows reads the same batch), and with --rerank_beams
        generate() keeps every beam in `beam_choice` and returns the top one."""
        generates = self.args.predict_with_generate and not prediction_loss_only
        for processor in self.logits_processor or ():
            if generates and isinstance(processor, SourceSpanLogitsProcessor):
                if "input_ids" not in inputs:
                    raise ValueError("--source_span_bonus reads each batch's articles: the batch has no input_ids")
                processor.set_source(inputs["input_ids"], inputs.get("attention_mask"))
        copies_states = inputs.get("encoder_outputs") is not None
        chooses = generates and self.beam_choice is not None and not self.is_in_train  # not in evaluations in training
        if not copies_states and not chooses:
            return super().prediction_step(model, inputs, prediction_loss_only, *args, **kwargs)
        generate = self.model.generate

        def wrapped_generate(*positional, **named):
            if copies_states:
                named["encoder_outputs"] = type(named["encoder_outputs"])(**named["encoder_outputs"])
            if chooses:
                beams = named.get("num_beams") or self.model.generation_config.num_beams
                return self.beam_choice.generate(generate, beams, *positional, **named)
            return generate(*positional, **named)

        self.model.generate = wrapped_generate
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, *args, **kwargs)
        finally:
            del self.model.generate


def reranked_decoding(model, data_args, training_args) -> dict:
    """The decoding settings that a beam reranker's rank and score features depend on (saved with it, and checked
    where a saved one is applied)."""
    beams = training_args.generation_num_beams or model.generation_config.num_beams
    length_penalty = model.generation_config.length_penalty
    settings = {"num_beams": beams, "length_penalty": 1.0 if length_penalty is None else length_penalty}  # generate's
    return settings | {
        name: getattr(data_args, name) for name in ("source_span_bonus", "stay_on_span", "headline_style")
    }


def prepare_beam_choice(model, tokenizer, processors, model_args, data_args, training_args) -> BeamChoice:
    """--rerank_beams: its checks, and with --do_predict but no --do_eval the reranker saved beside the model."""
    decoding = reranked_decoding(model, data_args, training_args)
    if decoding["num_beams"] < 2:
        fail("--rerank_beams chooses among beams: give --num_beams 2 or more")
    if not training_args.predict_with_generate or training_args.prediction_loss_only:
        fail("--rerank_beams chooses among generated beams: give --predict_with_generate")
    if training_args.world_size > 1:
        fail("--rerank_beams keeps each article's beams in one process: run it in a single process")
    reranker = None
    if not training_args.do_eval:
        if training_args.do_train or not training_args.do_predict:
            fail("--rerank_beams fits its reranker on the validation split after training: give --do_eval")
        if model_args.model_name_or_path is None:
            fail("--rerank_beams without --do_eval reads the reranker saved beside --model_name_or_path: give it")
        saved = cached_file(
            model_args.model_name_or_path, "beam_reranker.json", _raise_exceptions_for_missing_entries=False
        )
        if saved is None:
            fail(
                f"--rerank_beams without --do_eval reads beam_reranker.json from {model_args.model_name_or_path}: "
                "there is none (fit one with --do_eval)"
            )
        reranker = BeamReranker.load(saved)
        try:
            reranker.check_decoding(decoding)
        except ValueError as error:
            fail(f"--rerank_beams: {error}")
    span = next(processor for processor in processors if isinstance(processor, SourceSpanLogitsProcessor))
    return BeamChoice(tokenizer, data_args.headline_style, span, reranker, decoding)


def fit_reranker(beam_choice: BeamChoice, output_dir: str) -> dict:
    """--rerank_beams after evaluation: the reranker fit on the validation split's beams (saved as beam_reranker.json
    in `output_dir`) and given to `beam_choice`; returns its 5-fold estimate on the split (eval_reranked_*) and how
    many articles it changes there."""
    articles = beam_choice.take()
    if len(articles) < 2:
        fail(f"--rerank_beams fits its reranker on the validation split's beams: {len(articles)} article(s) is too few")
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    features = [article["features"] for article in articles]
    targets = [candidate_targets(article["texts"], article["reference"]) for article in articles]
    allowed = [article["allowed"] for article in articles]
    choices = cross_validated_choices(features, targets, allowed)
    write_beams(articles, Path(output_dir) / "eval_beams.jsonl", choices)
    reranker = BeamReranker.fit(features, targets, beam_choice.decoding)
    reranker.save(Path(output_dir) / "beam_reranker.json")
    beam_choice.reranker = reranker
    chosen = [article["texts"][choice] for article, choice in zip(articles, choices)]
    scores = rouge(chosen, [article["reference"] for article in articles])
    changed = sum(choice != 0 for choice in choices)
    return {**{f"eval_reranked_{name}": value for name, value in scores.items()}, "eval_reranked_changed": changed}


def write_beams(articles: list[dict], path: Path, choices: list[int]) -> None:
    """Each article's beams as a JSON line: texts as edited, scores, which may be chosen (`allowed`: copied up to a
    clause's end), and `choice`: on the validation split the cross-validated reranker's, on the test split the
    one in edited_predictions.txt."""
    with open(path, "w") as file:
        for article, choice in zip(articles, choices):
            line = {name: article[name] for name in ("texts", "scores", "allowed")}
            file.write(json.dumps({**line, "choice": int(choice)}) + "\n")


def main():
    model_args, data_args, training_args = parse_args(ARGUMENTS)
    setup_logging(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args, BUNDLED)
    columns = next(iter(raw.values())).column_names
    text_column = data_args.text_column or ("document" if "document" in columns else columns[0])
    summary_column = data_args.summary_column or ("summary" if "summary" in columns else columns[1 % len(columns)])
    for split in raw:
        require_columns(raw[split], [text_column], "--text_column")
        require_columns(raw[split], [summary_column], "--summary_column")

    # evaluation and prediction generate up to --val_max_target_length tokens, with --num_beams beams
    if training_args.generation_max_length is None:
        training_args.generation_max_length = data_args.val_max_target_length
    if data_args.num_beams is not None:
        training_args.generation_num_beams = data_args.num_beams

    tokenizer = load_tokenizer(model_args, BUNDLED_TOKENIZER)
    max_length = max(data_args.max_source_length, data_args.max_target_length, training_args.generation_max_length)
    config = load_config(model_args, tokenizer, max_length)
    model = load_model(AutoModelForSeq2SeqLM, model_args, config)
    fit_source_positions(model, data_args.max_source_length, model_args.resize_position_embeddings)
    for name in ("decoder_start_token_id", "eos_token_id"):
        if getattr(model.config, name, None) is None:
            fail(f"the model config has no {name}: set it with --config_overrides {name}=ID")
    # the decoding flags go into the generation config, so the saved model generates as it was evaluated
    decoding = {
        "num_beams": data_args.num_beams,
        "length_penalty": data_args.length_penalty,
        "no_repeat_ngram_size": data_args.no_repeat_ngram_size,
        "repetition_penalty": data_args.repetition_penalty,
        "min_new_tokens": data_args.min_target_length,
        "forced_bos_token_id": token_id(tokenizer, data_args.forced_bos_token, "--forced_bos_token"),
    }
    model.generation_config.update(**{name: value for name, value in decoding.items() if value is not None})
    if model_args.cache_encoder_states and model_args.train_encoder_layers:
        fail("--cache_encoder_states needs the whole encoder frozen: the states of layers in training go stale")
    if model_args.freeze_encoder:
        try:
            freeze_encoder(model, model_args.train_encoder_layers)
        except ValueError as error:
            fail(f"--freeze_encoder: {error}")
    elif model_args.cache_encoder_states:
        fail("--cache_encoder_states needs --freeze_encoder: the states of an encoder in training go stale")
    elif model_args.train_encoder_layers:
        fail("--train_encoder_layers needs --freeze_encoder (which freezes the layers below them)")
    if model_args.cache_encoder_states and training_args.dataloader_num_workers > 0:
        fail("--cache_encoder_states runs the encoder in the collator: use it with --dataloader_num_workers 0")
    callbacks = []
    if data_args.early_stopping_patience is not None:
        if not training_args.load_best_model_at_end:
            fail("--early_stopping_patience needs --load_best_model_at_end (and --metric_for_best_model)")
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=data_args.early_stopping_patience))

    preprocess = {
        split: partial(
            tokenize,
            tokenizer=tokenizer,
            data_args=data_args,
            text_column=text_column,
            summary_column=summary_column,
            eos_token_id=model.config.eos_token_id,
            max_target_length=data_args.max_target_length if split == "train" else data_args.val_max_target_length,
        )
        for split in SPLIT_FLAGS
    }
    prepared = tokenize_splits(raw, data_args, training_args, preprocess)

    processors = logits_processors(
        tokenizer, data_args, raw, text_column, summary_column, model.generation_config.eos_token_id
    )
    beam_choice = None
    if data_args.rerank_beams:
        beam_choice = prepare_beam_choice(model, tokenizer, processors, model_args, data_args, training_args)

    def compute_metrics(prediction):
        """The model's own summaries scored (rouge*, the headline counts, gen_len), and the recipe's post-edit of
        them beside, as edited_* (--headline_style, --rerank_beams)."""
        decoded = decoded_texts(tokenizer, prediction.predictions)
        references = decoded_texts(tokenizer, prediction.label_ids)
        predictions = np.where(prediction.predictions != -100, prediction.predictions, tokenizer.pad_token_id)
        lengths = [np.count_nonzero(row != tokenizer.pad_token_id) for row in predictions]
        special = np.array(sorted(set(tokenizer.all_special_ids)))
        generated = [int(np.isin(row, special, invert=True).sum()) for row in predictions]  # the headline's tokens
        quality = headline_quality(decoded, token_counts=generated, min_tokens=data_args.min_target_length)
        metrics = {**rouge(decoded, references), **quality, "gen_len": float(np.mean(lengths))}
        edited = edited_texts(decoded, data_args, beam_choice)
        if edited is not None:
            scores = {**rouge(edited, references), **headline_quality(edited)}
            metrics |= {f"edited_{name}": value for name, value in scores.items()}
        return metrics

    pad = label_pad_token_id(tokenizer, data_args)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=pad)
    if model_args.cache_encoder_states:
        # every split's sources up front, sorted by length (a streamed split's as its batches come)
        sources = [
            ids for split in prepared.values() if isinstance(split, datasets.Dataset) for ids in split["input_ids"]
        ]
        collator = CachedEncoderStates(collator, model, sources, training_args.per_device_eval_batch_size)
    trainer = SummarizationTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.get("train"),
        eval_dataset=prepared.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
        callbacks=callbacks,
        logits_processor=processors,
        beam_choice=beam_choice,
    )

    fit = None if beam_choice is None else lambda metrics: fit_reranker(beam_choice, training_args.output_dir)
    eval_metrics = train_and_evaluate(trainer, prepared, add_eval_metrics=fit)

    if training_args.do_predict:
        output = trainer.predict(prepared["test"], metric_key_prefix="predict")
        written = {}  # file name -> summaries: the model's own, and the recipe's post-edit of them
        if training_args.predict_with_generate:
            generated = decoded_texts(tokenizer, output.predictions)
            edited = edited_texts(generated, data_args, beam_choice)
            written = {"generated_predictions.txt": generated, "edited_predictions.txt": edited}
        if beam_choice is not None:
            articles = beam_choice.take()
            choices = [article["choice"] for article in articles]
            write_beams(articles, Path(training_args.output_dir) / "predict_beams.jsonl", choices)
            output.metrics["predict_reranked_changed"] = sum(choice != 0 for choice in choices)
        trainer.log_metrics("predict", output.metrics)
        trainer.save_metrics("predict", output.metrics)
        if trainer.is_world_process_zero():
            for name, texts in written.items():
                if texts is not None:
                    Path(training_args.output_dir, name).write_text("\n".join(texts) + "\n")

    publish(
        trainer,
        task="summarization",
        dataset=dataset_name(data_args, BUNDLED_DATA),
        metrics=eval_metrics,
        base_model=model_args.model_name_or_path,
    )


if __name__ == "__main__":
    main()
