"""The token cache of task=text: a file tokenised once, in chunks, into a memmap keyed by its
sha256 and the tokenizer; the same ids, split and windows as tokenising the text in memory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer_lab.data import tokenizer as tokenizer_module
from transformer_lab.data.corpus import file_sha256
from transformer_lab.data.tokenizer import (
    ByteTokenizer,
    CharTokenizer,
    load_tokens,
    token_dtype,
    train_bpe,
)
from transformer_lab.tasks import TextTask

SHARED_TEXT = Path(__file__).parents[2] / "shared/data/tinyshakespeare.txt"

# Multi-byte characters, \r\n and a lone \r (translated to \n, as Path.read_text does), a
# form feed and a line separator (str.splitlines cuts there too).
TEXT = "".join(f"ROMEO {i}:\r\nnaïve café — 東京 {i * 7}\rO night\x0c\u2028star.\n\n"
               for i in range(120))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TLAB_CACHE", str(tmp_path / "cache"))
    tokenizer_module._encoded.cache_clear()  # the in-process cache of earlier loads
    yield tmp_path / "cache" / "tokens"
    tokenizer_module._encoded.cache_clear()


@pytest.fixture
def small_chunks(monkeypatch) -> None:
    """Chunks of 7 bytes: boundaries fall inside characters, lines and \r\n pairs."""
    monkeypatch.setattr(tokenizer_module, "TEXT_CHUNK", 7)


def write(tmp_path: Path, text: str, name: str = "t.txt") -> Path:
    file = tmp_path / name
    file.write_bytes(text.encode("utf-8"))
    return file


def in_memory(text: str, kind: str, bpe_vocab_size: int = 300) -> np.ndarray:
    """The ids the whole text gets when tokenised at once (the reference)."""
    if kind == "char":
        return CharTokenizer.fit(text).encode(text)
    if kind == "byte":
        return ByteTokenizer().encode(text)
    bpe = train_bpe(text, bpe_vocab_size)
    return bpe.encode(text)


@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_chunked_ids_equal_the_whole_text_tokenised_at_once(tmp_path, cache, small_chunks,
                                                            kind):
    if kind == "bpe":
        pytest.importorskip("tokenizers")
    file = write(tmp_path, TEXT)
    text = file.read_text(encoding="utf-8")  # newlines translated
    assert "\r" not in text and "\u2028" in text
    ids, tokenizer = load_tokens(file, kind, bpe_vocab_size=300)
    assert isinstance(ids, np.memmap) and ids.dtype == np.uint16
    np.testing.assert_array_equal(ids, in_memory(text, kind))
    assert tokenizer.decode(ids) == text


def test_memmap_dtype_follows_the_vocabulary(tmp_path, cache):
    assert token_dtype(1 << 16) == np.uint16 and token_dtype((1 << 16) + 1) == np.uint32
    text = "".join(chr(0x10000 + i) for i in range(70_000))  # 70,000 distinct characters
    ids, tokenizer = load_tokens(write(tmp_path, text), "char")
    assert tokenizer.vocab_size == 70_000 and ids.dtype == np.uint32
    assert int(ids.max()) == 69_999 and tokenizer.decode(ids[-3:]) == text[-3:]
    (meta,) = cache.glob("*.json")
    assert json.loads(meta.read_text())["dtype"] == "uint32"


def test_cache_hit_does_not_tokenise_again(tmp_path, cache, monkeypatch):
    first, second = write(tmp_path, TEXT, "a.txt"), write(tmp_path, TEXT, "b.txt")
    ids, _ = load_tokens(first, "char")
    key = file_sha256(first)[:16]
    assert sorted(p.name for p in cache.glob("*.*")) == [f"{key}-char.bin", f"{key}-char.json"]
    stamp = (cache / f"{key}-char.bin").stat().st_mtime_ns

    def no_tokenising(*args: object) -> None:
        raise AssertionError("tokenised again instead of reading the cache")

    monkeypatch.setattr(tokenizer_module, "fit_tokenizer", no_tokenising)
    monkeypatch.setattr(tokenizer_module, "encode_file", no_tokenising)
    tokenizer_module._encoded.cache_clear()  # as a new process would
    again, tokenizer = load_tokens(second, "char")  # another file, same content: shared
    np.testing.assert_array_equal(again, ids)
    assert tokenizer.decode(again) == first.read_text()
    assert (cache / f"{key}-char.bin").stat().st_mtime_ns == stamp
    with pytest.raises(AssertionError, match="tokenised again"):
        load_tokens(first, "byte")  # another tokenizer: another entry


def test_an_unchanged_file_is_not_read_again_and_a_changed_one_is(tmp_path, cache,
                                                                   monkeypatch):
    file = write(tmp_path, TEXT)
    load_tokens(file, "char")
    real_sha256 = tokenizer_module.file_sha256
    monkeypatch.setattr(tokenizer_module, "file_sha256", lambda f: pytest.fail("read again"))
    tokenizer_module._encoded.cache_clear()
    load_tokens(file, "char")  # the same path, size and times: its hash is remembered
    stat = file.stat()
    file.write_bytes(TEXT.replace("O night", "O NIGHT").encode())  # same size...
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ... and modification time
    monkeypatch.setattr(tokenizer_module, "file_sha256", real_sha256)
    tokenizer_module._encoded.cache_clear()
    ids, tokenizer = load_tokens(file, "char")
    assert tokenizer.decode(ids) == file.read_text() and "NIGHT" in tokenizer.decode(ids)


def test_bpe_entry_keeps_its_tokenizer(tmp_path, cache, monkeypatch):
    pytest.importorskip("tokenizers")
    file = write(tmp_path, TEXT)
    ids, tokenizer = load_tokens(file, "bpe", 320)
    monkeypatch.setattr(tokenizer_module, "train_bpe", lambda *a: pytest.fail("trained again"))
    tokenizer_module._encoded.cache_clear()
    again, loaded = load_tokens(file, "bpe", 320)
    np.testing.assert_array_equal(again, ids)
    assert loaded.vocab_size == 320 and loaded.decode(again) == file.read_text()
    assert list(loaded.encode("O night star")) == list(tokenizer.encode("O night star"))
    with pytest.raises(ValueError, match="bpe_vocab_size=200 is too small"):
        load_tokens(file, "bpe", 200)


def test_a_killed_tokenisation_leaves_no_usable_half(tmp_path, cache, monkeypatch):
    file = write(tmp_path, TEXT)
    real_encode = tokenizer_module.encode_file

    def killed(file: Path, tokenizer: object, out) -> int:
        out.write(b"\x01\x00" * 10)  # some ids written, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(tokenizer_module, "encode_file", killed)
    with pytest.raises(KeyboardInterrupt):
        load_tokens(file, "char")
    assert [p.name for p in cache.glob("*") if p.is_file()] == []  # no entry, no temp file
    monkeypatch.setattr(tokenizer_module, "encode_file", real_encode)
    ids, _ = load_tokens(file, "char")
    np.testing.assert_array_equal(ids, in_memory(file.read_text(), "char"))
    # killed between the ids and their description, or the ids cut short: tokenised again
    (bin_path,) = cache.glob("*.bin")
    for damage in ("description", "ids"):
        if damage == "description":
            (cache / bin_path.with_suffix(".json").name).unlink()
        else:
            bin_path.write_bytes(bin_path.read_bytes()[:-4])
        tokenizer_module._encoded.cache_clear()
        ids, _ = load_tokens(file, "char")
        np.testing.assert_array_equal(ids, in_memory(file.read_text(), "char"))


def test_split_and_windows_are_those_of_the_in_memory_tokens(tmp_path, cache):
    text = SHARED_TEXT.read_text() if SHARED_TEXT.is_file() else TEXT * 20
    file = write(tmp_path, text)
    task = TextTask(path=str(file), seq_len=16, eval_size=8, eval_fraction=0.1)
    reference = torch.from_numpy(in_memory(text, "char"))  # (N,) int64
    split = int(len(reference) * 0.9)
    assert len(task.train_tokens) == split and len(task.held_out_tokens) == len(reference) - split
    generator = torch.Generator().manual_seed(3)
    batch = task.train_batch(4, generator)
    starts = torch.randint(0, split - 17, (4,), generator=torch.Generator().manual_seed(3))
    window = reference[:split][starts[:, None] + torch.arange(17)]  # (4, 17)
    assert batch.inputs.dtype == torch.int64
    assert torch.equal(batch.inputs, window[:, :-1]) and torch.equal(batch.targets, window[:, 1:])
    starts = torch.randint(0, len(reference) - split - 17, (8,),
                           generator=torch.Generator().manual_seed(1234))  # data_seed
    held_out = reference[split:][starts[:, None] + torch.arange(17)]
    assert torch.equal(task.eval_batch().inputs, held_out[:, :-1])


def test_not_utf8_names_the_byte_offset_across_chunks(tmp_path, cache, small_chunks):
    file = tmp_path / "bad.txt"
    file.write_bytes("héllo wörld ".encode() * 3 + b"\xff" + b"tail")
    with pytest.raises(ValueError, match=r"is not UTF-8 text \(byte 42: invalid start byte"):
        TextTask(path=str(file), seq_len=4)


def test_a_cache_that_cannot_be_written_still_tokenises(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TLAB_CACHE", str(blocker / "cache"))  # cannot be created
    tokenizer_module._encoded.cache_clear()
    file = write(tmp_path, TEXT * 3)
    task = TextTask(path=str(file), seq_len=8, eval_size=4)
    reference = in_memory(file.read_text(), "char")
    np.testing.assert_array_equal(task.train_tokens, reference[:len(task.train_tokens)])
    assert task.train_batch(2, torch.Generator().manual_seed(0)).inputs.shape == (2, 8)
    tokenizer_module._encoded.cache_clear()
