"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import csv
import signal
import sys
from pathlib import Path

# The `tlab` console script installed beside the interpreter running the tests (the venv's
# bin/), so the tests do not depend on PATH.
TLAB = str(Path(sys.executable).with_name("tlab"))


def assert_refused(result: tuple[int, str, str], out: Path, *expected: str) -> str:
    """A usage error from the ``tlab`` fixture: exit code 2, each ``expected`` text in stderr
    (rich's line wrapping undone), no traceback, nothing written at ``out``; returns stderr."""
    code, stdout, err = result
    assert code == 2, err
    flat = " ".join(err.split())
    for text in expected:
        assert text in flat, err
    assert "Traceback" not in err + stdout
    assert not out.exists()
    return err


def read_csv(path: Path) -> list[dict[str, str]]:
    """Rows of a CSV a run wrote, as dicts of strings."""
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def default_ctrl_c() -> None:
    """``preexec_fn`` of a child whose Ctrl-C a test sends: SIGINT back to its default. A shell
    runs a background job (``make test &``) with SIGINT ignored, which children inherit; Python
    started so never raises KeyboardInterrupt, and the test would measure the shell."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
