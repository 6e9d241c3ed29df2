"""tlab's tokenizers (char, byte, BPE) as ``transformers`` fast tokenizers that encode to tlab's ids
and decode back (how each maps: docs/export.md)."""

from __future__ import annotations

from typing import Any

from transformer_lab.data.tokenizer import BpeTokenizer, ByteTokenizer, CharTokenizer, Tokenizer
from transformer_lab.errors import ConfigError

# The line breaks ``str.splitlines`` splits at (``\r\n`` as one), which tlab's BPE encodes apart.
LINE_BREAKS = r"\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]"


def byte_alphabet() -> dict[int, str]:
    """GPT-2's ``bytes_to_unicode``: printable Latin-1 bytes stand for themselves, the others for
    ``chr(256 + n)`` in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable},
            **{b: chr(256 + n) for n, b in enumerate(others)}}


def tokenizers_model(tokenizer: Tokenizer) -> Any:
    """The ``tokenizers.Tokenizer`` that encodes as ``tokenizer`` does."""
    import tokenizers
    from tokenizers import Regex, decoders, models, pre_tokenizers

    if isinstance(tokenizer, CharTokenizer):
        vocab = {char: i for i, char in enumerate(tokenizer.chars)}
        model = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        model.decoder = decoders.Fuse()
        return model
    if isinstance(tokenizer, ByteTokenizer):
        vocab = {char: byte for byte, char in byte_alphabet().items()}
        model = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        model.decoder = decoders.ByteLevel()
        return model
    if isinstance(tokenizer, BpeTokenizer):
        model = tokenizers.Tokenizer.from_str(tokenizer.tokenizer.to_str())
        model.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LINE_BREAKS), behavior="merged_with_previous"),
            model.pre_tokenizer])
        return model
    raise ConfigError(f"tokenizer {type(tokenizer).__name__} has no Hugging Face form; known: "
                      "char, byte, bpe")


def hf_tokenizer(tokenizer: Tokenizer) -> Any:
    """A ``transformers`` fast tokenizer with ``tokenizer``'s ids."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tokenizers_model(tokenizer),
                                   clean_up_tokenization_spaces=False)
