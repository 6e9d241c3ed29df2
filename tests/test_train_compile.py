"""``train.compile``: refused with exit 2 where torch.compile cannot run, skipped (and said so)
where it cannot pay, and otherwise kept only if the compiled step times faster. torch.compile
itself is replaced by a stand-in here (a real compile takes tens of seconds; the benchmark
``benchmarks/multiseed.py --compile`` runs it)."""

from __future__ import annotations

import shutil
import time

import pytest
import torch
from helpers import assert_refused

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.training import compile as compile_module
from transformer_lab.training.multiseed import build_seeded_models, fit_seeds
from transformer_lab.training.trainer import Trainer


def test_without_a_cxx_compiler_train_compile_true_exits_2(tlab, tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = tmp_path / "run"
    assert_refused(tlab("experiment=smoke", "train.compile=true", f"hydra.run.dir={out}"),
                   out, "train.compile=true cannot run here", "needs a C++ compiler")


def test_train_compile_must_be_a_bool(tlab, tmp_path):
    out = tmp_path / "run"
    assert_refused(tlab("experiment=smoke", "train.compile=maybe", f"hydra.run.dir={out}"),
                   out, "train.compile")


def test_pays_only_for_flop_bound_steps_long_enough_to_win_back_the_compile():
    overhead_bound = compile_module.pays(0.001, 10**6, work=8 * 4 * 8, device="cpu")
    assert overhead_bound[0] is False and "overhead-bound" in overhead_bound[1]
    short = compile_module.pays(0.010, 100, work=64 * 16 * 64, device="cpu")
    assert short[0] is False and "100 steps" in short[1]
    long = compile_module.pays(0.010, 100_000, work=64 * 16 * 64, device="cpu")
    assert long[0] is True
    assert compile_module.pays(0.001, 10**6, work=8 * 4 * 8, device="cuda")[0] is True


class FakeCompile:
    """Stands in for torch.compile: the model's own forward (its class's, so an instance's
    slowed-down ``forward`` is bypassed), ``delay`` seconds slower per call."""

    def __init__(self, delay: float) -> None:
        self.delay, self.calls = delay, 0

    def __call__(self, model, dynamic=False):
        def forward(inputs):
            self.calls += 1
            time.sleep(self.delay)
            return type(model).forward(model, inputs)

        return forward


def slowed(model, delay: float):
    """``model`` whose eager forward sleeps ``delay`` seconds per call."""
    plain = model.forward
    model.forward = lambda *args, **kwargs: (time.sleep(delay), plain(*args, **kwargs))[1]
    return model


def small_config(*extra: str):
    cfg = compose(["experiment=smoke", "train.batch_size=8", "train.compile=true",
                   "train.eval_every=0", *extra])
    return cfg, build_task(cfg)


@pytest.mark.parametrize("eager_delay, compiled_delay, verdict",
                         [(0.03, 0.0, "kept"), (0.0, 0.03, "back to eager")])
def test_the_compiled_step_is_kept_only_if_it_runs_faster(monkeypatch, capsys, eager_delay,
                                                         compiled_delay, verdict):
    monkeypatch.setattr(compile_module, "pays", lambda *args: (True, "stand-in"))
    fake = FakeCompile(compiled_delay)
    monkeypatch.setattr(torch, "compile", fake)
    cfg, task = small_config()
    model = slowed(build_seeded_models(cfg, [0])[0], eager_delay)
    trainer = Trainer(model, task, cfg.train, cfg.model.d_model, 0)
    trainer.fit(20)
    out = " ".join(capsys.readouterr().out.split())
    assert "train.compile: compiled the training step (stand-in) in" in out
    assert f"eager: {verdict}" in out
    assert fake.calls >= 5
    calls = fake.calls
    trainer.train_step(task.train_batch(8, trainer.generator))
    assert (fake.calls > calls) == (verdict == "kept")


def test_an_overhead_bound_run_skips_the_compile_and_says_why(monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("compiled"))
    cfg, task = small_config()
    models = build_seeded_models(cfg, [0, 1])
    fit_seeds(cfg, [0, 1], 20, task=task, models=models, engine="stacked")
    Trainer(build_seeded_models(cfg, [0])[0], task, cfg.train, cfg.model.d_model, 0).fit(8)
    out = " ".join(capsys.readouterr().out.split())
    assert "train.compile: skipped for the 2-seed stacked step (an overhead-bound step" in out
    assert "train.compile: skipped for the training step (8 steps are too few" in out


def test_the_stacked_engine_compiles_its_stacked_model_where_it_pays(monkeypatch, capsys):
    monkeypatch.setattr(compile_module, "pays", lambda *args: (True, "stand-in"))
    fake = FakeCompile(0.0)
    monkeypatch.setattr(torch, "compile", fake)
    cfg, task = small_config()
    compiled = fit_seeds(cfg, [0, 1], 20, task=task, engine="stacked")
    monkeypatch.setattr(compile_module, "pays", lambda *args: (False, "stand-in"))
    eager = fit_seeds(cfg, [0, 1], 20, task=task, engine="stacked")
    assert "compiled the 2-seed stacked step" in " ".join(capsys.readouterr().out.split())
    assert fake.calls >= 5  # at least the timed compiled steps
    for a, b in zip(compiled, eager, strict=True):  # the stand-in computes the same numbers
        assert a.train_losses == b.train_losses
