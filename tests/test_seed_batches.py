"""Batches drawn many steps at once equal per-step draws (numbers and generator state), and
``SeedBatches`` gives every seed's batch of a step as one (S, B, T) tensor."""

from __future__ import annotations

import pytest
import torch

from transformer_lab.components.positional.learned import LearnedPositionalEncoding
from transformer_lab.components.seed_stacked import SeedStackedLearnedPE
from transformer_lab.tasks import Batch
from transformer_lab.tasks.language import SyntheticLanguageTask
from transformer_lab.tasks.sequence import CopyTask, ReverseTask
from transformer_lab.training.seed_batches import SeedBatches

TASKS = {
    "reverse encoder": lambda: ReverseTask(4, 10, causal=False, eval_size=16),
    "reverse decoder": lambda: ReverseTask(5, 12, causal=True, eval_size=16),
    # half the sequences held out: chunks often keep fewer than B rows (the slow path)
    "copy, short chunks": lambda: CopyTask(6, 10, causal=True, eval_size=16, holdout_mod=2),
    "language": lambda: SyntheticLanguageTask(seq_len=8, vocab_size=16, eval_size=16),
}


def per_step(task, batch_size: int, seed: int, count: int) -> tuple[list[Batch], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batches = [task.train_batch(batch_size, generator) for _ in range(count)]
    return batches, generator.get_state()


@pytest.mark.parametrize("name", TASKS)
def test_train_batches_equal_per_step_draws_and_leave_the_same_generator_state(name):
    task, batch_size, count = TASKS[name](), 40, 30
    generator = torch.Generator().manual_seed(7)
    many = task.train_batches(batch_size, generator, count)
    singles, state = per_step(task, batch_size, 7, count)
    assert many.inputs.shape == (count, *singles[0].inputs.shape)
    for i, single in enumerate(singles):
        assert torch.equal(many.inputs[i], single.inputs), f"step {i} inputs"
        assert torch.equal(many.targets[i], single.targets), f"step {i} targets"
    assert torch.equal(generator.get_state(), state)


def test_the_short_chunk_case_is_really_exercised():
    task = TASKS["copy, short chunks"]()
    draw = torch.randint(1, 10, (30, 80, 6), generator=torch.Generator().manual_seed(7))
    kept = (~task._is_held_out(draw.view(-1, 6))).view(30, 80).sum(dim=1)
    assert (kept < 40).any() and (kept >= 40).any()


def test_a_subclass_with_its_own_draw_keeps_it():
    class Shifted(ReverseTask):
        def train_batch(self, batch_size, generator):
            batch = super().train_batch(batch_size, generator)
            return Batch(batch.inputs.clamp(max=3), batch.targets)

    task = Shifted(4, 10, causal=False, eval_size=16)
    many = task.train_batches(8, torch.Generator().manual_seed(1), 5)
    singles, _ = per_step(task, 8, 1, 5)
    assert all(torch.equal(many.inputs[i], b.inputs) for i, b in enumerate(singles))
    assert int(many.inputs.max()) <= 3


class _Trainer:
    """What SeedBatches reads of a Trainer."""

    def __init__(self, task, seed: int, batch_size: int) -> None:
        self.task, self.generator = task, torch.Generator().manual_seed(seed)
        self._train = type("Train", (), {"batch_size": batch_size})()


def test_seed_batches_lay_out_each_seeds_own_draws_seed_major():
    task, seeds, steps = ReverseTask(4, 10, causal=False, eval_size=16), [3, 5, 9], 150
    trainers = [_Trainer(task, s, 8) for s in seeds]
    batches = SeedBatches(trainers, seeds, steps, None, torch.device("cpu"))
    expected = {s: per_step(task, 8, s, steps)[0] for s in seeds}
    for i in range(steps):  # 150 steps: blocks of 64, 64 and 22
        step = batches(i)
        assert step.inputs.shape == (3, 8, 4) and step.inputs.is_contiguous()
        for k, s in enumerate(seeds):
            assert torch.equal(step.inputs[k], expected[s][i].inputs)
            assert torch.equal(step.targets[k], expected[s][i].targets)
    with pytest.raises(ValueError, match="in order"):
        batches(3)


def test_seed_batches_cycle_fixed_batches_of_equal_or_different_lengths():
    task = ReverseTask(4, 10, causal=False, eval_size=16)
    gen = torch.Generator().manual_seed(0)
    fixed = {0: [task.train_batch(8, gen) for _ in range(3)],
             1: [task.train_batch(8, gen) for _ in range(3)]}
    uneven = {0: fixed[0], 1: fixed[1][:2]}
    for batches in (fixed, uneven):
        source = SeedBatches([_Trainer(task, 0, 8)] * 2, [0, 1], 7, batches,
                             torch.device("cpu"))
        for i in (0, 4, 6):
            step = source(i)
            for k in (0, 1):
                assert torch.equal(step.inputs[k], batches[k][i % len(batches[k])].inputs)


def test_stacked_learned_pe_slices_in_order_positions_and_gathers_others():
    torch.manual_seed(0)
    singles = [LearnedPositionalEncoding(8, 16) for _ in range(3)]
    stacked = SeedStackedLearnedPE(singles)
    for positions in (torch.arange(6), torch.tensor([4, 0, 2, 2]), torch.arange(6)):
        out = stacked(positions)  # (S, T, d)
        in_order = torch.equal(positions, torch.arange(len(positions)))
        assert (out.data_ptr() == stacked.weight.data_ptr()) == in_order  # a slice, else a gather
        out.sum().backward()
        for k, single in enumerate(singles):
            expected = single(positions)
            assert torch.equal(out[k], expected)
            expected.sum().backward()
            assert torch.equal(stacked.weight.grad[k], single.weight.grad)
            single.weight.grad = None
        stacked.weight.grad = None
    with pytest.raises(ValueError, match=">= 0"):
        stacked(torch.tensor([1, -1]))
