"""Small helpers for tlab's forked child processes (a sweep job's child in a launcher worker,
``app/isolation.py``; ``tlab validate``'s step 4 beside steps 1-3, ``routines/validate.py``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies


def flush_output() -> None:
    """Flush stdout, stderr and the logging handlers (before a fork, and before ``os._exit``)."""
    for stream in (sys.stdout, sys.stderr, *logging.root.handlers):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def signal_name(signum: int) -> str:
    """``"SIGKILL"``, or ``"signal 77"`` for a number Python does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def die_with_parent(signum: int, parent: int) -> bool:
    """In a forked child: have the kernel send ``signum`` when the parent dies (Linux; elsewhere
    nothing is set up). False if the parent (pid ``parent``) already died before that took
    effect, so the caller acts as the signal would have."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    return os.getppid() == parent
