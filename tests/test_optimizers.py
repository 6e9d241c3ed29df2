"""The ``optimizer`` config group (``training.optimizers``): AdamW by default with exactly the
numbers of a hand-written torch loop, Muon on the hidden matrices and AdamW on the rest, SGD
with momentum, a user's own ``torch.optim.Optimizer``, bad settings refused in pre-flight."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_refused, read_csv

from transformer_lab.config.spec import RunSpec
from transformer_lab.model import build_model
from transformer_lab.training.optimizers import OptimizerSettings
from transformer_lab.training.trainer import Trainer

STEPS = 6


def trainer_for(spec_for, *overrides: str, seed: int = 0) -> Trainer:
    spec, task = spec_for("train.batch_size=8", "train.log_every=1", *overrides)
    return Trainer(build_model(spec.model, seed=seed), task, spec.train, seed)


def hand_written_adamw_losses(spec_for, overrides: list[str], seed: int, weight_decay: float,
                              betas: tuple[float, float]) -> list[float]:
    """The training losses of ``STEPS`` steps of a plain torch loop: the same model, batches
    drawn from a generator seeded with ``seed``, fused ``torch.optim.AdamW`` with decay on
    matrices only, gradient clipping at 1, the smoke experiment's constant train.lr."""
    spec, task = spec_for("train.batch_size=8", *overrides)
    model = build_model(spec.model, seed=seed)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    groups = ([{"params": matrices, "weight_decay": weight_decay},
               {"params": others, "weight_decay": 0.0}] if weight_decay
              else [{"params": list(model.parameters()), "weight_decay": 0.0}])
    optimizer = torch.optim.AdamW(groups, lr=spec.train.lr, betas=betas, fused=True)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(STEPS):
        batch = task.train_batch(8, generator)
        logits = model(batch.inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(("overrides", "weight_decay", "betas"), [
    ([], 0.0, (0.9, 0.98)),
    (["pe=learned", "train.weight_decay=0.1", "train.betas=[0.8,0.95]"], 0.1, (0.8, 0.95)),
])
def test_default_adamw_gives_the_numbers_of_a_plain_torch_loop(spec_for, overrides, weight_decay,
                                                                betas):
    """optimizer=adamw (the default) is torch's fused AdamW, decay on matrices only, with
    train.betas / train.weight_decay: bit for bit the losses of the hand-written loop."""
    trainer = trainer_for(spec_for, *overrides, seed=2)
    assert [type(o) for o in trainer.optimizers] == [torch.optim.AdamW]
    result = trainer.fit(STEPS)
    assert result.train_losses == hand_written_adamw_losses(spec_for, overrides, 2,
                                                            weight_decay, betas)


def test_the_default_node_is_tlabs_default_adamw(cfg_for):
    cfg = cfg_for("train.weight_decay=0.05")
    assert cfg.optimizer.name == "adamw"
    assert RunSpec.of(cfg).train.optimizer == OptimizerSettings.adamw((0.9, 0.98), 0.05)


def test_muon_gets_exactly_the_hidden_matrices_and_adamw_the_rest(spec_for):
    trainer = trainer_for(spec_for, "optimizer=muon", "pe=learned", "ffn=swiglu",
                          "model.n_layers=2", "train.schedule=warmup_cosine", "train.warmup=2",
                          "train.lr=0.01")
    muon, rest = trainer.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(rest, torch.optim.AdamW)
    model = trainer.model
    names = {id(p): name for name, p in model.named_parameters()}
    in_muon = {names[id(p)] for group in muon.param_groups for p in group["params"]}
    in_rest = {names[id(p)] for group in rest.param_groups for p in group["params"]}
    hidden = {name for name, p in model.named_parameters()
              if name.startswith("blocks.") and p.dim() == 2}
    assert in_muon == hidden
    assert {"token_embedding.weight", "positional.weight", "lm_head.weight"} <= in_rest
    assert in_muon.isdisjoint(in_rest) and in_muon | in_rest == set(names.values())
    assert muon.param_groups[0]["adjust_lr_fn"] == "original"
    batch = trainer.task.train_batch(8, trainer.generator)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    ratio = trainer.settings.optimizer.lr_ratio  # Muon's lr / the schedule's
    for expected_lr in (0.005, 0.01):  # the warm-up: the schedule sets both optimisers
        trainer.train_step(batch)
        assert [g["lr"] for g in muon.param_groups] == pytest.approx([ratio * expected_lr])
        assert {g["lr"] for g in rest.param_groups} == {expected_lr}
    assert all(not torch.equal(p, before[name]) for name, p in model.named_parameters()
               if name in hidden)


def test_muon_trains_the_model(spec_for):
    """Muon on the matrices and AdamW on the rest bring the loss down on fixed batches."""
    trainer = trainer_for(spec_for, "optimizer=muon", "train.lr=0.01")
    batches = [trainer.task.train_batch(8, trainer.generator) for _ in range(2)]
    losses = trainer.fit(20, batches=batches).train_losses
    assert losses[-1] < 0.8 * losses[0], losses


def test_sgd_steps_with_momentum_at_its_lr_ratio(spec_for):
    trainer = trainer_for(spec_for, "optimizer=sgd", "train.grad_clip=null", "train.lr=0.01")
    (sgd,) = trainer.optimizers
    assert isinstance(sgd, torch.optim.SGD)
    assert sgd.param_groups[0]["momentum"] == 0.9
    weight = trainer.model.blocks[0].attention.out_proj.weight
    batch = trainer.task.train_batch(8, trainer.generator)
    start = weight.detach().clone()
    trainer.train_step(batch)
    first_grad = weight.grad.clone()
    assert sgd.param_groups[0]["lr"] == pytest.approx(0.1)  # train.lr x lr_ratio 10
    torch.testing.assert_close(weight.detach(), start - 0.1 * first_grad)
    middle = weight.detach().clone()
    trainer.train_step(batch)
    momentum = 0.9 * first_grad + weight.grad  # heavy ball: v2 = mu v1 + g2
    torch.testing.assert_close(weight.detach(), middle - 0.1 * momentum)


USER_OPTIMIZER = '''
import torch


class SignDescent(torch.optim.Optimizer):
    """p <- p - lr * scale * sign(grad); counts its steps."""

    steps = 0

    def __init__(self, params, lr=1e-3, scale=1.0):
        super().__init__(params, {"lr": lr, "scale": scale})

    @torch.no_grad()
    def step(self, closure=None):
        type(self).steps += 1
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(torch.sign(p.grad), alpha=-group["lr"] * group["scale"])
'''


def test_a_users_own_optimizer_class_runs(tlab, tmp_path, monkeypatch):
    (tmp_path / "my_optimizers.py").write_text(textwrap.dedent(USER_OPTIMIZER))
    tree = tmp_path / "configs" / "optimizer"
    tree.mkdir(parents=True)
    (tree / "sign.yaml").write_text("name: sign\n_target_: my_optimizers.SignDescent\n"
                                    "scale: 0.5\n")
    monkeypatch.chdir(tmp_path)  # where a user's module sits: importable while tlab runs
    monkeypatch.delitem(sys.modules, "my_optimizers", raising=False)
    out = tmp_path / "run"
    code, _, err = tlab("experiment=smoke", "optimizer=sign", "--config-dir",
                        tmp_path / "configs", f"hydra.run.dir={out}")
    assert code == 0, err
    assert sys.modules["my_optimizers"].SignDescent.steps == 10  # the smoke steps
    assert read_csv(out / "summary.csv")[0]["status"] == "passed"


@pytest.mark.parametrize(("args", "message"), [
    (["optimizer=lion"], "unknown optimizer 'lion'; valid: adam, adamw, muon, sgd"),
    (["optimizer._target_=torch.nn.Linear"],
     "_target_ 'torch.nn.Linear' is not a torch.optim.Optimizer subclass"),
    (["optimizer._target_=torch.optim.NoSuchThing"],
     "'torch.optim.NoSuchThing' cannot be imported"),
    (["optimizer=sgd", "+optimizer.betas=[0.9,0.99]"],
     "optimizer=sgd: torch.optim.SGD takes no argument 'betas'; it takes momentum"),
    (["optimizer=sgd", "optimizer.momentum=-1"], "torch.optim.SGD refused its settings"),
    (["+optimizer.lr=0.1"], "'lr' is not an optimizer setting: train.lr"),
    (["+optimizer.params=hidden_matrices"], "no optimizer.rest"),
    (["optimizer=muon", "optimizer.params=all"], "Muon only supports 2D parameters"),
    (["optimizer=muon", "optimizer.lr_ratio=0"], "optimizer.lr_ratio=0 is not valid"),
])
def test_bad_optimizer_settings_are_refused_before_anything_is_written(tlab, tmp_path, args,
                                                                         message):
    out = tmp_path / "bad"
    assert_refused(tlab("experiment=smoke", *args, f"hydra.run.dir={out}"), out, message)


def test_tlab_list_shows_the_optimizer_group():
    from typer.testing import CliRunner

    from transformer_lab.cli import app

    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0
    row = next(line for line in result.output.splitlines() if " optimizer " in line)
    for choice in ("adam", "adamw", "muon", "sgd"):
        assert choice in row
