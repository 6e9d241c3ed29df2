"""CLI fuzzer: random Hydra overrides drawn from the config schema (wrong types, out-of-range
values, unknown keys, deletions, odd strings) on a tiny smoke run. Every case must end either
with exit code 0/1 and a run directory, or with exit code 2, at most two lines on stderr, no
traceback and nothing written.

    python -m benchmarks.fuzz_cli --cases 500 --seed 1     # the long run
    tests/test_fuzz_cli.py                                # a fixed-seed bounded run (CI)

A failing case is printed with its overrides (and shrunk by hypothesis).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import logging
import sys
import tempfile
from pathlib import Path

from hypothesis import strategies as st

from transformer_lab.config.schema import GROUPS, SCHEMA

BASE = ["experiment=smoke", "routine.steps=1", "routine.n_batches=1"]
# keys of the smoke config (other experiments' routine keys are left out: unknown there)
KEYS = [k for k in SCHEMA if not k.startswith(("routine.", "task.path", "task.branching",
                                               "task.n_chains", "task.chain_len",
                                               "task.eval_fraction", "pe.", "force"))]
ODD_VALUES = ["abc", "1.5", "-1", "0", "1", "2", "7", "1e9", "1000000000000000000000000000000",
              "true", "false", "null", "[]", "[1,2]", "{}", "nan", "inf", "-inf", "''", "' '",
              "é", "sqrt", "none", "0.5", "-0.0", "${nonexistent}", "${model.d_model}"]
ODD_OVERRIDES = ["=", "a=b=c", "model.d_model==3", "model.zzz=1", "zzz=1", "+model.zzz=1",
                 "~zzz", "model=", "pe=rotary", "pe=", "ffn=mish", "seed=0,1", "++seed=3",
                 "model.d_model=[", "'unterminated", "hydra.run.dir=", "train=",
                 "pe._target_=no.such.Class", "pe._target_=os.getcwd"]


def overrides() -> st.SearchStrategy[list[str]]:
    """One to three overrides: a schema key with an odd value, a deletion, or an odd string."""
    valued = st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS),
                       st.sampled_from(ODD_VALUES))
    deleted = st.sampled_from([f"~{k}" for k in KEYS] + [f"~{g}" for g in GROUPS])
    odd = st.sampled_from(ODD_OVERRIDES)
    return st.lists(st.one_of(valued, valued, deleted, odd), min_size=1, max_size=3)


def check_outcome(code: int, stdout: str, stderr: str, out: Path, args: list[str]) -> None:
    """Raise ``AssertionError`` unless the case ended as the CLI contract says."""
    where = f"tlab run {' '.join(args)}"
    assert "Traceback" not in stdout + stderr, f"{where}: traceback\n{stderr[-2000:]}"
    if code == 2:
        lines = [line for line in stderr.strip().splitlines() if "is now" not in line]
        assert len(lines) <= 2, f"{where}: {len(lines)} lines\n{stderr}"
        assert not out.exists(), f"{where}: exit 2 but {out} was written"
    else:
        assert code in (0, 1), f"{where}: exit code {code}\n{stderr[-2000:]}"
        assert (out / "run.json").exists(), f"{where}: exit {code} without a run"


def run_case(args: list[str], out: Path) -> tuple[int, str, str]:
    """Run the Hydra app in-process on ``BASE + args`` into ``out``; (code, stdout, stderr)."""
    from transformer_lab.app.hydra_app import main
    from transformer_lab.results.console import console, err_console

    console._width = err_console._width = 200  # as the test suite: lines not wrapped at 80
    handlers = list(logging.root.handlers)
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main([*BASE, *args, f"hydra.run.dir={out}"])
    finally:
        logging.root.handlers[:] = handlers
    return code, stdout.getvalue(), stderr.getvalue()


def main(argv: list[str] | None = None) -> int:
    from hypothesis import HealthCheck, given, settings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tlab-fuzz-"))
    counter = itertools.count()
    outcomes: dict[int, int] = {}

    @settings(max_examples=options.cases, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(overrides())
    def case(args: list[str]) -> None:
        out = root / f"case{next(counter)}"
        code, stdout, stderr = run_case(args, out)
        outcomes[code] = outcomes.get(code, 0) + 1
        check_outcome(code, stdout, stderr, out, args)

    from hypothesis import seed

    seed(options.seed)(case)()
    print(f"{sum(outcomes.values())} cases, exit codes {dict(sorted(outcomes.items()))}, "
          f"all as the contract says (runs in {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
