"""The Python API (``import transformer_lab as tl``) and ``transformer_lab.testing``: the same
runs and files as the CLI, components defined anywhere, the CLI's messages."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pandas as pd
import pytest
import torch
from torch import nn

import transformer_lab as tl
from transformer_lab.errors import ConfigError
from transformer_lab.testing import assert_rope_relative, assert_trains

TIMING = {"wall_s", "tokens_per_s", "elapsed_s"}


def test_import_is_lazy():
    """``import transformer_lab`` loads neither the API nor torch, hydra or pandas."""
    probe = ("import sys, transformer_lab; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'hydra', 'pandas') or m == 'transformer_lab.api'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        _ = tl.nonesuch


def test_api_writes_what_the_cli_writes(tlab, tmp_path):
    assert tlab("experiment=smoke", "pe=rope", f"hydra.run.dir={tmp_path / 'cli'}")[0] == 0
    result = tl.smoke(pe="rope", out=tmp_path / "api")
    assert result.passed and result.exit_code == 0 and result.run_dir == tmp_path / "api"
    cli = pd.read_csv(tmp_path / "cli" / "smoke.csv")
    numbers = [c for c in cli.columns if c not in TIMING]
    pd.testing.assert_frame_equal(result.table[numbers], cli[numbers])
    assert sorted(p.name for p in result.run_dir.iterdir()) == \
        sorted(p.name for p in (tmp_path / "cli").iterdir())


class LocalPE(nn.Module):
    """An additive PE with learned frequencies, declared like a built-in."""

    kind = "additive"
    property_checks = ("permutation",)

    def __init__(self, d_model: int, scale: float) -> None:
        super().__init__()
        self.freqs = nn.Parameter(torch.linspace(1.0, 0.01, d_model) * scale)  # (d_model,)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.sin(positions.float()[:, None] * self.freqs)  # (T,) -> (T, d_model)


def test_class_arguments_come_from_the_model_or_overrides(tmp_path):
    with pytest.raises(ConfigError, match="scale"):  # no default, not a size: must be given
        tl.smoke(pe=LocalPE, out=tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    result = tl.smoke(pe=LocalPE, overrides=["pe.scale=0.5"], out=tmp_path / "run")
    assert result.passed, result.table
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "scale: 0.5" in config and "name: LocalPE" in config


def test_check_runs_the_checks_a_class_declares(tmp_path):
    result = tl.check(pe=LocalPE, overrides=["pe.scale=0.5"], out=tmp_path / "run")
    assert result.passed and set(result.table.check) >= {"pe_breaks_permutation"}


def test_bad_input_raises_the_cli_message(tmp_path):
    with pytest.raises(ConfigError, match="unknown pe 'rotary'; valid: alibi"):
        tl.validate(pe="rotary", out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="single runs"):
        tl.smoke(overrides=["-m"])


def test_a_failing_run_is_a_result_not_an_exception(tmp_path):
    result = tl.reverse_task(pe="none", arch="encoder", max_steps=5, out=tmp_path / "run")
    assert not result.passed and result.exit_code == 1
    assert result.table.role.tolist() == ["chosen"] and result.summary.status[0] == "failed"
    assert "failed (exit code 1)" in repr(result)


def test_testing_assertions_say_what_failed():
    class Swapped(nn.Module):  # defined in a function: no import path at all
        kind = "rotary"

        def __init__(self, head_dim: int) -> None:
            super().__init__()

        def forward(self, q, k, positions):
            from transformer_lab.components.positional import apply_rotary

            return apply_rotary(q, positions), apply_rotary(k, positions.flip(0))

    with pytest.raises(AssertionError, match=r"pe=Swapped: rotary_relative FAIL: q\.k at"):
        assert_rope_relative(Swapped)
    assert_rope_relative("rope")
    with pytest.raises(AssertionError, match="is not a rotary PE"):
        assert_rope_relative("sinusoidal")
    with pytest.raises(AssertionError, match=r"pe=none \(arch=encoder\): tlab smoke failed"):
        assert_trains(pe="none", overrides=["train.lr=1e-9"])


def test_notebook_classes_run_without_a_config_file(tmp_path, monkeypatch):
    """Classes defined in a function (no import path) for pe, ffn and norm_layer: chosen
    in-process, no temporary config directory; config.yaml names each class by its module and
    qualified name; nothing of them is left in the process after the run."""
    import tempfile

    from transformer_lab.config.instantiate import given_targets
    from transformer_lab.config.tree import group_choices

    class NotebookPE(nn.Module):
        kind = "additive"

        def __init__(self, d_model: int, base: float = 1.0) -> None:
            super().__init__()
            self.freqs = nn.Parameter(torch.linspace(1.0, 0.01, d_model) * base)  # (d_model,)

        def forward(self, positions: torch.Tensor) -> torch.Tensor:
            return torch.sin(positions.float()[:, None] * self.freqs)  # (T,) -> (T, d_model)

    class NotebookFFN(nn.Module):
        def __init__(self, d_model: int, d_ff: int) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))  # (B, T, D) -> (B, T, D)

    class NotebookNorm(nn.Module):
        def __init__(self, dim: int, eps: float = 1e-5) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(dim, eps=eps)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(x)

    temporary: list[tuple] = []
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp",  # TemporaryDirectory calls it too
                        lambda *a, **k: temporary.append((a, k)) or mkdtemp(*a, **k))
    result = tl.smoke(pe=NotebookPE, ffn=NotebookFFN, norm_layer=NotebookNorm,
                      overrides=["pe.base=2.0", "norm_layer.eps=1e-6"], out=tmp_path / "run")
    assert result.passed, result.table
    assert temporary == [] and [p.name for p in tmp_path.iterdir()] == ["run"]
    summary = result.summary.iloc[0]
    assert (summary.pe, summary.activation, summary.norm_layer) == \
        ("NotebookPE", "NotebookFFN", "NotebookNorm")
    config = (tmp_path / "run" / "config.yaml").read_text()
    for cls in (NotebookPE, NotebookFFN, NotebookNorm):
        assert f"_target_: {cls.__module__}.{cls.__qualname__}\n" in config
    assert "base: 2.0" in config and "eps: 1.0e-06" in config
    assert "pe=NotebookPE" in (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text()
    assert "NotebookPE" not in group_choices("pe") and given_targets() == set()

    compared = tl.compare_activations(["relu", NotebookFFN], steps=3, seeds=1,
                                      overrides=["model=tiny", "task.eval_size=32"],
                                      out=tmp_path / "compare")
    assert compared.passed and list(compared.table.activation) == ["relu", "NotebookFFN"]


class HiddenFFN(nn.Module):
    """An FFN of its own hidden width (not the model's d_ff)."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))  # (B, T, D) -> (B, T, hidden) -> (B, T, D)


def test_instances_are_built_from_copies_of_themselves(tmp_path):
    """Two instances of one class in one command are two choices, each model built from a
    copy of its own instance (its parameter count, its weights); config.yaml names the class's
    import path; the instances are left as they were."""
    narrow, wide = HiddenFFN(8, 4), HiddenFFN(8, 24)
    before = {k: v.clone() for k, v in narrow.state_dict().items()}
    own = [sum(p.numel() for p in ffn.parameters()) for ffn in (narrow, wide)]

    smoke = tl.smoke(ffn=narrow, overrides=["model=tiny"], out=tmp_path / "smoke")
    assert smoke.passed, smoke.table
    row = smoke.table.set_index("check").loc["param_count"]
    assert row.status == "PASS", row.detail  # the formula counts the instance's own parameters
    config = (tmp_path / "smoke" / "config.yaml").read_text()
    assert f"_target_: {HiddenFFN.__module__}.HiddenFFN\n" in config
    assert all(torch.equal(before[k], v) for k, v in narrow.state_dict().items())

    compared = tl.compare_activations([narrow, wide], steps=3, seeds=1,
                                      overrides=["model=tiny", "task.eval_size=32"],
                                      out=tmp_path / "compare")
    assert list(compared.table.activation) == ["HiddenFFN", "HiddenFFN_2"]
    assert list(compared.table.ffn_params) == own  # model=tiny: one layer


def test_an_importable_class_given_to_the_api_loads_with_trust_code(tmp_path, monkeypatch):
    """A run's weights file records a given class by its import path: refused as untrusted,
    rebuilt from that class with --trust-code after the command."""
    from transformer_lab.config.registry import trusting_code
    from transformer_lab.training.checkpoint import load_trained, read_header

    (tmp_path / "api_given_ffn.py").write_text(
        "from torch import nn\n\n\n"
        "class SizedFFN(nn.Sequential):\n"
        "    def __init__(self, d_model: int, d_ff: int) -> None:\n"
        "        super().__init__(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from api_given_ffn import SizedFFN

    compared = tl.compare_activations(["relu", SizedFFN], steps=3, seeds=1,
                                      overrides=["model=tiny", "task.eval_size=32"],
                                      out=tmp_path / "run")
    assert compared.passed, compared.table
    (weights,) = (tmp_path / "run" / "models" / "SizedFFN").glob("*.safetensors")
    with pytest.raises(ConfigError, match="ffn._target_=api_given_ffn.SizedFFN is not one"):
        read_header(weights)
    with trusting_code():
        trained = load_trained(weights)
    assert type(trained.model.blocks[0].feedforward) is SizedFFN


def test_a_given_component_is_built_from_the_object():
    """A node given in this process is built from its class, with its keyword arguments only,
    or as a copy of its instance (for a partial too); by its _target_ and name only, and only
    within the block."""
    from transformer_lab.config.instantiate import components_given, instantiate_component

    class Local(HiddenFFN):  # defined in a function: its _target_ cannot be imported
        pass

    instance = Local(8, 4)
    target = f"{Local.__module__}.{Local.__qualname__}"
    with components_given({(target, "A"): Local, (target, "B"): instance}):
        built = instantiate_component({"_target_": target, "name": "A", "hidden": 3}, "ffn",
                                      d_model=5)
        assert type(built) is Local and built.up.weight.shape == (3, 5)  # (hidden, d_model)
        with pytest.raises(ConfigError, match="ffn=A: .*'_convert_'"):  # keyword arguments
            instantiate_component({"_target_": target, "name": "A", "d_model": 5,
                                   "hidden": 2, "_convert_": "all"}, "ffn")
        make = instantiate_component({"_target_": target, "name": "B", "_partial_": True}, "ffn")
        copied = make(8)
        assert copied is not instance and torch.equal(copied.up.weight, instance.up.weight)
        with pytest.raises(ConfigError, match="ffn=C: .*<locals>"):  # another name: imported
            instantiate_component({"_target_": target, "name": "C", "hidden": 3}, "ffn",
                                  d_model=5)
    with pytest.raises(ConfigError, match="ffn=A: .*<locals>"):
        instantiate_component({"_target_": target, "name": "A", "hidden": 3}, "ffn", d_model=5)


def test_the_preflight_refuses_as_in_the_cli(tlab, tmp_path):
    class WrongShapeFFN(nn.Module):
        def __init__(self, d_model: int) -> None:
            super().__init__()
            self.out = nn.Linear(d_model, 2 * d_model)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(x)  # (B, T, D) -> (B, T, 2D): the wrong shape

    with pytest.raises(ConfigError, match="ffn=WrongShapeFFN") as refused:
        tl.smoke(ffn=WrongShapeFFN, out=tmp_path / "run")
    assert "\n" not in str(refused.value) and not (tmp_path / "run").exists()
    code, _, err = tlab("experiment=smoke", "train.lr=-1", f"hydra.run.dir={tmp_path / 'cli'}")
    assert code == 2
    with pytest.raises(ConfigError) as refused:
        tl.smoke(overrides=["train.lr=-1"], out=tmp_path / "api")
    assert str(refused.value) in " ".join(err.split())
    assert not (tmp_path / "api").exists()


TINY_LM = ["model=tiny", "task.eval_size=32"]


def test_train_and_compare_take_the_clis_settings(tlab, tmp_path):
    """``tl.train(lr=...)`` writes what ``tlab train --lr`` writes; ``tl.compare`` varies a key
    as ``--vary``; a training setting's name is checked like an option's."""
    settings = ["train.steps=6", "train.batch_size=4", "train.lr=0.01", "train.eval_every=3"]
    assert tlab("experiment=train", "task=lm", *TINY_LM, *settings,
                f"hydra.run.dir={tmp_path / 'cli'}")[0] == 0
    result = tl.train(task="lm", steps=6, batch_size=4, lr=0.01, eval_every=3,
                      overrides=TINY_LM, out=tmp_path / "api")
    assert result.passed and result.table_name == "summary"
    cli = pd.read_csv(tmp_path / "cli" / "metrics.csv")
    numbers = [c for c in cli.columns if c not in TIMING | {"step_ms", "mfu"}]
    pd.testing.assert_frame_equal(result.read("metrics")[numbers], cli[numbers])
    from typer.testing import CliRunner

    from transformer_lab.cli import app
    printed = CliRunner().invoke(app, ["sample", str(result.run_dir), "--prompt", "1 2 3",
                                       "--tokens", "5", "--greedy", "--no-echo"])
    texts = tl.sample(result.run_dir, "1 2 3", tokens=5, greedy=True)
    assert printed.exit_code == 0 and texts == [printed.stdout.strip()]
    assert len(texts[0].split()) == 5  # five token ids
    if importlib.util.find_spec("transformers") is not None:
        exported = tl.export(result.run_dir, tmp_path / "hf")
        assert exported == tmp_path / "hf" and (exported / "config.json").is_file()
    compared = tl.compare("train.lr", [0.01, 0.003], steps=4, seeds=2, batch_size=4,
                          overrides=["task=lm", *TINY_LM], out=tmp_path / "cmp")
    table = compared.table
    assert compared.passed and list(table.variant) == [0.01, 0.003]
    assert list(table.varied) == ["train.lr"] * 2 and list(table.seeds) == [2, 2]
    with pytest.raises(ConfigError, match="'lrr' is not a training setting; did you mean lr"):
        tl.train(lrr=0.01, out=tmp_path / "bad")
    with pytest.raises(ConfigError, match="'checkpoint' is not a training setting"):
        tl.compare("pe", ["rope", "alibi"], checkpoint=False, out=tmp_path / "bad2")
