"""Named text corpora, downloaded once into a cache directory, atomically, and checked by sha256
(docs/data.md)."""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 16  # bytes read per step while downloading or hashing
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Corpus:
    """A text file with a fixed address and content."""

    name: str
    url: str
    sha256: str
    size: int  # bytes
    description: str


CORPORA: dict[str, Corpus] = {
    "tinyshakespeare": Corpus(
        name="tinyshakespeare",
        url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
            "input.txt",
        sha256="86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        size=1_115_394,
        description="40,000 lines of Shakespeare (Karpathy's char-rnn), 1,115,394 characters",
    ),
}


def cache_dir() -> Path:
    """``$TLAB_CACHE``, else the platform's user cache directory for tlab (not created here)."""
    override = os.environ.get("TLAB_CACHE")
    if override:
        return Path(override).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "tlab" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "tlab"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tlab"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def corpus_path(name: str, url: str | None = None) -> Path:
    """The cached file of corpus ``name``, downloaded (from ``url`` or its own address) when missing
    or corrupt; ``ValueError`` in one line otherwise."""
    if name not in CORPORA:
        raise ValueError(f"task.corpus='{name}' is not known; valid: {', '.join(CORPORA)} "
                         "(or your own file: task.path=FILE)")
    corpus = CORPORA[name]
    path = cache_dir() / f"{corpus.name}.txt"
    if path.is_file() and path.stat().st_size == corpus.size and \
            file_sha256(path) == corpus.sha256:
        return path
    _download(corpus, url or corpus.url, path)
    return path


def _download(corpus: Corpus, url: str, path: Path) -> None:
    """Download ``url`` to ``path`` atomically, checking size and sha256 before the rename."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create the cache directory {path.parent} ({exc.strerror}); "
                         "set TLAB_CACHE=DIR, or use a local copy with task.path=FILE") from None
    print(f"downloading {corpus.name} ({corpus.size:,} bytes) from {url} to {path}",
          file=sys.stderr)

    def download_checked(temp: str) -> None:
        with open(temp, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            shutil.copyfileobj(r, out, CHUNK)
        size, sha256 = Path(temp).stat().st_size, file_sha256(Path(temp))
        if size != corpus.size:
            raise ValueError(
                f"task.corpus={corpus.name}: the download from {url} stopped after {size:,} of "
                f"{corpus.size:,} bytes; it was not used. Try again, or use a local copy with "
                "task.path=FILE")
        if sha256 != corpus.sha256:
            raise ValueError(
                f"task.corpus={corpus.name}: the file from {url} ({size:,} bytes) has sha256 "
                f"{sha256[:12]}..., expected {corpus.sha256[:12]}... "
                f"({corpus.size:,} bytes); it was not used. Try again, or use a local copy "
                "with task.path=FILE")

    try:
        atomic_write(path, download_checked)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise ValueError(
            f"task.corpus={corpus.name}: could not download {url} ({reason}); offline? "
            f"use a local copy with task.path=FILE, or put it at {path}") from None


def atomic_write(path: Path, write: Callable[[str], object]) -> Path:
    """``write(temporary_path)`` in ``path``'s folder, then ``os.replace`` onto ``path``: nobody
    sees a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(handle)
    try:
        write(temp)
        os.replace(temp, path)
    finally:
        Path(temp).unlink(missing_ok=True)
    return path
