"""Real text for ``task=text``: named corpora downloaded once (``corpus``), tokenizers and the token
cache (``tokenizer``; docs/data.md). No torch here."""

from transformer_lab.data.corpus import CORPORA, Corpus, cache_dir, corpus_path
from transformer_lab.data.tokenizer import TOKENIZERS, load_tokens

__all__ = ["CORPORA", "TOKENIZERS", "Corpus", "cache_dir", "corpus_path", "load_tokens"]
