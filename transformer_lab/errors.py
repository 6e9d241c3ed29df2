"""Exceptions that map to tlab's exit codes (0 ok, 1 check failed/diverged, 2 bad usage, 130
Ctrl-C, 143 SIGTERM)."""

from __future__ import annotations

import signal

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM (SLURM's time limit, ``timeout``, ``kill``)


class ConfigError(ValueError):
    """Bad input or an invalid configuration: a one-or-two-line message, exit code 2."""


class Diverged(RuntimeError):
    """The loss became NaN or infinite: the run stops with status ``diverged``, exit code 1."""


class Interrupted(KeyboardInterrupt):
    """Training stopped between two steps by SIGINT (Ctrl-C) or SIGTERM, its state kept: status
    ``interrupted``, exit code 130 or 143; the message says where it stopped and how to go on."""

    def __init__(self, message: str, signum: int = signal.SIGINT, step: int | None = None
                 ) -> None:
        super().__init__(message)
        self.signum, self.step = signum, step  # step: where the state was kept (None: not)

    @property
    def exit_code(self) -> int:
        return EXIT_TERMINATED if self.signum == signal.SIGTERM else EXIT_INTERRUPTED
