"""Data: corpora, tokenizers and the token cache."""
