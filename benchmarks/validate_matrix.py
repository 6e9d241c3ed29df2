"""``tlab validate`` on every built-in component with its defaults: are there false alarms?

    python -m benchmarks.validate_matrix                    # every PE x arch, FFN, block x norm
    python -m benchmarks.validate_matrix --only pe          # pe | ffn | block
    python -m benchmarks.validate_matrix --seeds 3          # step 3 with seeds 0..2 (--seeds)

Each configuration runs ``tlab validate`` as its own process into a fresh directory; a row per
configuration goes to ``benchmarks/validate_matrix.csv`` (appended as each ends): the exit
code, the failing steps and checks, step 3's exact match and solved step (``summary.csv``) and
the wall time. ``pe=none`` is the control: its encoder must fail step 3; a NoPE decoder may
learn reversal from its mask, or not (``expected`` column).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import TLAB

HERE = Path(__file__).resolve().parent
PES = ["none", "sinusoidal", "learned", "sinusoidal_learned", "rope", "alibi", "t5"]
FFNS = ["relu", "gelu", "gelu_tanh", "swish", "leaky_relu", "swiglu", "geglu", "reglu"]
BLOCKS = ["post", "pre", "sandwich", "deepnorm"]
NORM_LAYERS = ["layernorm", "rmsnorm", "batchnorm"]
COLUMNS = ["group", "config", "expected", "exit_code", "outcome", "failed_checks",
           "best_exact_match", "solved_step", "wall_s"]


def configurations(only: str | None) -> list[tuple[str, list[str], str]]:
    """``(group, overrides, expected exit code)`` of every built-in configuration."""
    control = {"encoder": "1 (control)", "decoder": "0 or 1 (control)"}
    rows = [("pe", [f"--pe={pe}", f"--arch={arch}"], control[arch] if pe == "none" else "0")
            for pe in PES for arch in ("encoder", "decoder")]
    rows += [("ffn", [f"--activation={ffn}"], "0") for ffn in FFNS]
    rows += [("block", [f"--norm={block}", f"norm_layer={layer}"], "0")
             for block in BLOCKS for layer in NORM_LAYERS]
    return [row for row in rows if only in (None, row[0])]


def failed_checks(run_dir: Path) -> str:
    path = run_dir / "validation.csv"
    if not path.exists():
        return ""
    with path.open() as f:
        return " ".join(f"step{r['step']}:{r['check']}" for r in csv.DictReader(f)
                        if r["status"] == "FAIL")


def summary(run_dir: Path) -> dict:
    path = run_dir / "summary.csv"
    if not path.exists():
        return {}
    with path.open() as f:
        return next(csv.DictReader(f), {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["pe", "ffn", "block"])
    parser.add_argument("--seeds", type=int, default=1, help="step 3 seeds (--seeds)")
    parser.add_argument("--csv", type=Path, default=HERE / "validate_matrix.csv")
    args = parser.parse_args()
    extra = [] if args.seeds == 1 else [f"routine.seeds={args.seeds}"]
    new = not args.csv.exists()
    with args.csv.open("a", newline="") as f, tempfile.TemporaryDirectory() as tmp:
        writer = csv.DictWriter(f, COLUMNS)
        if new:
            writer.writeheader()
        for index, (group, overrides, expected) in enumerate(configurations(args.only)):
            run_dir = Path(tmp) / str(index)
            start = time.perf_counter()
            code = subprocess.run([TLAB, "validate", *overrides, *extra, "--out",
                                   str(run_dir)], capture_output=True).returncode
            wall = time.perf_counter() - start
            ok = str(code) in expected.split(" (")[0].split(" or ")
            found = summary(run_dir)
            row = {"group": group, "config": " ".join(overrides + extra), "expected": expected,
                   "exit_code": code, "outcome": "as expected" if ok else "FALSE ALARM"
                   if code == 1 and expected == "0" else "unexpected",
                   "failed_checks": failed_checks(run_dir),
                   "best_exact_match": found.get("best_exact_match", ""),
                   "solved_step": found.get("solved_step", ""), "wall_s": round(wall, 1)}
            writer.writerow(row)
            f.flush()
            print(row, file=sys.stderr)


if __name__ == "__main__":
    main()
