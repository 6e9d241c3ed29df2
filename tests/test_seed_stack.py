"""A seed-stacked model: seed s gives the logits, gradients, losses and weights of the single
model with seed s, for every built-in PE, FFN, norm placement, norm layer and architecture."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.model import build_model
from transformer_lab.tasks import Batch
from transformer_lab.training.seed_stack import (
    SeedStackedTrainer,
    clip_seed_gradients,
    seed_losses,
    seed_state_dict,
    stack_models,
    stackable,
    stacked_param_groups,
    unstack_model,
)

SEEDS = [0, 1, 2]
# One axis at a time, the config's defaults elsewhere (pe=rope, block=pre, ffn=gelu,
# norm_layer=layernorm, arch=encoder).
CASES = ([f"pe={pe}" for pe in ("none", "sinusoidal", "learned", "sinusoidal_learned", "rope",
                                 "alibi", "t5")]
         + [f"ffn={a}" for a in ("relu", "gelu", "gelu_tanh", "swish", "leaky_relu", "swiglu",
                                 "geglu", "reglu")]
         + [f"block={n}" for n in ("post", "pre", "sandwich", "deepnorm")]
         + [f"norm_layer={n}" for n in ("layernorm", "rmsnorm", "batchnorm")]
         + ["arch=encoder", "arch=decoder", "arch=decoder pe=t5", "arch=decoder pe=learned"])
# Measured over CASES: logits bit-identical; gradients <= 3.2e-7 (||stacked - single|| /
# ||single|| per tensor); training losses <= 3.1e-7 and gradient norms <= 3.4e-7 relative;
# weights after 5 steps <= 1.8e-6 absolute (weights are 1e-3..1). The largest differences are in
# elements whose gradient is ~0 (e.g. the key bias, whose true gradient is 0): AdamW's
# normalisation m / sqrt(v) turns their rounding noise into steps of up to lr.
REL_TOL = 1e-6
WEIGHT_ATOL = 1e-5


def trainer_module():
    """The trainer (``transformer_lab.train`` before the re-layout)."""
    try:
        return importlib.import_module("transformer_lab.training.trainer")
    except ModuleNotFoundError:
        return importlib.import_module("transformer_lab.train")


def config(case: str = "", *extra: str):
    cfg = compose(["experiment=smoke", "train.batch_size=8", *case.split(), *extra])
    return cfg, build_task(cfg)


def single_models(cfg, seeds=SEEDS) -> list[nn.Module]:
    models = []
    for seed in seeds:
        torch.manual_seed(seed)
        models.append(build_model(cfg))
    return models


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, what
    assert rel_err(a, b) <= REL_TOL, f"{what}: relative error {rel_err(a, b):.2e}"


@pytest.mark.parametrize("case", CASES)
def test_each_seed_has_its_single_models_logits_and_gradients(case):
    cfg, task = config(case)
    models = single_models(cfg)
    stacked = stack_models(models)
    batches = [task.train_batch(8, torch.Generator().manual_seed(10 + s)) for s in SEEDS]
    inputs = torch.cat([b.inputs for b in batches])  # (S*B, T)
    targets = torch.cat([b.targets for b in batches])
    logits = stacked(inputs)  # (S*B, T, V)
    losses = seed_losses(logits, targets, len(SEEDS))
    losses.sum().backward()
    sequence_loss = trainer_module().sequence_loss
    rows = batches[0].inputs.shape[0]
    for k, (model, batch) in enumerate(zip(models, batches, strict=True)):
        alone = model(batch.inputs)
        loss = sequence_loss(alone, batch.targets)
        loss.backward()
        assert_close(logits[k * rows:(k + 1) * rows], alone, f"seed {k} logits")
        assert losses[k].item() == pytest.approx(loss.item(), rel=REL_TOL)
        grads = seed_grads(stacked, k)
        assert grads.keys() == dict(model.named_parameters()).keys()
        for name, param in model.named_parameters():
            assert_close(grads[name], param.grad, f"seed {k} grad of {name}")
    assert rel_err(logits[:rows], logits[rows:2 * rows]) > 1e-3  # seeds really differ


def seed_grads(stacked: nn.Module, s: int) -> dict[str, torch.Tensor]:
    """Seed s's gradients under the single model's names and shapes."""
    from transformer_lab.components.seed_stacked import SeedStackedLayer

    grads = {}
    for prefix, module in stacked.named_modules():
        if isinstance(module, SeedStackedLayer):
            for name in module.single_shapes:
                if isinstance(getattr(module, name), nn.Parameter):
                    grads[f"{prefix}.{name}" if prefix else name] = module.seed_grad(name, s)
    return grads


@pytest.mark.parametrize("case", CASES)
def test_stacked_training_equals_single_runs(case):
    """K steps with per-seed batches, per-seed clipping (active), weight decay and a changing
    learning rate: each seed's losses, gradient norms and final weights (BatchNorm's running
    statistics too) are those of its single ``Trainer`` run."""
    steps = 5
    extra = ("train.lr=1e-2", "train.grad_clip=0.05", "train.weight_decay=0.1",
             "train.schedule=warmup_cosine", "train.warmup=2", f"train.steps={steps}")
    if "batchnorm" in case:  # biases right before a BatchNorm have a true gradient of 0 (the
        # batch mean removes them): AdamW turns their rounding noise into lr-sized steps, which
        # differ between any two kernels (~5e-4 here). They are redundant, as usual with BN.
        extra = (*extra, "model.attn_bias=false", "model.ffn_bias=false")
    cfg, task = config(case, *extra)
    trainer = trainer_module().Trainer
    models = single_models(cfg)
    stacked = stack_models(models)
    runner = SeedStackedTrainer(stacked, cfg.train, cfg.model.d_model, SEEDS)
    runner.plan_schedule(steps)
    generators = [torch.Generator().manual_seed(s) for s in SEEDS]  # as each seed's run draws

    def next_batch() -> Batch:  # (S, B, T), row k seed k's
        drawn = [task.train_batch(cfg.train.batch_size, g) for g in generators]
        return Batch(torch.stack([b.inputs for b in drawn]),
                     torch.stack([b.targets for b in drawn]))

    history = [runner.train_step(next_batch()) for _ in range(steps)]
    losses = torch.stack([h[0] for h in history])  # (K, S)
    norms = torch.stack([h[1] for h in history])  # (K, S)
    assert (norms > 0.05).any(), "clipping never acted: the test would not cover it"
    for k, (seed, model) in enumerate(zip(SEEDS, models, strict=True)):
        result = trainer(model, task, cfg.train, cfg.model.d_model, seed).fit(steps)
        assert losses[:, k].tolist() == pytest.approx(result.train_losses, rel=1e-5)
        assert norms[:, k].tolist() == pytest.approx(result.grad_norms, rel=1e-5)
        weights = seed_state_dict(stacked, k)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(weights[name], value, rtol=0, atol=WEIGHT_ATOL,
                                       msg=f"seed {seed} {name}")
        stacked.eval()  # eval mode (BatchNorm: running statistics) agrees as well
        model.eval()
        batch = task.eval_batch()
        rows = batch.inputs.shape[0]
        with torch.no_grad():
            logits = stacked(batch.inputs.repeat(len(SEEDS), 1))[k * rows:(k + 1) * rows]
            assert_close(logits, model(batch.inputs), f"seed {seed} eval logits")
        stacked.train()


def test_seed_state_dict_and_unstack_give_seed_s_as_a_single_model():
    cfg, task = config("pe=t5", "norm_layer=batchnorm")
    models = single_models(cfg)
    stacked = stack_models(models)
    batch = task.train_batch(4, torch.Generator().manual_seed(0))
    for k, model in enumerate(models):
        state = seed_state_dict(stacked, k)
        assert {n: v.shape for n, v in state.items()} == \
            {n: v.shape for n, v in model.state_dict().items()}
        fresh = build_model(cfg)
        fresh.load_state_dict(state)  # strict: the same keys and shapes
        single = unstack_model(stacked, k)
        assert type(single) is type(model)
        for other in (fresh, single):
            torch.testing.assert_close(other(batch.inputs), model(batch.inputs), rtol=0, atol=0)
    assert not any(p is q for p in single.parameters() for q in stacked.parameters())


def test_weight_decay_groups_follow_the_single_models_split():
    cfg, _ = config("pe=learned", "ffn=swiglu", "norm_layer=rmsnorm", "arch=decoder")
    models = single_models(cfg, [0, 1])
    stacked = stack_models(models)
    single_groups = trainer_module().adamw_param_groups(list(models[0].parameters()), 0.1)
    names = {id(p): n for n, p in models[0].named_parameters()}
    stacked_names = {id(p): n for n, p in stacked.named_parameters()}
    expected = [sorted(names[id(p)] for p in g["params"]) for g in single_groups]
    groups = stacked_param_groups(stacked, 0.1)
    assert [sorted(stacked_names[id(p)] for p in g["params"]) for g in groups] == expected
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert expected[0] and expected[1]  # both groups non-empty: the check can fail


def test_each_seed_is_clipped_by_its_own_norm():
    clip = trainer_module().clip_gradients
    big, small = torch.randn(2, 3, 4) * 10, torch.randn(2, 5) * 10
    small_seed = 1
    big[small_seed] *= 1e-3
    small[small_seed] *= 1e-3
    params = [nn.Parameter(torch.zeros_like(big)), nn.Parameter(torch.zeros_like(small))]
    params[0].grad, params[1].grad = big.clone(), small.clone()
    norms = clip_seed_gradients(params, 1.0, n_seeds=2)
    for s in range(2):
        alone = [nn.Parameter(torch.zeros(3, 4)), nn.Parameter(torch.zeros(5))]
        alone[0].grad, alone[1].grad = big[s].clone(), small[s].clone()
        norm = clip(alone, 1.0)
        assert norms[s].item() == pytest.approx(norm.item(), rel=1e-6)
        for p, q in zip(params, alone, strict=True):
            torch.testing.assert_close(p.grad[s], q.grad)
    assert norms[0] > 1.0 > norms[small_seed]  # one seed clipped, the other left alone


def test_stacked_learned_table_interpolates_and_refuses_like_the_single_one():
    from transformer_lab.components.positional import LearnedPositionalEncoding
    from transformer_lab.components.seed_stacked import SeedStackedLearnedPE

    tables = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        tables.append(LearnedPositionalEncoding(4, 6, interpolate=True))
    stacked = SeedStackedLearnedPE(tables)
    positions = torch.arange(10)  # longer than max_len 6
    out = stacked(positions)  # (S, 10, 4)
    for k, table in enumerate(tables):
        torch.testing.assert_close(out[k], table(positions))
    stacked.interpolate = False
    with pytest.raises(ValueError, match="max_len=6"):
        stacked(positions)


class OwnScale(nn.Module):
    """A user's norm with a parameter in a class seed stacking does not know."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


class OwnFeedForward(nn.Module):
    """A user's FFN around nn.Linear layers (its forward could use their weights directly)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_stackable_says_why_a_model_cannot_be_stacked():
    cfg, _ = config()
    assert stackable(single_models(cfg, [0])[0]) is None
    for override, words in [("model.dropout.ffn=0.1", "dropout"),
                            ("model.dropout.attention=0.1", "attention dropout"),
                            ("model.dropout.embedding=0.1", "dropout")]:
        model = single_models(config(override)[0], [0])[0]
        assert words in stackable(model)
    own_norm = single_models(cfg, [0])[0]
    own_norm.blocks[0].norm1 = OwnScale(cfg.model.d_model)
    assert "OwnScale" in stackable(own_norm) and "parameters" in stackable(own_norm)
    own_ffn = single_models(cfg, [0])[0]
    own_ffn.blocks[0].feedforward = OwnFeedForward(cfg.model.d_model, cfg.model.d_ff)
    assert "OwnFeedForward" in stackable(own_ffn)
    with pytest.raises(ValueError, match="OwnScale"):
        stack_models([own_norm, own_norm])
    tied = single_models(cfg, [0])[0]
    tied.lm_head.weight = tied.token_embedding.weight
    assert "ties" in stackable(tied)
    moe = single_models(config("ffn=moe")[0], [0])[0]  # its auxiliary loss mixes the seeds
    assert "auxiliary loss" in stackable(moe)


def test_components_declare_their_stacked_form_and_a_subclass_does_not_inherit_it():
    """tlab's layers name their stacked class (``seed_stacked``); a user's subclass may change
    ``forward``, so it is not stacked unless it declares a stacked form itself."""
    from transformer_lab.components.norms import RMSNorm, SequenceBatchNorm
    from transformer_lab.components.positional import T5RelativeBias
    from transformer_lab.components.seed_stacked import (
        SeedStackedBatchNorm,
        SeedStackedRMSNorm,
        SeedStackedT5Bias,
    )
    from transformer_lab.training.seed_stack_layers import SeedStackedLinear, stacked_form

    assert stacked_form(RMSNorm(4)) is SeedStackedRMSNorm
    assert stacked_form(SequenceBatchNorm(4)) is SeedStackedBatchNorm
    assert stacked_form(T5RelativeBias(2)) is SeedStackedT5Bias
    assert stacked_form(nn.Linear(2, 3)) is SeedStackedLinear  # torch's leaf: the mapping

    class DoubledRMSNorm(RMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    assert stacked_form(DoubledRMSNorm(4)) is None
    cfg, _ = config("norm_layer=rmsnorm")
    model = single_models(cfg, [0])[0]
    model.blocks[0].norm1 = DoubledRMSNorm(cfg.model.d_model)
    assert "DoubledRMSNorm" in stackable(model)
