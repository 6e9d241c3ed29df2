"""Do two checkouts give the same outputs? Runs the README's commands with fixed seeds on each
(``PYTHONPATH=CHECKOUT``, this environment's interpreter) and compares every CSV cell and console
line, timing columns and speeds masked; a refactoring should print no difference.

    python -m benchmarks.same_outputs --old /tmp/old --new . --corpus tinyshakespeare.txt
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from benchmarks.common import TLAB

COMMANDS = {  # name -> tlab arguments (``{corpus}``: a local copy of Tiny Shakespeare)
    "validate": ["validate"],
    "validate_sin": ["validate", "--pe", "sinusoidal", "--arch", "decoder"],
    "smoke_rope": ["smoke", "--pe", "rope"],
    "smoke_learned": ["smoke", "--pe", "learned", "model.d_model=16", "train.lr=3e-3"],
    "train": ["train", "--pe", "alibi", "--seeds", "2", "--steps", "30", "task.path={corpus}"],
    "compare": ["compare", "--vary", "pe=rope,alibi", "--seeds", "2", "--steps", "30",
                "task.path={corpus}"],
    "compare_opt": ["compare", "--vary", "optimizer=adamw,muon", "--seeds", "2", "--steps", "20",
                    "task.path={corpus}"],
    "acts": ["compare-activations", "--activations", "relu,gelu", "--seeds", "2", "--steps", "30"],
    "auto": ["compare", "--vary", "pe=rope,alibi", "--seeds", "auto:4", "--steps", "20",
             "task.path={corpus}"],
    "reverse": ["reverse-task", "--norm", "pre"],
}
AFTER = {  # commands that read a run made above (no --out)
    "list": ["list"],
    "sample": ["sample", "train", "--prompt", "ROMEO:", "--tokens", "20", "--seed", "1"],
    "export": ["export", "train", "--to-hf", "hf"],
    "bad_option": ["train", "--lr", "1e-3"],
    "bad_value": ["smoke", "--pe", "nosuch"],
}
TIMING_COLUMN = re.compile(r"wall|_s$|per_s|time|step_ms|mfu|rel_speed|throughput|memory|"
                           r"version|path|host|pid|date", re.I)
SPEED_CELLS = re.compile(r"^(\S+\s+\d+\s+\d+\s+)\d+\s+[\d.]+")  # compare's tok/s, rel
TIMING_TEXT = re.compile(r"\d[\d,]* tok/s|\([\d.]+x\)|\d+(\.\d+)?\s*(s|ms|min)\b|\d+:\d\d|"
                         r"\d{4}-\d\d-\d\d\S*|[\d,]+(\.\d+)?\s+[\d.]+\s+[\d.]+%\s+[\d.]+|"
                         r"[\d.e+]+ FLOP/s")


def run_all(checkout: Path, out: Path, corpus: Path) -> None:
    """Every command into ``out`` (the working directory), its console text in NAME.out."""
    out.mkdir(parents=True)
    shutil.copy(corpus, out / "corpus.txt")
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve()), "COLUMNS": "120"}
    for name, args in [*COMMANDS.items(), *AFTER.items()]:
        args = [a.format(corpus="corpus.txt") for a in args]
        args += ["--out", name] if name in COMMANDS else []
        done = subprocess.run([TLAB, *args], cwd=out, env=env, capture_output=True, text=True)
        text = (done.stdout + done.stderr).replace(str(out), "RUN")
        text = text.replace(str(checkout.resolve()), "CHECKOUT")
        (out / f"{name}.out").write_text(f"exit {done.returncode}\n{text}")


def masked(line: str) -> str:
    """A console line without its timings and speeds, its spaces collapsed (widths vary)."""
    return " ".join(TIMING_TEXT.sub("#", SPEED_CELLS.sub(r"\1#", line)).split())


def differences(old: Path, new: Path) -> list[str]:
    """What differs between two ``run_all`` directories, timings and speeds masked."""
    found = []
    for a in sorted(old.rglob("*.csv")):
        b = new / a.relative_to(old)
        if not b.exists():
            found.append(f"missing: {b.relative_to(new)}")
            continue
        x, y = pd.read_csv(a), pd.read_csv(b)
        if list(x.columns) != list(y.columns):
            found.append(f"columns differ: {a.relative_to(old)}")
            continue
        kept = [c for c in x.columns if not TIMING_COLUMN.search(str(c))]
        x, y = (f[kept].astype(str).replace(TIMING_TEXT, "#", regex=True) for f in (x, y))
        if x.shape != y.shape or not x.equals(y):
            found.append(f"values differ: {a.relative_to(old)}")
    for a in sorted(old.glob("*.out")):
        lines = [[masked(line) for line in f.read_text().splitlines() if " eta " not in line]
                 for f in (a, new / a.name)]
        found += [f"{a.name}: {line}" for line in difflib.unified_diff(*lines, lineterm="", n=0)
                  if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="a checkout (the reference)")
    parser.add_argument("--new", type=Path, default=Path("."), help="a checkout (default: .)")
    parser.add_argument("--corpus", type=Path, required=True, help="a copy of tinyshakespeare")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("old", "new"):
            run_all(getattr(args, side), Path(tmp) / side, args.corpus)
        found = differences(Path(tmp) / "old", Path(tmp) / "new")
    print("\n".join(found) or "same outputs (timings masked)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
