"""Run the tlab app on the command line's arguments and stop this process with a signal when a
trainer is about to take step ``STOP_AT`` of its ``STOP_FIT``-th training (``STOP_SIGNAL``:
SIGKILL by default: no cleanup at all; SIGINT: Ctrl-C). Used by tests/test_checkpoints.py to
interrupt a run at a known step in a process of its own."""

from __future__ import annotations

import os
import signal
import sys

from transformer_lab.app.hydra_app import main
from transformer_lab.training.trainer import Trainer

STOP_AT, STOP_FIT = int(os.environ["STOP_AT"]), int(os.environ.get("STOP_FIT", "1"))
SIGNAL = getattr(signal, os.environ.get("STOP_SIGNAL", "SIGKILL"))
fits = 0
original_fit, original_step = Trainer.fit, Trainer.train_step


def fit(self, *args, **kwargs):
    global fits
    fits += 1
    return original_fit(self, *args, **kwargs)


def train_step(self, batch):
    if fits == STOP_FIT and self.step_count + 1 == STOP_AT:
        os.kill(os.getpid(), SIGNAL)
    return original_step(self, batch)


Trainer.fit, Trainer.train_step = fit, train_step
sys.exit(main(sys.argv[1:]))
