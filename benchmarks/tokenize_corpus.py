"""What a large text costs ``task=text``: tokenisation throughput (char, BPE), the cache hit of
a second run, and ``tlab train``'s peak resident memory and start-up on a large file.

    python -m benchmarks.tokenize_corpus [--mb 200] [--bpe-mb 20] [--source FILE]
                                         [--no-train] [--keep] [--out FILE.csv]

The corpus is ``--source`` (default: Tiny Shakespeare from the cache directory, downloaded
once) repeated to ``--mb`` megabytes in a temporary folder, deleted at the end unless
``--keep``. Every measurement runs in a fresh process; each tokenizer, and the train runs,
start from an empty cache directory of their own (``TLAB_CACHE``):

- ``tokenise``: ``load_tokens`` on an empty cache (read, tokenizer fitted, ids written to the
  memmap), in MB of text per second (``mb_per_s``), and that process's peak resident memory.
  BPE (trained on the text, then encoded a line at a time) runs on the first ``--bpe-mb`` MB;
- ``cache hit``: ``load_tokens`` again in a new process (the file's hash remembered, the entry
  mapped);
- ``train cold`` / ``train warm``: ``tlab train --task text task.path=F --steps 5`` on an empty
  cache, then again: wall time and peak resident memory of the whole process;
- ``first step``: ``tlab train ... --steps 1`` on the warm cache (start-up, data, one step, the
  final evaluation, the run's files), beside the same command on the 1 MB source file: the
  difference is what the large file costs a second run.

Peak resident memory is the process's ``ru_maxrss`` (what ``/usr/bin/time -v`` reports).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import write_csv

OUT = Path(__file__).resolve().parent / "tokenize_corpus.csv"
COLUMNS = ("measure", "tokenizer", "file_mb", "seconds", "mb_per_s", "peak_rss_mb")
MB = 1_000_000

LOAD = """
import json, resource, sys, time
from pathlib import Path
from transformer_lab.data.tokenizer import load_tokens
start = time.perf_counter()
ids, tokenizer = load_tokens(Path(sys.argv[1]), sys.argv[2], 512)
print(json.dumps({"seconds": time.perf_counter() - start, "tokens": len(ids),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

MEASURED = """
import resource, subprocess, sys, time
start = time.perf_counter()
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
sys.exit(code)
"""


def repeated(source: Path, megabytes: float, path: Path) -> Path:
    """``source`` written again and again into ``path`` up to ``megabytes``, streamed."""
    block, size = source.read_bytes(), 0
    with path.open("wb") as out:
        while size < megabytes * MB:
            out.write(block)
            size += len(block)
    return path


def load(file: Path, kind: str, cache: Path) -> dict:
    """``load_tokens`` in a new process with ``TLAB_CACHE=cache``: seconds, tokens, peak."""
    done = subprocess.run([sys.executable, "-c", LOAD, str(file), kind], check=True,
                          capture_output=True, text=True,
                          env={**os.environ, "TLAB_CACHE": str(cache)})
    return json.loads(done.stdout.splitlines()[-1])


def measured(command: list[str], cache: Path) -> tuple[float, float]:
    """``command`` in a new process with ``TLAB_CACHE=cache``: (wall s, peak resident MB)."""
    done = subprocess.run([sys.executable, "-c", MEASURED, *command], capture_output=True,
                          text=True, env={**os.environ, "TLAB_CACHE": str(cache)})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    wall, peak = done.stdout.split()[-2:]
    return float(wall), float(peak)


def tlab_train(file: Path, steps: int, out: Path) -> list[str]:
    tlab = str(Path(sys.executable).with_name("tlab"))
    return [tlab, "train", "--task", "text", f"task.path={file}", "--steps", str(steps),
            "--out", str(out)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tokenize_corpus",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200, help="size of the corpus (MB)")
    parser.add_argument("--bpe-mb", type=float, default=20, help="BPE on its first N MB")
    parser.add_argument("--source", type=Path, default=None,
                        help="text repeated into the corpus (default: Tiny Shakespeare)")
    parser.add_argument("--no-train", action="store_true", help="skip the tlab train runs")
    parser.add_argument("--keep", action="store_true", help="keep the corpus and caches")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.source is None:
        from transformer_lab.data import corpus_path

        args.source = corpus_path("tinyshakespeare")
    root = Path(tempfile.mkdtemp(prefix="tlab-tokenize-"))
    rows: list[dict] = []

    def row(measure: str, kind: str, mb: float, seconds: float, peak: float) -> None:
        rate = mb / seconds if measure == "tokenise" else None
        rows.append({"measure": measure, "tokenizer": kind, "file_mb": round(mb, 1),
                     "seconds": round(seconds, 2), "mb_per_s": rate and round(rate, 2),
                     "peak_rss_mb": round(peak)})
        print(f"{measure:<11} {kind:<5} {mb:7.1f} MB {seconds:7.2f} s"
              f"{'' if rate is None else f'{rate:8.2f} MB/s':>13} {peak:6.0f} MB peak", flush=True)

    try:
        corpus = repeated(args.source, args.mb, root / "corpus.txt")
        corpus_mb = corpus.stat().st_size / MB
        bpe_corpus = root / "corpus_bpe.txt"
        with corpus.open("rb") as source, bpe_corpus.open("wb") as out:
            out.write(source.read(int(min(args.bpe_mb, args.mb) * MB)))
        for kind, file in (("char", corpus), ("byte", corpus), ("bpe", bpe_corpus)):
            mb = file.stat().st_size / MB
            cache = root / f"cache-{kind}"
            cold = load(file, kind, cache)
            row("tokenise", kind, mb, cold["seconds"], cold["peak_rss_mb"])
            warm = load(file, kind, cache)
            row("cache hit", kind, mb, warm["seconds"], warm["peak_rss_mb"])
        if not args.no_train:
            cache = root / "cache-train"
            for measure in ("train cold", "train warm"):
                wall, peak = measured(tlab_train(corpus, 5, root / measure.replace(" ", "_")),
                                      cache)
                row(measure, "char", corpus_mb, wall, peak)
            wall, peak = measured(tlab_train(corpus, 1, root / "first_step"), cache)
            row("first step", "char", corpus_mb, wall, peak)
            small_cache = root / "cache-small"
            measured(tlab_train(args.source, 1, root / "small_cold"), small_cache)
            wall, peak = measured(tlab_train(args.source, 1, root / "small_warm"), small_cache)
            row("first step", "char", args.source.stat().st_size / MB, wall, peak)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    write_csv(args.out, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
