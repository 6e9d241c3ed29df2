"""tlab's tokenizers (char, byte, BPE) as ``transformers`` fast tokenizers that encode to tlab's ids
and decode back (how each maps: docs/export.md)."""

from __future__ import annotations

import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode as byte_alphabet

from transformer_lab.data.tokenizer import BpeTokenizer, ByteTokenizer, Tokenizer

# The line breaks ``str.splitlines`` splits at (``\r\n`` as one), which tlab's BPE encodes apart.
LINE_BREAKS = r"\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]"


def hf_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A ``transformers`` fast tokenizer with the ids of ``tokenizer`` (char, byte or bpe)."""
    if isinstance(tokenizer, BpeTokenizer):
        model = tokenizers.Tokenizer.from_str(tokenizer.tokenizer.to_str())
        model.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LINE_BREAKS), behavior="merged_with_previous"),
            model.pre_tokenizer])
    elif isinstance(tokenizer, ByteTokenizer):  # a BPE without merges over GPT-2's byte alphabet
        vocab = {char: byte for byte, char in byte_alphabet().items()}
        model = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        model.decoder = decoders.ByteLevel()
    else:  # char: a BPE without merges over the characters
        vocab = {char: i for i, char in enumerate(tokenizer.chars)}
        model = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        model.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=model, clean_up_tokenization_spaces=False)
