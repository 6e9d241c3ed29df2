"""A ``--config-dir`` written for tlab 0.1, with the old group folders ``activation/`` and
``norm/``, still works until 0.3: its choices are choices of ``ffn`` and ``block``, chosen by
either name, in single runs, sweeps, ``tlab list`` and the routines' own look-ups, with one
warning per old folder."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import read_csv
from typer.testing import CliRunner

from transformer_lab.config.tree import CONFIG_DIR, choice_file, group_choices

FOLDER_WARNING = "config folder '{}' is now '{}': rename it (the old name works until tlab 0.3)"


@pytest.fixture
def old_tree(tmp_path) -> Path:
    """A 0.1-style tree: ``activation/my_ffn.yaml`` (a GELU FFN) and ``norm/my_block.yaml``
    (post-LN), copied from tlab's own relu and post with their names changed."""
    tree = tmp_path / "configs"
    (tree / "activation").mkdir(parents=True)
    (tree / "norm").mkdir()
    relu = (CONFIG_DIR / "ffn" / "relu.yaml").read_text()
    (tree / "activation" / "my_ffn.yaml").write_text(
        relu.replace("name: relu", "name: my_ffn").replace("activation: relu", "activation: gelu"))
    post = (CONFIG_DIR / "block" / "post.yaml").read_text()
    (tree / "norm" / "my_block.yaml").write_text(post.replace("name: post", "name: my_block"))
    return tree


def warnings_of(err: str, tree: Path) -> list[int]:
    """How many times each old folder's warning is in ``err`` (rich's wrapping undone)."""
    flat = " ".join(err.split())
    return [flat.count(FOLDER_WARNING.format(tree / old, new))
            for old, new in (("activation", "ffn"), ("norm", "block"))]


@pytest.mark.parametrize("choices", [("ffn=my_ffn", "block=my_block"),
                                     ("activation=my_ffn", "norm=my_block")])
def test_old_folders_hold_choices_of_the_new_groups(tlab, tmp_path, old_tree, choices):
    out = tmp_path / "run"
    code, _, err = tlab("--config-dir", old_tree, "experiment=smoke", *choices,
                        f"hydra.run.dir={out}")
    assert code == 0, err
    assert warnings_of(err, old_tree) == [1, 1]
    (summary,) = read_csv(out / "summary.csv")
    assert (summary["activation"], summary["norm"]) == ("my_ffn", "my_block")
    config = (out / "config.yaml").read_text()
    assert "activation: gelu" in config and "PostNormBlock" in config


def test_a_sweep_over_an_old_folders_choice(tlab, tmp_path, old_tree):
    out = tmp_path / "sweep"
    code, _, err = tlab("--config-dir", old_tree, "experiment=smoke", "ffn=my_ffn,relu",
                        "norm=my_block", "--multirun", f"hydra.sweep.dir={out}")
    assert code == 0, err
    assert warnings_of(err, old_tree) == [1, 1]
    rows = read_csv(out / "sweep.csv")
    assert sorted(r["status"] for r in rows) == ["passed", "passed"]
    assert {read_csv(out / r["run_dir"] / "summary.csv")[0]["activation"] for r in rows} == \
        {"my_ffn", "relu"}


def test_a_routine_finds_an_old_folders_choice(tlab, tmp_path, old_tree):
    """compare-activations looks its activations up itself (``config.variants``)."""
    out = tmp_path / "compare"
    code, _, err = tlab("--config-dir", old_tree, "experiment=compare_activations",
                        "routine.activations=[relu,my_ffn]", "routine.steps=3", "routine.seeds=1",
                        "model=tiny", "task.eval_size=32", f"hydra.run.dir={out}")
    assert code == 0, err
    assert [r["activation"] for r in read_csv(out / "comparison.csv")] == ["relu", "my_ffn"]


def test_a_new_folder_wins_over_an_old_one(tlab, tmp_path, old_tree, recwarn):
    (old_tree / "ffn").mkdir()
    relu = (CONFIG_DIR / "ffn" / "relu.yaml").read_text()
    (old_tree / "ffn" / "my_ffn.yaml").write_text(relu.replace("name: relu", "name: my_ffn"))
    assert choice_file("ffn", "my_ffn", [old_tree]) == old_tree / "ffn" / "my_ffn.yaml"
    assert group_choices("ffn", [old_tree]).count("my_ffn") == 1
    code, stdout, err = tlab("--config-dir", old_tree, "experiment=smoke", "ffn=my_ffn",
                             "--cfg", "job")
    assert code == 0, err
    assert "activation: relu" in stdout and "activation: gelu" not in stdout
    assert not [w for w in recwarn if "ConfigStore" in str(w.message)]  # not merged into it


def test_tlab_list_shows_an_old_folders_choices(old_tree):
    from transformer_lab.cli import app

    result = CliRunner().invoke(app, ["list", "--config-dir", str(old_tree)])
    assert result.exit_code == 0, result.output
    rows = table_rows(result.stdout)
    assert "my_ffn" in rows["ffn"] and "my_block" in rows["block"]
    assert warnings_of(result.stderr, old_tree.resolve()) == [1, 1]
    assert "my_ffn" not in table_rows(CliRunner().invoke(app, ["list"]).stdout)["ffn"]


def table_rows(output: str) -> dict[str, list[str]]:
    """``tlab list``'s table: group -> its choices (rows wrapped over several lines joined)."""
    rows: dict[str, list[str]] = {}
    group = ""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 2:
            group = cells[0] or group
            rows.setdefault(group, []).extend(c.strip() for c in cells[1].split(",") if c.strip())
    return rows
