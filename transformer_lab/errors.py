"""Exceptions that map to tlab's exit codes (0 ok, 1 check failed/diverged, 2 bad usage, 130)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class ConfigError(ValueError):
    """Bad input or an invalid configuration: a one-or-two-line message, exit code 2."""


class Diverged(RuntimeError):
    """The loss became NaN or infinite: the run stops with status ``diverged``, exit code 1."""
