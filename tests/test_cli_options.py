"""Each command's options come from (or are checked against) the settings it uses: `tlab train`
has one option per TrainSettings field, and an option or key a command does not have is
refused in one line, exit code 2, naming the nearest valid one."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import typer
import yaml
from omegaconf import OmegaConf
from typer.testing import CliRunner

from transformer_lab.app.arguments import nearest
from transformer_lab.cli import app
from transformer_lab.cli.common import TRAINING_PANEL, train_settings_fields
from transformer_lab.config.compose import compose
from transformer_lab.config.tree import CONFIG_DIR
from transformer_lab.training.trainer import TrainSettings

TINY_LM = ["--task", "lm", "model=tiny", "task.eval_size=8", "--batch-size", "4",
           "--eval-every", "0", "-q"]


def command(name: str):
    return typer.main.get_command(app).commands[name]


def training_params(name: str) -> dict[str, object]:
    return {p.name: p for p in command(name).params
            if getattr(p, "rich_help_panel", None) == TRAINING_PANEL}


def test_train_options_are_the_train_settings_fields_with_their_types():
    """The options read from the source are the dataclass's own fields (names and types)."""
    hints = typing.get_type_hints(TrainSettings)
    expected = {f.name: hints[f.name] for f in dataclasses.fields(TrainSettings)
                if f.name not in ("d_model", "optimizer")}
    read = dict(train_settings_fields())
    assert set(read) == set(expected)
    for name, kind in expected.items():
        assert eval(read[name], {}) == kind, name  # "float | None" is float | None
    params = training_params("train")
    assert set(params) == set(expected)
    assert params["lr"].opts == ["--lr"] and params["batch_size"].opts == ["--batch-size"]


def test_every_training_option_sets_a_key_the_command_composes():
    """An option maps to ``train.<field>``: a key the command's config has (none dangles)."""
    for name, experiment in (("train", "train"), ("compare", "compare")):
        cfg = compose([f"experiment={experiment}", "task=lm", "arch=decoder"])
        for field_name in training_params(name):
            assert OmegaConf.select(cfg, f"train.{field_name}", default="absent") != "absent"
    assert "steps" not in training_params("compare")  # compare's --steps is routine.steps


def test_train_help_lists_the_settings_with_the_experiments_defaults():
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    experiment = yaml.safe_load((CONFIG_DIR / "experiment" / "train.yaml").read_text())["train"]
    for option, key in (("--lr", "lr"), ("--batch-size", "batch_size"),
                        ("--warmup", "warmup"), ("--schedule", "schedule")):
        line = next(line for line in result.output.splitlines() if f" {option} " in line)
        assert f"train.{key}, default {experiment[key]}" in line, line
    for option in ("--device", "--precision", "--checkpoint", "--checkpoint-every",
                   "--grad-clip", "--eval-every", "--log-every", "--steps"):
        assert f" {option} " in result.output
    # compare trains no checkpoints and its length is --steps (routine.steps): none offered
    compare = CliRunner().invoke(app, ["compare", "--help"], env={"COLUMNS": "200"}).output
    assert " --lr " in compare and " --checkpoint " not in compare
    assert " --checkpoint-every " not in compare


@pytest.mark.parametrize("name, candidates, expected", [
    ("--learning-rate", ["--lr", "--pe", "--batch-size"], "--lr"),
    ("--batch", ["--lr", "--batch-size"], "--batch-size"),
    ("train.lrr", ["train.lr", "train.steps"], "train.lr"),
    ("--zzz", ["--lr", "--pe"], None),
])
def test_nearest_name(name, candidates, expected):
    assert nearest(name, candidates) == expected


@pytest.mark.parametrize("args, expected", [
    (["--learning-rate", "1e-3"], "unknown option '--learning-rate' for tlab train; did you "
                                  "mean --lr (the override train.lr=...)?"),
    (["--batchsize", "4"], "did you mean --batch-size (the override train.batch_size=...)?"),
    (["train.lrr=1e-3"], "unknown key 'train.lrr'; did you mean train.lr?"),
    (["lr=1e-3"], "unknown key 'lr'; did you mean train.lr?"),
    (["--lr", "fast"], "Invalid value for '--lr'"),
    (["--grad-clip", "off"], "'off' is not a float or null"),
])
def test_an_option_or_key_train_does_not_have_is_refused_with_the_nearest(
        tmp_path, args, expected):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", *args, "--out", str(out)],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.replace("│", " ").split())
    assert "Traceback" not in result.output and not out.exists()
    if not expected.startswith(("Invalid", "'off'")):  # tlab's own refusals: one line
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_other_commands_suggest_their_own_options(tmp_path):
    result = CliRunner().invoke(app, ["smoke", "--stepz", "3", "--out", str(tmp_path / "r")],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "unknown option '--stepz' for tlab smoke; did you mean --steps?" in result.output


def test_lr_option_sets_train_lr_in_the_saved_config(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", *TINY_LM, "--steps", "2", "--lr", "1e-3",
                                      "--grad-clip", "null", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = OmegaConf.load(out / "config.yaml")
    assert saved.train.lr == pytest.approx(1e-3) and saved.train.steps == 2
    assert saved.train.batch_size == 4 and saved.train.grad_clip is None
