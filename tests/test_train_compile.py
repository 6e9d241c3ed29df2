"""``train.compile``: refused with exit 2 where torch.compile cannot run, skipped (and said so)
where it cannot pay, and otherwise kept only if the compiled step times faster. torch.compile
itself is replaced by a stand-in here (a real compile takes tens of seconds; the benchmark
``benchmarks/multiseed.py --compile`` runs it)."""

from __future__ import annotations

import math
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
    slowed-down ``forward`` is bypassed; of a ``ModelLoss``, its model's, then the loss),
    ``delay`` seconds slower per call."""

    def __init__(self, delay: float) -> None:
        self.delay, self.calls = delay, 0

    def __call__(self, module, **settings):
        model = module.model if isinstance(module, compile_module.ModelLoss) else module

        def forward(inputs, *targets):
            self.calls += 1
            time.sleep(self.delay)
            out = type(model).forward(model, inputs)
            return module.loss(out, *targets) if model is not module else out

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


def small_benchmark_model(pe: str = "learned"):
    """The ``small`` step of ``benchmarks/multiseed.py`` (learned PE, pre-norm, GELU), its
    trainer and one batch."""
    from benchmarks.peers import SIZES, tlab_overrides

    size = SIZES["small"]
    cfg = compose([*tlab_overrides(size, "cpu", "fp32"), "train.eval_every=0", f"pe={pe}"])
    task = build_task(cfg)
    trainer = Trainer(build_seeded_models(cfg, [0])[0], task, cfg.train, size.d_model, 0)
    return trainer, task.train_batch(8, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("pe", ["learned", "rope", "sinusoidal", "alibi", "t5"])
def test_the_small_step_traces_as_one_graph_with_its_loss(pe):
    """No graph break (attention's ContextVar, the PEs' range checks, the model's
    inference-mode check were breaks): Inductor sees the forward and the loss whole."""
    from transformer_lab.training.trainer import sequence_loss

    torch._dynamo.reset()
    trainer, batch = small_benchmark_model(pe)
    trainer.train_step(batch)  # eager first, as the probe does (fills the position cache)
    step = compile_module.ModelLoss(trainer.model, sequence_loss)
    explained = torch._dynamo.explain(step)(batch.inputs, batch.targets)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_a_traced_cpu_step_writes_attention_out_with_the_eager_numbers():
    from transformer_lab.training.trainer import sequence_loss

    trainer, batch = small_benchmark_model()
    step = compile_module.ModelLoss(trainer.model, sequence_loss)
    eager = step(batch.inputs, batch.targets)
    eager_grads = torch.autograd.grad(eager, list(trainer.model.parameters()))
    traced = torch.compile(step, backend="eager", dynamic=False)  # Dynamo only: no Inductor
    calls = []
    original = trainer.model.blocks[0].attention._attention_with_weights
    trainer.model.blocks[0].attention._attention_with_weights = (
        lambda *args: (calls.append(1), original(*args))[1])
    loss = traced(batch.inputs, batch.targets)
    grads = torch.autograd.grad(loss, list(trainer.model.parameters()))
    assert calls  # the written-out attention, not SDPA
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_unfused_bias_turns_addmm_into_mm_plus_bias_with_the_same_numbers():
    from torch.fx.experimental.proxy_tensor import make_fx

    from transformer_lab.training.inductor_passes import UnfusedBias

    weight, bias, x = torch.randn(6, 4), torch.randn(6), torch.randn(5, 4)
    traced = make_fx(lambda x: torch.nn.functional.linear(x, weight, bias))(x)
    targets = {node.target for node in traced.graph.nodes}
    assert torch.ops.aten.addmm.default in targets
    UnfusedBias()(traced.graph)
    traced.recompile()
    targets = {node.target for node in traced.graph.nodes}
    assert torch.ops.aten.addmm.default not in targets
    assert {torch.ops.aten.mm.default, torch.ops.aten.add.Tensor} <= targets
    torch.testing.assert_close(traced(x), torch.nn.functional.linear(x, weight, bias))


def test_a_failed_compile_says_why_and_trains_on_eager(monkeypatch, capsys):
    monkeypatch.setattr(compile_module, "pays", lambda *args: (True, "stand-in"))

    def broken(module, **settings):
        def forward(*args):
            raise RuntimeError("C++ compile error: no kernel\nmore lines")

        return forward

    monkeypatch.setattr(torch, "compile", broken)
    cfg, task = small_config()
    trainer = Trainer(build_seeded_models(cfg, [0])[0], task, cfg.train, cfg.model.d_model, 0)
    result = trainer.fit(20)
    out = " ".join(capsys.readouterr().out.split())
    assert ("compiling the training step (stand-in) failed (RuntimeError: C++ compile error: "
            "no kernel); eager") in out
    assert "ms/step compiled" not in out  # no comparison against a compile that never ran
    assert result.steps == 20 and all(map(math.isfinite, result.train_losses))


def test_every_compile_shares_one_backend_so_one_graph_serves_every_seed(monkeypatch):
    """Dynamo guards on the backend object: a new one per compile recompiled the same graph
    for each seed's model until its recompile limit left the other seeds eager."""
    backends = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: backends.append(kw["backend"]))
    for _ in range(3):  # three seeds' models
        trainer, _ = small_benchmark_model()
        compile_module.compile_step(compile_module.ModelLoss(trainer.model, lambda y, t: y),
                                    "cpu")
    assert len(backends) == 3 and backends[0] is backends[1] is backends[2]
    compile_module.compile_step(torch.nn.Linear(2, 2), "cuda")
    assert backends[3] is not backends[0]  # CUDA: Inductor's defaults, another backend


@pytest.mark.parametrize("overrides", [("pe=rope",), ("pe=learned", "pe.interpolate=true"),
                                       ("pe=sinusoidal",), ("pe=sinusoidal_learned",)])
def test_a_fresh_models_traced_step_is_one_graph_with_the_eager_loss(overrides):
    """The PEs skip their value checks when traced. Traced before any eager step (RoPE's
    cos/sin cache still empty, as ``benchmarks/multiseed.py``'s compiled arms start) and with
    interpolate=True, the step is still one graph and computes the eager loss."""
    from transformer_lab.training.trainer import sequence_loss

    torch._dynamo.reset()
    cfg, task = small_config(*overrides)
    model = build_seeded_models(cfg, [0])[0]
    step = compile_module.ModelLoss(model, sequence_loss)
    batch = task.train_batch(8, torch.Generator().manual_seed(0))
    explained = torch._dynamo.explain(step)(batch.inputs, batch.targets)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    traced = torch.compile(step, backend="eager", dynamic=False)(batch.inputs, batch.targets)
    torch.testing.assert_close(traced, step(batch.inputs, batch.targets), rtol=1e-5, atol=1e-6)


def test_traced_tables_past_their_length_act_as_eager():
    """A traced T longer than a table takes the checked path: sinusoidal extends its table,
    a learned table without interpolation raises the eager error (not an index error)."""
    from transformer_lab.components.positional import (
        LearnedPositionalEncoding,
        SinusoidalPositionalEncoding,
    )

    torch._dynamo.reset()
    sinusoidal = SinusoidalPositionalEncoding(8, max_len=2)
    traced = torch.compile(lambda: sinusoidal(torch.arange(5)), backend="eager")()
    torch.testing.assert_close(traced, SinusoidalPositionalEncoding(8, max_len=5).table)
    learned = LearnedPositionalEncoding(8, max_len=2)
    with pytest.raises(ValueError, match="longer than the learned position table"):
        torch.compile(lambda: learned(torch.arange(5)), backend="eager")()


def test_a_stacked_model_with_learned_tables_traces_as_one_graph():
    from transformer_lab.training.seed_stack import stack_models

    torch._dynamo.reset()
    cfg, task = small_config("pe=learned")
    stacked = stack_models(build_seeded_models(cfg, [0, 1]))
    inputs = task.train_batch(8, torch.Generator().manual_seed(0)).inputs.repeat(2, 1)
    eager = stacked(inputs)  # (S*B, T, V)
    explained = torch._dynamo.explain(stacked)(inputs)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(stacked, backend="eager")(inputs), eager)
