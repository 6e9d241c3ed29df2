"""task=text on real text: a corpus downloaded once (from a local HTTP server here), checked,
written atomically; a clear exit 2 offline; char / byte / BPE tokenizers; compare-activations."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import re
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.data import corpus as corpus_module
from transformer_lab.data.corpus import Corpus, corpus_path
from transformer_lab.data.tokenizer import load_tokens
from transformer_lab.tasks import TextTask

SHARED_TEXT = Path(__file__).parents[2] / "shared/data/tinyshakespeare.txt"


def generated_text(n_lines: int = 400) -> str:
    """A few hundred lines of play-like text, the same on every machine."""
    names, words = ["ROMEO", "JULIET", "NURSE"], ["love", "night", "the", "and", "star", "O"]
    return "".join(f"{names[i % 3]}:\n{' '.join(words[(i * j) % 6] for j in range(9))}.\n\n"
                   for i in range(n_lines))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("TLAB_CACHE", str(directory))
    return directory


class Server:
    """A 127.0.0.1 HTTP server answering every GET with ``body`` (cut short when
    ``truncate``), counting the requests."""

    def __init__(self, body: bytes, truncate: bool = False) -> None:
        self.body, self.truncate, self.requests = body, truncate, 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                sent = server.body[: len(server.body) // 2] if server.truncate else server.body
                self.wfile.write(sent)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/input.txt"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator:
    servers: list[Server] = []

    def start(body: bytes, truncate: bool = False) -> Server:
        servers.append(Server(body, truncate))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def small_corpus(monkeypatch) -> tuple[str, bytes]:
    """A corpus 'small' (generated text) registered beside tinyshakespeare."""
    body = generated_text().encode()
    monkeypatch.setitem(corpus_module.CORPORA, "small", Corpus(
        "small", "http://127.0.0.1:9/unused", hashlib.sha256(body).hexdigest(), len(body), ""))
    return "small", body


def closed_port_url() -> str:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/input.txt"


def test_corpus_is_downloaded_once_checked_and_cached(cache, serve, small_corpus):
    name, body = small_corpus
    server = serve(body)
    path = corpus_path(name, server.url)
    assert path == cache / "small.txt" and path.read_bytes() == body
    assert corpus_path(name, server.url) == path and server.requests == 1  # cached
    path.write_bytes(body[:-10])  # corrupt (e.g. edited): fetched again, never used
    assert corpus_path(name, server.url).read_bytes() == body and server.requests == 2
    assert sorted(p.name for p in cache.iterdir()) == ["small.txt"]  # no temp files left


@pytest.mark.parametrize("truncate, expected", [(False, "has sha256"),
                                                (True, "stopped after|IncompleteRead")])
def test_corrupt_or_partial_download_is_never_used(cache, serve, small_corpus, truncate,
                                                   expected):
    name, body = small_corpus
    server = serve(body.replace(b"love", b"hate") if not truncate else body, truncate)
    with pytest.raises(ValueError, match=expected) as error:
        corpus_path(name, server.url)
    assert "task.path=FILE" in str(error.value)
    assert not cache.exists() or list(cache.iterdir()) == []  # no partial file, no temp file


def test_offline_is_exit_2_naming_task_path(tlab, cache, tmp_path):
    out = tmp_path / "run"
    code, _, stderr = tlab("experiment=smoke", "task=text", "arch=decoder",
                           "task.corpus=tinyshakespeare", f"task.url={closed_port_url()}",
                           f"hydra.run.dir={out}")
    flat = " ".join(stderr.split())
    assert code == 2 and "could not download" in flat and "task.path=FILE" in flat
    assert "Traceback" not in stderr and not out.exists()


@pytest.mark.parametrize("overrides, expected", [
    ([], "task.corpus=tinyshakespeare (downloaded once) or task.path=FILE"),
    (["task.corpus=wikitext"], "task.corpus='wikitext' is not known; valid: tinyshakespeare"),
    (["task.path=/no/such/file.txt"], "task.path='/no/such/file.txt' is not a readable file"),
])
def test_bad_text_settings_are_exit_2(tlab, cache, tmp_path, overrides, expected):
    code, _, stderr = tlab("experiment=smoke", "task=text", "arch=decoder", *overrides,
                           f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 2 and expected in " ".join(stderr.split())


def test_tokenizers_round_trip(tmp_path, cache):
    pytest.importorskip("tokenizers")
    text = generated_text() + "naïve café — 東京\n"
    file = tmp_path / "t.txt"
    file.write_text(text, encoding="utf-8")
    sizes = {}
    for kind in ("char", "byte", "bpe"):
        ids, tokenizer = load_tokens(file, kind, bpe_vocab_size=300)
        assert tokenizer.decode(ids) == text and ids.max() < tokenizer.vocab_size
        sizes[kind] = (len(ids), tokenizer.vocab_size)
    assert sizes["char"] == (len(text), len(set(text)))
    assert sizes["byte"] == (len(text.encode()), 256)
    assert sizes["bpe"][1] == 300 and sizes["bpe"][0] < sizes["byte"][0] / 2  # merges pay


def test_text_task_with_bpe(tmp_path, cache):
    pytest.importorskip("tokenizers")
    file = tmp_path / "t.txt"
    file.write_text(generated_text())
    task = TextTask(path=str(file), tokenizer="bpe", bpe_vocab_size=280, seq_len=16,
                    vocab_size=16)  # vocab_size (set by experiments) is not used
    assert task.vocab_size == 280
    batch = task.train_batch(4, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (4, 16) and int(batch.inputs.max()) < 280
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])  # next-token targets


@pytest.fixture
def shakespeare(cache, serve) -> list[str]:
    """Overrides that give task=text the real tinyshakespeare through task.corpus (served by a
    local server from ../shared/data) when that file exists, else a generated text file."""
    if SHARED_TEXT.is_file():
        return ["task.corpus=tinyshakespeare", f"task.url={serve(SHARED_TEXT.read_bytes()).url}"]
    file = cache.parent / "generated.txt"
    file.write_text(generated_text(2000))
    return [f"task.path={file}"]


def test_compare_activations_on_text(tlab, tmp_path, shakespeare):
    out = tmp_path / "run"
    code, stdout, _ = tlab("experiment=compare_activations", "task=text", "arch=decoder",
                           *shakespeare, "routine.steps=4", "task.seq_len=16",
                           f"hydra.run.dir={out}")
    assert code == 0, stdout
    table = pd.read_csv(out / "comparison.csv")
    assert list(table.activation) == ["relu", "gelu"] and (table.final_loss > 0).all()
    summary = pd.read_csv(out / "summary.csv")
    chars = 65 if SHARED_TEXT.is_file() else len(set(generated_text(2000)))
    assert summary.vocab_size[0] == chars  # the characters of the text


@pytest.fixture
def offline(cache, monkeypatch) -> None:
    """No network: Tiny Shakespeare's address refuses connections (a closed local port)."""
    corpus = corpus_module.CORPORA["tinyshakespeare"]
    monkeypatch.setitem(corpus_module.CORPORA, "tinyshakespeare",
                        dataclasses.replace(corpus, url=closed_port_url()))


def tlab_cli(*args: str | Path) -> tuple[int, str]:
    """``tlab ARGS`` in-process: exit code and output (stdout and stderr), lines joined."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, " ".join(result.output.split())


def local_copy(tmp_path: Path) -> Path:
    """Tiny Shakespeare from ../shared/data when there, else a generated play."""
    if SHARED_TEXT.is_file():
        return SHARED_TEXT
    file = tmp_path / "generated.txt"
    file.write_text(generated_text(2000))
    return file


TINY = ["--steps", "2", "model.d_model=16", "model.n_layers=1", "model.d_ff=32",
        "task.seq_len=16", "task.eval_size=8", "train.batch_size=4"]


def test_printing_the_default_config_downloads_nothing(offline, cache):
    code, output = tlab_cli("train", "--cfg", "job")
    assert code == 0 and "corpus: tinyshakespeare" in output, output
    assert not cache.exists()  # nothing fetched, nothing created


def test_offline_default_run_takes_its_own_suggestion_verbatim(offline, cache, tmp_path):
    """The README's `tlab train --pe alibi --seeds N` offline: the error names task.path=FILE;
    that override, added as written (FILE: a local copy), runs; so does putting the file where
    the error says."""
    command = ["train", "--pe", "alibi", "--seeds", "2", *TINY]
    code, error = tlab_cli(*command, "--out", tmp_path / "offline")
    assert code == 2 and "could not download" in error and "Traceback" not in error
    assert not (tmp_path / "offline").exists()
    suggested = re.search(r"use a local copy with (task\.path=FILE)", error).group(1)
    code, output = tlab_cli(*command, suggested.replace("FILE", str(local_copy(tmp_path))),
                            "--out", tmp_path / "with_path")
    assert code == 0, output
    assert len(pd.read_csv(tmp_path / "with_path" / "seeds.csv")) == 2
    assert not (cache / "tinyshakespeare.txt").exists()  # the given path won: no download
    if SHARED_TEXT.is_file():  # the other suggestion: the file where the error says
        shutil.copy(SHARED_TEXT, re.search(r"or put it at (\S+)", error).group(1))
        code, output = tlab_cli(*command, "--out", tmp_path / "cached")
        assert code == 0, output


def test_text_without_a_source_takes_its_own_suggestion(cache, tmp_path):
    command = ["train", "--task", "text", *TINY]
    code, output = tlab_cli(*command, "--out", tmp_path / "none")
    assert code == 2
    suggested = re.search(r"or (task\.path=FILE) \(your own UTF-8 file\)", output).group(1)
    code, output = tlab_cli(*command, suggested.replace("FILE", str(local_copy(tmp_path))),
                            "--out", tmp_path / "run")
    assert code == 0, output
