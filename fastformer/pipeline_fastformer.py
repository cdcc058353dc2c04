"""The "summarization" pipeline that Fastformer encoder-decoder checkpoints declare (transformers 5 has none):
`pipeline("summarization", model=folder, trust_remote_code=True)(text)` gives `[{"summary_text": ...}]`. Generation
settings (`num_beams`, ...) go to the pipeline or to the call."""

from transformers import Pipeline


class SummarizationPipeline(Pipeline):
    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False

    def __call__(self, inputs, **kwargs):
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(summaries) == 1 for summaries in result):
            return [summaries[0] for summaries in result]  # one summary per text: a flat list, as transformers 4
        return result

    def _sanitize_parameters(self, truncation=None, **generate_kwargs):
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        return preprocess_params, generate_kwargs, {}

    def preprocess(self, text, truncation=True):
        if not isinstance(text, str):
            raise ValueError(f"SummarizationPipeline takes a text (or a list of texts), got {type(text).__name__}")
        # the encoder has max_position_embeddings positions, whatever the tokenizer allows
        max_length = min(self.tokenizer.model_max_length, self.model.config.max_position_embeddings)
        return self.tokenizer(text, truncation=truncation, max_length=max_length, return_tensors="pt")

    def _forward(self, model_inputs, **generate_kwargs):
        return {"output_ids": self.model.generate(**model_inputs, **self._prepare_generate_kwargs(generate_kwargs))}

    def postprocess(self, model_outputs):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"summary_text": text.strip()} for text in texts]
