"""Where a chunk is born: Markdown split into blocks under their heading paths (``split``), token counting with the
embedding model's own tokenizer (``tokens``, ``counters``), blocks packed into chunks under the model's limit
(``chunker``)."""
