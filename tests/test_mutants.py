"""``tlab mutants`` and step 1's property rows: broken components are caught at their expected
step, correct ones pass, the confusion matrix counts them, a user's own mutants directory works.

The full suite (56 catalogue entries + 38 built-ins and presets: a few minutes on a 2-core CPU
shared with other work; ``tlab mutants`` runs it too) runs with ``TLAB_FULL_MUTANTS=1``;
the default run checks a few of each (~5 s).
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.spec import RunSpec
from transformer_lab.mutants import BY_NAME, built_in_negatives, mutant_config
from transformer_lab.routines.mutants import (
    Candidate,
    Verdict,
    confusion,
    examine,
    load_mutants,
    mutation_score,
    suite,
)
from transformer_lab.routines.smoke import forward_backward_check, smoke_setup
from transformer_lab.routines.validate import step_configs

_RUN = SimpleNamespace(metrics=None, path=None)  # examine's run: metrics are not kept here


def _suite(*names: str, negatives: bool = True, directory: str | None = None) -> list:
    spec = RunSpec.of(compose(["experiment=mutants"]))
    return suite(replace(spec, routine=spec.routine.replace(
        only=list(names) or None, negatives=negatives, dir=directory)))


FEW = ["position_blind", "token_shift_ffn", "wrong_shape_pe", "float64_pe", "flipped_sign_rope",
       "future_bias_alibi", "pe=alibi/encoder", "ffn=swiglu", "block=post/batchnorm",
       "squared_variance_layernorm", "functional_dropout_ffn", "dyt_norm", "preset=gpt_neox"]


def test_a_few_components_are_classified_as_expected():
    verdicts = [examine(candidate, _RUN, reversal=False) for candidate in _suite(*FEW)]
    outcomes = {v.candidate.name: (v.outcome, v.caught) for v in verdicts}
    assert outcomes == {
        "position_blind": ("caught-expected", "step1:position_injectivity"),
        "token_shift_ffn": ("caught-expected", "step1:causality"),
        "wrong_shape_pe": ("caught-expected", "preflight"),
        "float64_pe": ("caught-expected", "step1:output_dtype"),  # was a crash (exit 1)
        "flipped_sign_rope": ("caught-expected", "step3:rotary_relative"),
        "future_bias_alibi": ("correct-passed", ""),  # the causal mask wins
        "pe=alibi/encoder": ("correct-passed", ""),
        "ffn=swiglu": ("correct-passed", ""),
        "block=post/batchnorm": ("correct-passed", ""),
        # was "positions 16 and 17 get the same representation" (position_injectivity)
        "squared_variance_layernorm": ("caught-expected", "step1:norm_scale_control"),
        # was "a future leak" (causality)
        "functional_dropout_ffn": ("caught-expected", "step1:eval_determinism"),
        "dyt_norm": ("correct-passed", ""),
        "preset=gpt_neox": ("correct-passed", ""),
    }
    leak = next(v for v in verdicts if v.candidate.name == "token_shift_ffn")
    assert "output at position 0 changed when token 1 changed" in leak.detail
    assert leak.detail.endswith("culprit: the FFN (TokenShiftFFN): with gelu the property holds")


def _verdict(kind: str, expected: str, caught: str) -> Verdict:
    return Verdict(Candidate("x", kind, "pe", "encoder", expected, None), caught, "", 0.0)


NEW_CLASSES = {  # issue 32: the classes that slipped through, and published correct designs
    "renormalised_top1_moe": ("caught-expected", "step1:task_gradient"),
    "activation_first_ffn": ("caught-expected", "step1:ffn_interaction"),
    "rezero_block/decoder": ("correct-passed", ""),
    "sigmoid_attention_block/decoder": ("correct-passed", ""),
    "quiet_attention_block/encoder": ("correct-passed", ""),
}


def test_the_new_classes_are_caught_and_published_designs_pass():
    verdicts = [examine(candidate, _RUN, reversal=False) for candidate in _suite(*NEW_CLASSES)]
    assert {v.candidate.name: (v.outcome, v.caught) for v in verdicts} == NEW_CLASSES, {
        v.candidate.name: v.detail for v in verdicts}
    moe = next(v for v in verdicts if v.candidate.name == "renormalised_top1_moe")
    assert "blocks.0.feedforward.gate.weight gets a task-loss gradient" in moe.detail


def test_confusion_matrix_and_mutation_score_count_each_outcome():
    verdicts = [_verdict("correct", "none", ""), _verdict("correct", "none", "step3:x"),
                _verdict("broken", "step1:causality", "step1:causality"),
                _verdict("broken", "step3", "step3:reverse_exact_match"),
                _verdict("broken", "step1:ffn_gain", "step1:causality"),
                _verdict("broken", "step1:ffn_gain", "")]
    counts = confusion(verdicts)
    assert counts == {"correct-passed": 1, "correct-failed": 1, "caught-expected": 2,
                      "caught-elsewhere": 1, "missed": 1}
    assert mutation_score(counts) == pytest.approx(3 / 4)
    assert mutation_score(confusion(verdicts[:2])) is None


def test_the_suite_holds_the_catalogue_and_every_built_in():
    candidates = _suite()
    broken = [c for c in candidates if c.kind == "broken"]
    catalogue = [c for c in candidates if not c.name.startswith(("pe=", "ffn=", "block=",
                                                                   "preset="))]
    assert len(broken) == 27 and len(catalogue) == 56
    assert len(candidates) == len(catalogue) + len(built_in_negatives())
    names = {c.name for c in candidates}
    assert {"pe=t5/encoder", "pe=rope/decoder", "ffn=reglu", "block=deepnorm/rmsnorm",
            "preset=llama", "preset=t5_encoder"} <= names
    assert not any(name.startswith("pe=none") for name in names)  # the control is not a component


def test_a_users_mutants_directory_is_loaded_and_run(tmp_path):
    (tmp_path / "my_mutants.py").write_text(textwrap.dedent("""
        import torch
        from transformer_lab.components.positional import SinusoidalPositionalEncoding
        from transformer_lab.mutants import Mutant

        class FrozenPE(SinusoidalPositionalEncoding):
            '''Every position from 3 on is position 3.'''
            def forward(self, positions):
                return super().forward(positions.clamp(max=3))

        MUTANTS = [Mutant("frozen_pe", "pe", "my_mutants.FrozenPE", "encoder",
                          "step1:position_injectivity", {"d_model": "${model.d_model}"})]
    """))
    candidates = _suite(negatives=False, directory=str(tmp_path))
    assert [c.name for c in candidates] == ["frozen_pe"]
    verdict = examine(candidates[0], _RUN, reversal=False)
    assert verdict.outcome == "caught-expected"
    assert "positions 3 and 4 get the same representation" in verdict.detail


def test_a_directory_without_mutants_is_bad_input(tmp_path):
    from transformer_lab.errors import ConfigError

    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(ConfigError, match="no MUTANTS list"):
        load_mutants(tmp_path)
    with pytest.raises(ConfigError, match="not in the suite"):
        _suite("no_such_component")


def _step1(cfg) -> dict:
    """Step 1's rows of the composed ``cfg``, at validate's smoke step."""
    spec = RunSpec.of(cfg)
    smoke = step_configs(spec.with_vocab(build_task(spec).vocab_size))["smoke"]
    _, model, batches = smoke_setup(smoke)
    return {row.check: row for row in forward_backward_check(smoke, model, batches[0])}


def test_step1_reports_pe_none_injectivity_as_the_control():
    rows = _step1(compose(["experiment=validate", "pe=none"]))
    row = rows["position_injectivity"]
    assert row.status == "SKIP" and "as expected (the control)" in row.detail
    assert all(r.passed for r in rows.values())


def test_step1_fails_a_float64_pe_without_raising():
    rows = _step1(mutant_config(BY_NAME["float64_pe"], experiment="validate"))
    assert rows["output_dtype"].status == "FAIL"
    assert "returned torch.float64" in rows["output_dtype"].detail
    assert "output_shape" not in rows  # the forward that would raise is not run


@pytest.mark.skipif(not os.environ.get("TLAB_FULL_MUTANTS"), reason="~10-40 s: TLAB_FULL_MUTANTS=1")
def test_full_suite_no_false_alarm_every_mutant_at_its_step():
    verdicts = [examine(candidate, _RUN, reversal=False) for candidate in _suite()]
    counts = confusion(verdicts)
    assert counts["correct-failed"] == 0 and counts["missed"] == 0
    assert counts["caught-elsewhere"] == 0, OmegaConf.to_yaml({
        v.candidate.name: v.caught for v in verdicts if v.outcome == "caught-elsewhere"})


@pytest.mark.parametrize("experiment", ["mutants", "compare", "compare_activations", "validate",
                                        "smoke", "train", "reverse_task", "check", "budget",
                                        "plot_pe", "extrapolate"])
def test_every_experiments_defaults_pass_its_routines_key_checks(experiment):
    """An experiment's own defaults (``routine.only: null`` for mutants, ...) are valid
    values of the keys its routine declares: ``tlab <command>`` with no option runs."""
    from transformer_lab.config.compose import compose
    from transformer_lab.routines import check_settings

    check_settings(compose([f"experiment={experiment}"]))


@pytest.mark.parametrize("arch", ["encoder", "decoder"])
def test_the_documented_minimal_block_passes_steps_1_and_2(arch, monkeypatch):
    """docs/custom_components.md's block contract: examples/configs/block/my_block.yaml."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(repo))
    node = OmegaConf.load(repo / "examples" / "configs" / "block" / "my_block.yaml")

    def config():
        cfg = compose(["experiment=validate", f"arch={arch}"])
        cfg.block = node
        return cfg

    verdict = examine(Candidate("my_block", "correct", "block", arch, "none", config), _RUN,
                      reversal=False)
    assert verdict.outcome == "correct-passed", verdict.detail
