"""Attention transfer (as LoLCATs, arXiv:2410.10254): a Fastformer converted from a BERT-family model (the teacher)
learns its additive attention from it on unlabeled text. Each stage minimizes the mean unexplained variance of the
matched outputs, sum ||s_i - t_i||^2 / sum ||t_i - mean t||^2 over a batch's real tokens (0: exact), without dropout."""

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel, Trainer, TrainingArguments
from transformers.modeling_outputs import ModelOutput

from .modeling_fastformer import FastformerForSequenceClassification, FastformerModel, FastformerPooler

STAGES = ("layerwise", "end_to_end")
# the end-to-end stage's targets (`AttentionTransfer`)
MATCHED = ("all", "last", "pooled")


@dataclass
class TransferOutput(ModelOutput):
    """loss: the mean of `layer_errors`, the unexplained variance of each matched output (targets,)."""

    loss: torch.Tensor | None = None
    layer_errors: torch.Tensor | None = None


def squared_errors(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(sum ||s - t||^2, sum ||t - mean t||^2) over the real tokens (mask (B, N) true) of (B, N, C) tensors."""
    real = mask.to(torch.bool)
    student, teacher = student[real].float(), teacher[real].float()  # (tokens, C)
    residual = (student - teacher).square().sum()
    total = (teacher - teacher.mean(dim=0)).square().sum()
    return residual, total


def logit_distillation_loss(student_logits, teacher_logits, temperature: float = 1.0, problem_type=None):
    """KL(teacher || student) of (B, num_labels) logits softened at `temperature`, times temperature^2 (Hinton et
    al.), the batch mean: over the classes' softmax, or each label's sigmoid; the squared error for "regression"."""
    if problem_type == "regression":
        return (student_logits.float() - teacher_logits.float()).square().mean()
    if problem_type == "multi_label_classification":  # sigmoid(x) = softmax([x, 0])[0]: a 2-class softmax per label
        student_logits, teacher_logits = (
            torch.stack([x, torch.zeros_like(x)], -1) for x in (student_logits, teacher_logits)
        )
    student_log = (student_logits.float() / temperature).log_softmax(-1)
    teacher_log = (teacher_logits.float() / temperature).log_softmax(-1)
    return (teacher_log.exp() * (teacher_log - student_log)).sum(-1).mean() * temperature**2


def problem_type(config) -> str:
    """A classifier's problem type as transformers infers it for logits (no labels): set, or by `num_labels`."""
    return config.problem_type or ("regression" if config.num_labels == 1 else "single_label_classification")


def teacher_targets(teacher: PreTrainedModel, input_ids, attention_mask) -> tuple[tuple[torch.Tensor, ...], list]:
    """The teacher's hidden states (embeddings, then every layer's) and attention sub-layer outputs, no gradients."""
    attention = [layer.attention for layer in teacher.encoder.layer]
    with torch.no_grad(), _recorded(attention) as attention_outputs:
        hidden_states = teacher(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    return hidden_states.hidden_states, attention_outputs


@contextlib.contextmanager
def _recorded(modules):
    """A list of every call's output (its first element) of `modules` while the context lasts."""
    found = []

    def record(module, args, output):
        found.append(output[0])

    hooks = [module.register_forward_hook(record) for module in modules]
    try:
        yield found
    finally:
        for hook in hooks:
            hook.remove()


class AttentionTransfer(nn.Module):
    """The student and the frozen teacher of one transfer stage; `forward` returns the stage's loss.

    "layerwise": each attention sub-layer learns the teacher's output from the teacher's input (only they train).
    "end_to_end": all but the embeddings learn the teacher's hidden states, weighted `hidden_weight`: after every layer
    (`matched="all"`), the last (`"last"`), or the last and its sentence embedding (`"pooled"`): by the student's
    pooler, or a classifier's by each model's own head's pooler.
    A classifier student adds `logit_weight` x `logit_distillation_loss` at `temperature` against `teacher_head`
    (hidden states, attention mask -> logits) and the cross-entropy of `labels` (-100: none). The models stay in eval
    mode; `state_dict` is the student's only.
    """

    accepts_loss_kwargs = False  # the loss is a mean over layers, not a sum to be divided by the token count

    def __init__(
        self,
        student: FastformerModel | FastformerForSequenceClassification,
        teacher: PreTrainedModel,
        stage: str,
        matched: str = "all",
        teacher_head: nn.Module | None = None,
        logit_weight: float = 1.0,
        temperature: float = 2.0,
        hidden_weight: float = 1.0,
    ):
        super().__init__()
        if stage not in STAGES:
            raise ValueError(f"`stage` must be one of {STAGES}, got {stage!r}")
        if matched not in MATCHED:
            raise ValueError(f"`matched` must be one of {MATCHED}, got {matched!r}")
        if student.config.num_hidden_layers != teacher.config.num_hidden_layers or student.config.share_layers:
            raise ValueError("the student needs one unshared layer per teacher layer (fastformer.conversion makes it)")
        if (teacher_head is None) != (student.base_model is student):
            raise ValueError("a classifier student learns from a `teacher_head`, and only it does")
        if matched == "pooled" and teacher_head is None and student.config.pooler_type not in ("mean", "cls"):
            raise ValueError(
                f'`matched="pooled"` pools both models with the student\'s pooler, which must have no weights of its '
                f'own ("mean" or "cls"), got pooler_type={student.config.pooler_type!r}'
            )
        self.student, self.teacher, self.stage, self.matched = student, teacher, stage, matched
        self.teacher_head, self.temperature = teacher_head, temperature
        self.logit_weight, self.hidden_weight = logit_weight, hidden_weight
        teacher.requires_grad_(False)
        if teacher_head is not None:
            teacher_head.requires_grad_(False)
        if stage == "layerwise":
            student.requires_grad_(False)
            for layer in self.encoder.layers:
                layer.attention.requires_grad_(True)
                layer.attention_output.dense.requires_grad_(True)
        else:
            student.requires_grad_(True)
            self.encoder.embeddings.requires_grad_(False)

    def state_dict(self, *args, **kwargs):
        state = super().state_dict(*args, **kwargs)
        # the teacher's, under the prefix of a module that holds this one
        teachers = tuple(kwargs.get("prefix", "") + name for name in ("teacher.", "teacher_head."))
        for name in [name for name in state if name.startswith(teachers)]:
            del state[name]
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.student.load_state_dict(
            {name.removeprefix("student."): tensor for name, tensor in state_dict.items()}, strict=strict, assign=assign
        )

    @property
    def encoder(self) -> FastformerModel:
        return self.student.base_model

    def train(self, mode: bool = True):
        super().train(mode)
        for model in (self.student, self.teacher, self.teacher_head):
            if model is not None:
                model.eval()
        return self

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs) -> TransferOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden_states, attention_outputs = teacher_targets(self.teacher, input_ids, attention_mask)
        loss = 0.0
        if self.stage == "layerwise":
            pairs = []  # the last layer's first token as the model computes it (`cls_attention_heads`)
            for index, (layer, state, target) in enumerate(zip(self.encoder.layers, hidden_states, attention_outputs)):
                found = layer.attention_sublayer(state, attention_mask, cls=index == self.encoder.cls_layer)[0]
                pairs.append((found, target, attention_mask))
        else:
            outputs = self.student(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            student_states = outputs.hidden_states
            matched = range(1, len(hidden_states)) if self.matched == "all" else [len(hidden_states) - 1]
            pairs = [(student_states[index], hidden_states[index], attention_mask) for index in matched]
            if self.matched == "pooled" and len(input_ids) > 1:  # one sequence has no spread to explain
                # (B, C) embeddings: one "token" per sequence of a (1, B, C) batch; a classifier's by each head's pooler
                poolers = [FastformerPooler(self.student.config)] * 2
                if self.teacher_head is not None:  # the teacher's is frozen, as its hidden states
                    poolers = [self.encoder.pooler, self.teacher_head.pooler]
                last = (student_states[-1], hidden_states[-1])
                pooled = [pool(states, attention_mask)[None] for pool, states in zip(poolers, last)]
                pairs.append((*pooled, torch.ones(pooled[0].shape[:2], device=attention_mask.device)))
            if self.teacher_head is not None:
                with torch.no_grad():
                    teacher_logits = self.teacher_head(hidden_states[-1], attention_mask)
                problem = problem_type(self.student.config)
                distance = logit_distillation_loss(outputs.logits, teacher_logits, self.temperature, problem)
                loss = self.logit_weight * distance
                if labels is not None:  # single-label class ids; -100 (none) counts for nothing
                    cross_entropy = nn.functional.cross_entropy(outputs.logits.float(), labels, reduction="sum")
                    loss = loss + cross_entropy / (labels != -100).sum().clamp(min=1)
        errors = []
        for student_output, target, mask in pairs:
            residual, total = squared_errors(student_output, target, mask)
            errors.append(residual / total.clamp(min=torch.finfo(total.dtype).tiny))
        layer_errors = torch.stack(errors)
        loss = loss + (self.hidden_weight if self.stage == "end_to_end" else 1.0) * layer_errors.mean()
        return TransferOutput(loss=loss, layer_errors=layer_errors.detach())


def transfer_attention(
    student: FastformerModel | FastformerForSequenceClassification,
    teacher: PreTrainedModel,
    stage: str,
    train_dataset,
    args: TrainingArguments,
    data_collator=None,
    resume_from_checkpoint: str | bool | None = None,
    matched: str = "all",
    **losses,
):
    """Train `student` in place through one stage with `transformers.Trainer` (`resume_from_checkpoint` continues
    one); returns its `TrainOutput`. `losses`: `AttentionTransfer`'s teacher_head and loss weights."""
    models = [model for model in (student, teacher, losses.get("teacher_head")) if model is not None]
    trainable = {parameter: parameter.requires_grad for model in models for parameter in model.parameters()}
    trainer = Trainer(
        model=AttentionTransfer(student, teacher, stage, matched, **losses),
        args=args,
        train_dataset=train_dataset,
        data_collator=data_collator,
    )
    try:
        return trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    finally:  # the stage froze what it does not train: give the models back as they came
        for parameter, requires_grad in trainable.items():
            parameter.requires_grad_(requires_grad)


@torch.no_grad()
def transfer_errors(student: FastformerModel, teacher: PreTrainedModel, batches) -> dict[str, list[float]]:
    """Per layer, the unexplained variance of the student against the teacher over `batches` (input_ids and
    attention_mask): "attention", the attention sub-layer on the teacher's input; "hidden", the layer's output."""
    student = student.base_model  # a classifier's encoder
    device = student.device
    sums = {name: torch.zeros(2, student.config.num_hidden_layers, device=device) for name in ("attention", "hidden")}
    was_training = student.training
    student.eval()
    for batch in batches:
        input_ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        hidden_states, attention_outputs = teacher_targets(teacher, input_ids, mask)
        student_states = student(input_ids=input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
        for index, layer in enumerate(student.layers):
            attention = layer.attention_sublayer(hidden_states[index], mask, cls=index == student.cls_layer)[0]
            sums["attention"][:, index] += torch.stack(squared_errors(attention, attention_outputs[index], mask))
            sums["hidden"][:, index] += torch.stack(
                squared_errors(student_states[index + 1], hidden_states[index + 1], mask)
            )
    student.train(was_training)
    return {name: (residual / total).tolist() for name, (residual, total) in sums.items()}  # one sync, at the end


@torch.no_grad()
def embedding_cosine(student: FastformerModel, teacher: PreTrainedModel, batches) -> float:
    """Mean cosine similarity of the student's and the teacher's sentence embeddings, both by the student's pooler."""
    student = student.base_model  # a classifier's encoder
    pooler = student.pooler if student.pooler is not None else FastformerPooler(student.config)
    was_training = student.training
    student.eval()
    cosines = []
    for batch in batches:
        input_ids, mask = batch["input_ids"].to(student.device), batch["attention_mask"].to(student.device)
        ours = pooler(student(input_ids=input_ids, attention_mask=mask).last_hidden_state, mask)
        theirs = pooler(teacher(input_ids=input_ids, attention_mask=mask).last_hidden_state, mask)
        cosines.append(nn.functional.cosine_similarity(ours.float(), theirs.float(), dim=-1))
    student.train(was_training)
    return torch.cat(cosines).mean().item()


@torch.no_grad()
def prediction_agreement(student: FastformerForSequenceClassification, teacher, teacher_head, batches) -> float:
    """The share of texts on which a classifier `student` predicts the class (or labels) `teacher_head` does."""
    was_training = student.training
    student.eval()
    agreed, texts = 0, 0
    for batch in batches:
        input_ids, mask = batch["input_ids"].to(student.device), batch["attention_mask"].to(student.device)
        logits = [
            student(input_ids=input_ids, attention_mask=mask).logits,
            teacher_head(teacher(input_ids=input_ids, attention_mask=mask).last_hidden_state, mask),
        ]
        if problem_type(student.config) == "multi_label_classification":
            ours, theirs = (scores > 0 for scores in logits)
        else:
            ours, theirs = (scores.argmax(-1, keepdim=True) for scores in logits)
        agreed += (ours == theirs).all(-1).sum()
        texts += len(input_ids)
    student.train(was_training)
    return agreed.item() / texts


__all__ = [
    "MATCHED",
    "STAGES",
    "AttentionTransfer",
    "TransferOutput",
    "embedding_cosine",
    "logit_distillation_loss",
    "prediction_agreement",
    "problem_type",
    "transfer_attention",
    "transfer_errors",
]
