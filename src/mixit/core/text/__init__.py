"""Real text for the lm and sentiment tasks: corpora, tokenizers, caching."""
