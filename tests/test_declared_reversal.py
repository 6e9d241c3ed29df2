"""A PE's declared reversal settings (``reversal_settings`` on its class) reach step 3 and its
NoPE control; ALiBi's encoder default is the direction-aware form."""

from __future__ import annotations

import pytest

from transformer_lab.config.variants import with_choice
from transformer_lab.errors import ConfigError
from transformer_lab.routines.reverse_task import NOPE, pe_label, with_declared_settings


@pytest.mark.parametrize(("arch", "max_steps"), [("encoder", 5000), ("decoder", 600)])
def test_alibi_trains_reversal_with_its_declared_settings(spec_for, arch, max_steps):
    spec, _ = spec_for("experiment=reverse_task", "pe=alibi", f"arch={arch}")
    variant, note = with_declared_settings(spec)
    assert variant.train.schedule == "warmup_cosine" and variant.train.warmup == 20
    assert variant.routine.max_steps == max_steps
    assert spec.train.schedule == "constant"  # the run's own spec is left as it is
    assert "pe=alibi" in note and "train.schedule=warmup_cosine" in note
    # the NoPE control, composed from the variant, trains with the same settings
    control = with_choice(variant, "pe", NOPE)
    assert (control.train.schedule, control.train.warmup) == ("warmup_cosine", 20)
    assert control.routine.max_steps == max_steps and pe_label(control) == NOPE


def test_the_declared_settings_can_be_switched_off_and_others_declare_none(spec_for):
    spec, _ = spec_for("experiment=reverse_task", "pe=alibi", "routine.declared_settings=false")
    assert with_declared_settings(spec) == (spec, "")
    rope, _ = spec_for("experiment=reverse_task", "pe=rope")
    assert with_declared_settings(rope) == (rope, "")


def test_alibi_encoder_default_is_split_and_a_bad_declaration_is_refused(spec_for, monkeypatch):
    spec, _ = spec_for("experiment=reverse_task", "pe=alibi", "arch=encoder")
    assert pe_label(spec) == "alibi(split)"
    from transformer_lab.components.positional import ALiBiPositionalBias

    monkeypatch.setattr(ALiBiPositionalBias, "reversal_settings",
                        classmethod(lambda cls, arch: {"model.d_model": 8}))
    with pytest.raises(ConfigError, match="only train"):
        with_declared_settings(spec)


def test_a_norm_layer_declares_its_settings_too(spec_for):
    spec, _ = spec_for("experiment=reverse_task", "block=post", "norm_layer=batchnorm")
    variant, note = with_declared_settings(spec)
    assert variant.train.schedule == "warmup_cosine" and "norm_layer=batchnorm" in note
    assert variant.routine.max_steps == 1200
