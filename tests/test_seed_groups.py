"""The stacked engine's seed groups: sized by the step's work, numbers independent of the
grouping, a group of one is the seed's single run."""

from __future__ import annotations

import pytest
import torch

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.training.multiseed import build_seeded_models, choose_engine, fit_seeds
from transformer_lab.training.seed_engines import SeedEngine
from transformer_lab.training.seed_groups import GROUP_MAX_WORK, group_size, seed_groups


def config(*overrides: str):
    return compose(["experiment=smoke", "train.log_every=1", "train.eval_every=0",
                    "train.batch_size=16", "train.lr=1e-2", *overrides])


def test_group_size_follows_the_work_of_a_step():
    assert group_size(256, 8, "cpu") == 8  # tiny: all seeds in one
    assert group_size(GROUP_MAX_WORK // 4, 8, "cpu") == 4
    assert group_size(GROUP_MAX_WORK // 4, 3, "cpu") == 3
    assert group_size(GROUP_MAX_WORK, 8, "cpu") == 1  # small: one at a time
    assert group_size(10 * GROUP_MAX_WORK, 8, "cuda:0") == 8  # launch-bound: all
    assert seed_groups(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]


def trained_weights(cfg, seeds, group):
    task = build_task(cfg)  # completes the model's vocabulary in cfg
    models = build_seeded_models(cfg, seeds)
    results = fit_seeds(cfg, seeds, 6, task=task, models=models, engine="stacked", group=group)
    return results, [m.state_dict() for m in models]


def test_the_grouping_does_not_change_any_number():
    """Seed s trained in a group of 4 or of 2 ends with the same weights, bit for bit."""
    cfg = config("pe=learned", "block=pre", "ffn=swiglu")
    seeds = [0, 1, 2, 3]
    one_group, weights_one = trained_weights(cfg, seeds, 4)
    two_groups, weights_two = trained_weights(cfg, seeds, 2)
    for a, b, wa, wb in zip(one_group, two_groups, weights_one, weights_two, strict=True):
        assert a.train_losses == b.train_losses and a.grad_norms == b.grad_norms
        for name in wa:
            torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0)
    assert one_group[0].train_losses != one_group[1].train_losses  # the seeds differ


def test_a_group_of_one_is_the_seeds_single_run():
    """3 seeds in groups of 2: seed 3 is left alone in the last group and trains as its single
    run (its losses and weights exactly); seeds 1 and 2 as in one group of 3."""
    cfg = config("pe=rope")
    (alone,), (alone_weights,) = trained_weights(cfg, [3], 1)  # one seed: its single run
    split, split_weights = trained_weights(cfg, [1, 2, 3], 2)
    whole, _ = trained_weights(cfg, [1, 2, 3], 3)
    assert split[2].train_losses == alone.train_losses
    for name, value in alone_weights.items():
        torch.testing.assert_close(split_weights[2][name], value, rtol=0, atol=0, msg=name)
    assert [r.train_losses for r in split[:2]] == [r.train_losses for r in whole[:2]]
    with pytest.raises(ValueError, match="group=0"):
        fit_seeds(cfg, [1, 2], 2, engine="stacked", group=0)
    line = SeedEngine("stacked", "asked for", 1).describe([1, 2, 3])
    assert "one after another, each as its own run" in line


@pytest.mark.parametrize(("overrides", "engine", "group"), [
    ((), "stacked", 3),  # tiny: 16 x 4 tokens x d 8, every seed in one group
    (("model.d_model=64", "model.d_ff=256", "task.seq_len=16", "train.batch_size=32"),
     "stacked", 2),  # 512 tokens x d 64 = 32768: groups of two
    (("model.d_model=64", "model.d_ff=256", "task.seq_len=16", "train.batch_size=64"),
     "sequential", None),  # 65536: one per group, i.e. single runs
])
def test_the_auto_choice_groups_by_work(overrides, engine, group, capsys):
    cfg = config(*overrides)
    task = build_task(cfg)
    models = build_seeded_models(cfg, [0, 1, 2])
    chosen = choose_engine(cfg, task, models, [4] * 3)
    assert (chosen.name, chosen.group) == (engine, group)
    if engine == "sequential":
        assert "one seed per group" in chosen.why and "65536" in chosen.why
    if group == 2:
        fit_seeds(cfg, [0, 1, 2], 2, task=task, models=models)
        assert "as seed-stacked groups of 2, one group after another" in capsys.readouterr().out


def test_groups_keep_budgets_solved_seeds_and_running_statistics_bit_for_bit():
    """Seeds with their own budgets under one horizon, BatchNorm's running statistics, and a
    seed that stops once solved: groups of 2 give what one group of 4 gives, exactly."""
    cfg = config("norm_layer=batchnorm", "model.attn_bias=false", "model.ffn_bias=false",
                 "train.eval_every=2")
    task = build_task(cfg)
    budgets = {0: 3, 1: 7, 2: 5, 3: 6}
    outcomes = []
    for group in (4, 2):
        models = build_seeded_models(cfg, list(budgets))
        results = fit_seeds(cfg, list(budgets), budgets, task=task, models=models, horizon=7,
                            engine="stacked", group=group, target_exact_match=0.007)
        outcomes.append((results, [m.state_dict() for m in models]))
    (together, weights), (grouped, grouped_weights) = outcomes
    for a, b, wa, wb in zip(together, grouped, weights, grouped_weights, strict=True):
        assert (a.steps, a.solved_step, a.train_losses) == (b.steps, b.solved_step,
                                                            b.train_losses)
        for name in wa:  # running_mean / running_var included
            torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0, msg=name)
    # seed 0 is solved at its first evaluation (step 2 of 3); the others run their budgets
    assert [(r.steps, r.solved_step) for r in together] == [(2, 2), (7, None), (5, None),
                                                            (6, None)]


def test_the_engine_line_names_the_seeds_it_trains():
    from transformer_lab.training.seed_engines import SeedEngine

    engine = SeedEngine("sequential", "asked for")
    assert engine.describe([3, 4, 5]).startswith("seeds 3-5 train one after another")
    assert engine.describe([3, 7]).startswith("seeds 3, 7 train")  # not "3-7"
    assert engine.describe([2]).startswith("seed 2 train")
