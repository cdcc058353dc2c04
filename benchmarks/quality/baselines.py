"""The Transformer under the paper's pooling, which differs from Fastformer in its attention only; run as
scripts/run_classification.py with this model type registered, scripts/ on the path for the script's neighbours:
PYTHONPATH=scripts python -m benchmarks.quality.baselines FLAGS"""

from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig, BertModel, BertPreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from fastformer.modeling_fastformer import FastformerPooler


@strict
class BertAdditivePoolingConfig(BertConfig):
    model_type = "bert_additive_pooling"
    pooler_type: str = "additive"  # FastformerPooler's switch: the paper's additive-attention pooling


class BertAdditivePoolingForSequenceClassification(BertPreTrainedModel):
    """BertForSequenceClassification with Fastformer's additive-attention pooler in place of [CLS]'s."""

    config_class = BertAdditivePoolingConfig
    accepts_loss_kwargs = False  # the loss is the batch's mean, as Fastformer's (the Trainer scales it)

    def __init__(self, config: BertAdditivePoolingConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.pooler = FastformerPooler(config)
        dropout = config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs) -> SequenceClassifierOutput:
        outputs = self.bert(input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
        logits = self.classifier(self.dropout(self.pooler(outputs.last_hidden_state, attention_mask)))
        loss = None if labels is None else self.loss_function(labels, logits, self.config)
        hidden_states, attentions = outputs.hidden_states, outputs.attentions
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=hidden_states, attentions=attentions)


# exist_ok: run as a script in a process that imported it (a test), the module registers its classes again
AutoConfig.register(BertAdditivePoolingConfig.model_type, BertAdditivePoolingConfig, exist_ok=True)
AutoModelForSequenceClassification.register(
    BertAdditivePoolingConfig, BertAdditivePoolingForSequenceClassification, exist_ok=True
)


if __name__ == "__main__":
    from scripts import run_classification

    run_classification.main()
