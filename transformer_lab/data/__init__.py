"""Real text for ``task=text``: named corpora downloaded once into a cache directory
(``corpus.py``), the tokenizers that turn text into token ids and the token cache
(``tokenizer.py``).

    corpus_path("tinyshakespeare")      -> Path of the cached, sha256-checked file
    cache_dir()                         -> $TLAB_CACHE, else the platform's user cache dir
    load_tokens(file, "char"|"byte"|"bpe", bpe_vocab_size) -> (token ids, tokenizer): the
        ids a read-only memmap in <cache dir>/tokens, tokenised once (docs/data.md)

Nothing here imports torch; BPE needs the ``tokenizers`` library (extra ``text``).
"""

from transformer_lab.data.corpus import CORPORA, Corpus, cache_dir, corpus_path
from transformer_lab.data.tokenizer import TOKENIZERS, load_tokens

__all__ = ["CORPORA", "TOKENIZERS", "Corpus", "cache_dir", "corpus_path", "load_tokens"]
