"""Tokenizers for ``task=text`` (``task.tokenizer=char|byte|bpe``).

    char  one token per character; the vocabulary is the text's characters, sorted
    byte  one token per UTF-8 byte; the vocabulary is the 256 byte values
    bpe   byte-level BPE (GPT-2 style) trained on the text itself with the ``tokenizers``
          library, ``bpe_vocab_size`` tokens (the 256 bytes plus merges); the trained
          tokenizer and the text's token ids are cached in the cache directory, keyed by the
          text's sha256 and the vocabulary size, so a second run loads them

Every tokenizer round-trips: ``decode(encode(text)) == text``. ``load_tokens`` also keeps the
last few encodings in memory, so building the same task again (one per activation in
``compare-activations``, one per length in ``extrapolate``) does not tokenize again.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from transformer_lab.data.corpus import cache_dir

TOKENIZERS = ("char", "byte", "bpe")
BYTE_ALPHABET = 256


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> np.ndarray: ...  # (N,) int64

    def decode(self, ids: np.ndarray | list[int]) -> str: ...


class CharTokenizer:
    """Characters -> their rank among the text's sorted distinct characters."""

    name = "char"

    def __init__(self, chars: list[str]) -> None:
        self.chars = chars
        self.vocab_size = len(chars)
        self._codes = np.array([ord(c) for c in chars], dtype=np.uint32)  # sorted

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (N,)
        ids = np.searchsorted(self._codes, codes)
        if len(ids) and (ids.max() >= self.vocab_size or (self._codes[ids] != codes).any()):
            raise ValueError("the text has characters outside this tokenizer's vocabulary")
        return ids.astype(np.int64)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)


class ByteTokenizer:
    """UTF-8 bytes -> 0..255."""

    name = "byte"
    vocab_size = BYTE_ALPHABET

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BpeTokenizer:
    """Byte-level BPE from the ``tokenizers`` library (trained by :func:`train_bpe`)."""

    name = "bpe"

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.get_vocab_size())

    def encode(self, text: str) -> np.ndarray:
        lines = text.splitlines(keepends=True)  # encoded in parallel by the library
        encodings = self.tokenizer.encode_batch(lines)
        return np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


def _tokenizers_library() -> object:
    try:
        import tokenizers
    except ImportError as exc:
        raise ValueError("task.tokenizer=bpe needs the tokenizers library: pip install "
                         "'transformer_lab[text]' (or use task.tokenizer=char|byte)") from exc
    return tokenizers


def train_bpe(text: str, vocab_size: int) -> BpeTokenizer:
    """Byte-level BPE with ``vocab_size`` tokens trained on ``text`` (deterministic)."""
    tk = _tokenizers_library()
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     special_tokens=[])
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer)
    return BpeTokenizer(tokenizer)


def atomic_write(path: Path, write: Callable[[str], object]) -> Path:
    """``write(temporary_path)`` in ``path``'s folder, then ``os.replace`` onto ``path``: a
    reader (or a process killed while writing) never sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(handle)
    try:
        write(temp)
        os.replace(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)
    return path


def _save_ids(path: str, ids: np.ndarray) -> None:
    with open(path, "wb") as file:
        np.save(file, ids.astype(np.uint32))


def cached_bpe(text: str, vocab_size: int) -> tuple[np.ndarray, BpeTokenizer]:
    """Token ids of ``text`` and its BPE tokenizer, from the cache directory when there
    (``bpe-<sha256 of text>-<vocab>.json`` and ``.npy``), else trained and saved there."""
    if vocab_size <= BYTE_ALPHABET:
        raise ValueError(f"task.bpe_vocab_size={vocab_size} is too small: byte-level BPE "
                         f"starts from the {BYTE_ALPHABET} byte values; use more (e.g. 512)")
    tk = _tokenizers_library()
    key = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    stem = cache_dir() / f"bpe-{key}-{vocab_size}"
    json_path, ids_path = stem.with_suffix(".json"), stem.with_suffix(".npy")
    if json_path.is_file() and ids_path.is_file():
        try:
            tokenizer = BpeTokenizer(tk.Tokenizer.from_file(str(json_path)))
            return np.load(ids_path).astype(np.int64), tokenizer
        except Exception:  # a damaged cache entry: train again and overwrite it
            pass
    tokenizer = train_bpe(text, vocab_size)
    ids = tokenizer.encode(text)
    try:
        atomic_write(json_path, lambda temp: tokenizer.tokenizer.save(temp))
        atomic_write(ids_path, lambda temp: _save_ids(temp, ids))
    except OSError:  # a read-only cache still gives a working (uncached) tokenizer
        pass
    return ids, tokenizer


@functools.lru_cache(maxsize=8)
def _encoded(path: str, mtime_ns: int, size: int, kind: str,
             bpe_vocab_size: int) -> tuple[np.ndarray, Tokenizer]:
    text = Path(path).read_text(encoding="utf-8")
    if kind == "bpe":
        ids, tokenizer = cached_bpe(text, bpe_vocab_size)
    else:
        tokenizer = CharTokenizer.fit(text) if kind == "char" else ByteTokenizer()
        ids = tokenizer.encode(text)
    return ids, tokenizer  # shared by the tasks built from the same file: do not modify


def load_tokens(file: Path, kind: str = "char",
                bpe_vocab_size: int = 512) -> tuple[np.ndarray, Tokenizer]:
    """Token ids ``(N,)`` of the UTF-8 text ``file`` and the tokenizer that made them."""
    if kind not in TOKENIZERS:
        raise ValueError(f"task.tokenizer='{kind}' is not known; valid: {', '.join(TOKENIZERS)}")
    stat = Path(file).stat()
    return _encoded(str(Path(file).resolve()), stat.st_mtime_ns, stat.st_size, kind,
                    int(bpe_vocab_size))
