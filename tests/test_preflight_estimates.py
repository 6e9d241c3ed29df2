"""The pre-flight's estimates follow what runs at once: seeds train one after another (no
multiplication by seeds), a refusal names the setting that dominates, and the reversal check
refuses a length whose attention work would take minutes per step on a CPU."""

from __future__ import annotations

import pytest
from helpers import assert_refused

from transformer_lab.app import resources
from transformer_lab.errors import ConfigError


@pytest.fixture
def estimate_of(spec_for):
    """``estimate_of(*overrides)`` -> the pre-flight's estimate of that run, by part."""

    def estimate(*overrides: str) -> dict[str, int]:
        return resources.estimate(*spec_for(*overrides))

    return estimate


@pytest.mark.parametrize("experiment", ["smoke", "train"])
def test_seeds_do_not_multiply_the_estimate(estimate_of, experiment):
    task = ["task=lm"] if experiment == "train" else []
    one = estimate_of(f"experiment={experiment}", *task, "routine.seeds=1")
    many = estimate_of(f"experiment={experiment}", *task, "routine.seeds=100000")
    assert many == one


def test_activations_follow_the_training_batch(estimate_of):
    small = estimate_of("experiment=smoke", "routine.batch_size=8")
    large = estimate_of("experiment=smoke", "routine.batch_size=16")
    assert large["activations"] == 2 * small["activations"]  # per-token terms only
    assert large["model_state"] == small["model_state"] == 16 * small["parameters"]


def test_smoke_with_many_seeds_is_not_refused(tlab, tmp_path, monkeypatch, estimate_of):
    """Refused on main as "28 GB, most for training at 8x4 tokens" (with 100000 seeds)."""
    needed = estimate_of("experiment=smoke")["total"]
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 2 * needed)
    code, _, err = tlab("experiment=smoke", "routine.seeds=3", "routine.steps=2",
                        f"hydra.run.dir={tmp_path / 'run'}")
    assert code in (0, 1) and "needs about" not in err, err  # 2 steps need not pass


def test_a_refusal_names_the_batch_setting_that_dominates(tlab, tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 10**6)
    out = tmp_path / "run"
    assert_refused(tlab("experiment=smoke", "routine.batch_size=100000", f"hydra.run.dir={out}"),
                   out, "most for training at 100000x4 tokens (routine.batch_size=100000, "
                   "task.seq_len=4)")
    assert_refused(tlab("experiment=train", "task=lm", "task.seq_len=4096", "model.max_len=4096",
                        "train.batch_size=4096", f"hydra.run.dir={out}"),
                   out, "(train.batch_size=4096, task.seq_len=4096)")


@pytest.mark.parametrize("arch, tokens_per_symbol", [("encoder", 1), ("decoder", 2)])
def test_reversal_check_refuses_long_sequences_and_its_suggestion_fits(spec_for, arch,
                                                                        tokens_per_symbol):
    spec, task = spec_for("experiment=reverse_task", f"arch={arch}", "task.seq_len=5000")
    with pytest.raises(ConfigError) as refused:
        resources.check_attention_work(spec, task)
    message = str(refused.value)
    assert message.startswith("task.seq_len=5000 (--seq-len) is too long")
    longest = int(message.split("use --seq-len ")[1].split()[0])
    eval_size = int(spec.task["eval_size"])  # the larger batch here: 512 sequences
    assert eval_size * (tokens_per_symbol * longest) ** 2 <= resources.CPU_CHECK_ATTENTION_PAIRS
    assert eval_size * (tokens_per_symbol * (longest + 1)) ** 2 > \
        resources.CPU_CHECK_ATTENTION_PAIRS
    fits = spec_for("experiment=reverse_task", f"arch={arch}", f"task.seq_len={longest}")
    resources.check_attention_work(*fits)  # the suggestion is accepted


def test_reverse_task_at_5000_tokens_is_refused_at_once(tlab, tmp_path):
    out = tmp_path / "run"
    err = assert_refused(tlab("experiment=reverse_task", "task.seq_len=5000",
                              "routine.max_steps=1", f"hydra.run.dir={out}"), out,
                         "task.seq_len=5000 (--seq-len) is too long for the reversal check",
                         "use --seq-len 256 or less")
    assert len(err.strip().splitlines()) == 1
