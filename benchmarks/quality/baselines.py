"""The Transformer baseline under the paper's pooling: BERT (softmax attention, transformers' BertModel) classifying
from an additive-attention pooling of all its tokens, Fastformer's own pooler, instead of from the [CLS] token.

transformers' BertForSequenceClassification classifies from [CLS], which at the classification table's size and
budget has not learned to summarize the document (docs/RESULTS.md, Reading); the paper's Fastformer pools all tokens.
With this model the Transformer and Fastformer rows differ in their attention only.

Run as scripts/run_classification.py, with this model type registered:

    python -m benchmarks.quality.baselines --model_type bert_additive_pooling --output_dir ... (its other flags)
"""

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
    """BertModel (no [CLS] pooler), Fastformer's additive-attention pooler over its last layer, a linear classifier:
    BertForSequenceClassification with the paper's pooling."""

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
        """As BertForSequenceClassification's; `kwargs` (token_type_ids, position_ids, ...) go to BertModel."""
        outputs = self.bert(input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
        logits = self.classifier(self.dropout(self.pooler(outputs.last_hidden_state, attention_mask)))
        loss = None if labels is None else self.loss_function(labels, logits, self.config)
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                        attentions=outputs.attentions)  # fmt: skip


AutoConfig.register(BertAdditivePoolingConfig.model_type, BertAdditivePoolingConfig)
AutoModelForSequenceClassification.register(BertAdditivePoolingConfig, BertAdditivePoolingForSequenceClassification)


if __name__ == "__main__":
    from scripts import run_classification

    run_classification.main()
