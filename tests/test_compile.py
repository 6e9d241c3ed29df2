"""``train.compile=true`` (issue 31): the trainer runs the model's forward through
``torch.compile`` (Inductor's C++ backend on the CPU) with the numbers of eager training, and
what it saves is the module's own state (no compiled wrapper's key prefix)."""

from __future__ import annotations

import shutil

import pytest
import torch

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.spec import RunSpec
from transformer_lab.model import build_model
from transformer_lab.training.trainer import Trainer

pytestmark = [
    pytest.mark.slow,  # Inductor compiles C++: seconds to a minute on a loaded CPU
    pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "c++", "clang++")),
                       reason="no C++ compiler for Inductor's CPU backend"),
]
TINY = ["experiment=train", "task=lm", "model=tiny", "pe=learned", "task.eval_size=32",
        "train.batch_size=8", "train.lr=1e-2", "train.device=cpu", "train.log_every=1",
        "train.eval_every=0"]


def trainer(compiled: bool) -> Trainer:
    spec = RunSpec.of(compose([*TINY, f"train.compile={str(compiled).lower()}"]))
    task = build_task(spec)
    return Trainer(build_model(spec.with_vocab(task.vocab_size).model, seed=0), task,
                   spec.train, 0)


def test_compiled_training_follows_eager_and_saves_the_modules_state():
    eager, compiled = trainer(False), trainer(True)
    assert compiled.runnable is not compiled.model  # the step calls the compiled module
    expected, result = eager.fit(4), compiled.fit(4)
    # Inductor fuses and reorders fp32 arithmetic: the first loss (no update yet) within a few
    # ulp of a sum over the vocabulary, later ones after Adam steps a little further
    assert result.train_losses[0] == pytest.approx(expected.train_losses[0], rel=1e-6)
    assert result.train_losses == pytest.approx(expected.train_losses, rel=1e-5)
    assert result.first_step_s > result.step_ms / 1e3  # the first step compiled
    state = compiled.state_dict()["model"]
    assert state.keys() == eager.model.state_dict().keys()  # no "_orig_mod." prefix
    rebuilt = trainer(False)
    rebuilt.model.load_state_dict(state)
    batch = eager.task.eval_batch()
    torch.testing.assert_close(rebuilt.evaluate(batch)["loss"], compiled.evaluate(batch)["loss"],
                               rtol=0, atol=0)
