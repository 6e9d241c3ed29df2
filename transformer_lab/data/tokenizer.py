"""Tokenizers for ``task=text`` (``char``, ``byte``, ``bpe``: byte-level BPE trained on the text
with ``tokenizers``), all round-tripping, and the token cache of ``load_tokens`` (docs/data.md)."""

from __future__ import annotations

import codecs
import contextlib
import functools
import hashlib
import io
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from transformer_lab.data.corpus import atomic_write, cache_dir, file_sha256
from transformer_lab.errors import ConfigError

TOKENIZERS = ("char", "byte", "bpe")
BYTE_ALPHABET = 256


class CharTokenizer:
    """Characters -> their rank among the text's sorted distinct characters."""

    name = "char"

    def __init__(self, chars: list[str]) -> None:
        self.chars = chars
        self.vocab_size = len(chars)
        codes = np.array([ord(c) for c in chars], dtype=np.int64)
        # code point -> id; -1 for a character outside the vocabulary (the last entry stands
        # for every code point above the largest)
        self._ids = np.full(int(codes.max(initial=-1)) + 2, -1, dtype=np.int32)
        self._ids[codes] = np.arange(len(chars), dtype=np.int32)

    @classmethod
    def fit(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # (N,)
        ids = self._ids[np.minimum(codes, len(self._ids) - 1)]
        if (ids < 0).any():
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


Tokenizer = CharTokenizer | ByteTokenizer | BpeTokenizer  # encode: text -> (N,) int64 ids


def train_bpe(text: str | Iterable[str], vocab_size: int) -> BpeTokenizer:
    """Byte-level BPE with ``vocab_size`` tokens trained on ``text`` (a string, or its lines
    as ``str.splitlines(keepends=True)`` cuts them; deterministic)."""
    try:
        import tokenizers as tk
    except ImportError as exc:
        raise ValueError("task.tokenizer=bpe needs the tokenizers library: pip install "
                         "'transformer_lab[text]' (or use task.tokenizer=char|byte)") from exc
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     special_tokens=[])
    lines = text.splitlines(keepends=True) if isinstance(text, str) else text
    tokenizer.train_from_iterator(lines, trainer)
    return BpeTokenizer(tokenizer)


TEXT_CHUNK = 1 << 22  # bytes of text tokenised per step (4 MiB)
BPE_LINES = 4096  # lines encoded per call (BPE: of the library's batch encoder)
TOKENS_DIR = "tokens"  # <cache dir>/tokens/<sha256 prefix>-<tokenizer>.bin and .json


class NotUtf8Error(ValueError):
    """The file is not UTF-8: ``start`` is the offending byte's offset in the file."""

    def __init__(self, start: int, reason: str) -> None:
        super().__init__(f"byte {start}: {reason}")
        self.start, self.reason = start, reason


def text_lines(file: Path) -> Iterator[list[str]]:
    """The lines of ``file`` (``read_text().splitlines(keepends=True)``, newlines translated the
    same way), a chunk at a time; ``NotUtf8Error`` where it is not UTF-8."""
    decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(),
                                           translate=True)
    offset, carry = 0, ""  # bytes read before this block; the line that may go on
    with open(file, "rb") as source:
        while True:
            block = source.read(TEXT_CHUNK)
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:  # exc.object: bytes held back + this block
                raise NotUtf8Error(offset + exc.start - (len(exc.object) - len(block)),
                                   exc.reason) from None
            offset += len(block)
            lines = (carry + text).splitlines(keepends=True)
            carry = lines.pop() if block and lines else ""  # may go on in the next block
            if lines:
                yield lines
            if not block:
                return


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (vocabulary up to 65,536 tokens), else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def fit_tokenizer(file: Path, kind: str, bpe_vocab_size: int) -> Tokenizer:
    """The tokenizer of ``file`` (char: its characters; bpe: trained on its lines), from one pass
    over it, a chunk at a time."""
    if kind == "char":
        seen = np.zeros(0x110000, dtype=bool)  # one flag per Unicode code point
        for lines in text_lines(file):
            seen[np.frombuffer("".join(lines).encode("utf-32-le"), dtype=np.uint32)] = True
        return CharTokenizer([chr(code) for code in np.flatnonzero(seen)])
    if kind == "byte":
        return ByteTokenizer()
    return train_bpe(itertools.chain.from_iterable(text_lines(file)), bpe_vocab_size)


def encode_file(file: Path, tokenizer: Tokenizer, out: BinaryIO) -> int:
    """Write ``file``'s token ids to ``out`` as ``token_dtype``, a few whole lines at a time;
    returns the number of ids."""
    dtype, count = token_dtype(tokenizer.vocab_size), 0
    for lines in text_lines(file):
        for i in range(0, len(lines), BPE_LINES):
            ids = tokenizer.encode("".join(lines[i:i + BPE_LINES])).astype(dtype)
            out.write(ids.tobytes())
            count += len(ids)
    return count


def tokenizer_spec(tokenizer: Tokenizer | None) -> str | None:
    """A task's tokenizer as JSON text (None for a task without one, e.g. synthetic tokens)."""
    if tokenizer is None:
        return None
    data = {"kind": tokenizer.name}
    if isinstance(tokenizer, CharTokenizer):
        data["chars"] = "".join(tokenizer.chars)
    elif isinstance(tokenizer, BpeTokenizer):
        data["tokenizer"] = tokenizer.tokenizer.to_str()
    elif not isinstance(tokenizer, ByteTokenizer):
        raise ConfigError(f"tokenizer {type(tokenizer).__name__} cannot be kept with the "
                          "weights; known: char, byte, bpe")
    return json.dumps(data)


def tokenizer_from_spec(spec: str | None) -> Tokenizer | None:
    """The tokenizer ``tokenizer_spec`` wrote (None where there was none)."""
    if not spec:
        return None
    try:  # JSON from a file made elsewhere: data only
        data = json.loads(spec)
        kind = data["kind"]
        if kind == "char":
            return CharTokenizer(list(data["chars"]))
        if kind == "bpe":
            import tokenizers

            return BpeTokenizer(tokenizers.Tokenizer.from_str(data["tokenizer"]))
    except Exception as exc:
        raise ConfigError(f"the tokenizer kept with the weights cannot be read "
                          f"({type(exc).__name__})") from None
    if kind != "byte":
        raise ConfigError(f"the tokenizer kept with the weights is of kind {kind!r}; "
                          "known: char, byte, bpe")
    return ByteTokenizer()


@dataclass(frozen=True)
class TokenFile:
    """Token ids ``[start, stop)`` of a cache file, read a window at a time with ``seek`` and
    ``readinto`` (indexing the memmap would bring whole pages into memory)."""

    path: str
    dtype: np.dtype
    start: int
    stop: int

    @classmethod
    def of(cls, ids: np.memmap) -> TokenFile:
        return cls(str(ids.filename), ids.dtype, ids.offset // ids.dtype.itemsize,
                   ids.offset // ids.dtype.itemsize + len(ids))

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, part: slice) -> TokenFile:
        start, stop, _ = part.indices(len(self))  # step 1
        return TokenFile(self.path, self.dtype, self.start + start, self.start + max(start, stop))

    def windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """``(len(starts), length)`` int64: the ``length`` ids from each start on."""
        out = np.empty((len(starts), length), self.dtype)
        with open(self.path, "rb", buffering=0) as file:
            for row, start in zip(out, starts.tolist(), strict=True):
                file.seek((self.start + start) * self.dtype.itemsize)
                if file.readinto(row) != row.nbytes:
                    raise ValueError(f"{self.path} ends before token {self.start + start + length}")
        return out.astype(np.int64)


def _mapped(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:  # mmap cannot map an empty file
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def content_sha256(file: Path) -> str:
    """The sha256 of ``file``, remembered in ``<cache dir>/tokens/seen`` by its path, inode, size
    and modification and change times, so an unchanged file is not read again."""
    stat = file.stat()
    seen = hashlib.sha256(repr((str(file.resolve()), stat.st_ino, stat.st_size,
                                stat.st_mtime_ns, stat.st_ctime_ns)).encode()).hexdigest()
    note = cache_dir() / TOKENS_DIR / "seen" / seen[:32]
    with contextlib.suppress(OSError):
        remembered = note.read_text(encoding="ascii")
        if len(remembered) == 64:
            return remembered
    sha256 = file_sha256(file)
    with contextlib.suppress(OSError):  # a read-only cache: hashed again next time
        atomic_write(note, lambda temp: Path(temp).write_text(sha256, encoding="ascii"))
    return sha256


@functools.lru_cache(maxsize=8)
def _encoded(path: str, mtime_ns: int, size: int, kind: str,
             bpe_vocab_size: int) -> tuple[np.ndarray, Tokenizer]:
    file = Path(path)
    sha256 = content_sha256(file)
    label = f"bpe{bpe_vocab_size}" if kind == "bpe" else kind  # <sha256[:16]>-<label>.bin, .json
    stem = cache_dir() / TOKENS_DIR / f"{sha256[:16]}-{label}"
    bin_path, meta_path = stem.with_suffix(".bin"), stem.with_suffix(".json")
    with contextlib.suppress(Exception):  # a complete entry; missing or damaged: tokenise again
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        dtype = np.dtype(meta["dtype"])
        if meta["sha256"] == sha256 and bin_path.stat().st_size == meta["tokens"] * dtype.itemsize:
            return _mapped(bin_path, dtype, int(meta["tokens"])), tokenizer_from_spec(meta["spec"])
    tokenizer = fit_tokenizer(file, kind, bpe_vocab_size)
    dtype = token_dtype(tokenizer.vocab_size)

    def write_ids(temp: str) -> None:
        with open(temp, "wb") as out:
            encode_file(file, tokenizer, out)

    try:  # ids first, then the entry's description: a killed run leaves no usable half
        count = atomic_write(bin_path, write_ids).stat().st_size // dtype.itemsize
        meta = json.dumps({"source": path, "sha256": sha256, "tokenizer": kind,
                           "vocab_size": tokenizer.vocab_size, "dtype": dtype.name,
                           "tokens": count, "spec": tokenizer_spec(tokenizer)})
        atomic_write(meta_path, lambda temp: Path(temp).write_text(meta, encoding="utf-8"))
    except OSError:  # a read-only cache: the ids in memory instead (token_dtype, not int64)
        ids = io.BytesIO()
        encode_file(file, tokenizer, ids)
        return np.frombuffer(ids.getbuffer(), dtype), tokenizer
    return _mapped(bin_path, dtype, count), tokenizer


def load_tokens(file: Path, kind: str = "char",
                bpe_vocab_size: int = 512) -> tuple[np.ndarray, Tokenizer]:
    """Token ids ``(N,)`` of the UTF-8 ``file`` (a read-only memmap of ``token_dtype``, or an array
    where the cache cannot be written) and their tokenizer; ``NotUtf8Error`` for a file not
    UTF-8."""
    if kind not in TOKENIZERS:
        raise ValueError(f"task.tokenizer='{kind}' is not known; valid: {', '.join(TOKENIZERS)}")
    if kind == "bpe" and int(bpe_vocab_size) <= BYTE_ALPHABET:
        raise ValueError(f"task.bpe_vocab_size={bpe_vocab_size} is too small: byte-level BPE "
                         f"starts from the {BYTE_ALPHABET} byte values; use more (e.g. 512)")
    stat = Path(file).stat()
    return _encoded(str(Path(file).resolve()), stat.st_mtime_ns, stat.st_size, kind,
                    int(bpe_vocab_size))
