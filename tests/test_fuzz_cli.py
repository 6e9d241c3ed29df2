"""A fixed-seed bounded run of the CLI fuzzer (benchmarks/fuzz_cli.py): random overrides from
the config schema end in exit 0/1 with a run, or exit 2 with <= 2 lines, no traceback and
nothing written."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1]))
from benchmarks.fuzz_cli import check_outcome, overrides, run_case  # noqa: E402

_cases = itertools.count()


@seed(16)
@settings(max_examples=20, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(args=overrides())
def test_random_overrides_keep_the_cli_contract(tmp_path_factory, args):
    out = tmp_path_factory.getbasetemp() / f"fuzz{next(_cases)}"
    code, stdout, stderr = run_case(args, out)
    check_outcome(code, stdout, stderr, out, args)
