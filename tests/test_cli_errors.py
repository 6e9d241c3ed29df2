"""Bad input: one or two lines naming the bad value and the valid ones, exit code 2, no
traceback, and nothing of an earlier run touched."""

from __future__ import annotations

import pytest
from helpers import TLAB, assert_refused


@pytest.mark.parametrize(
    "args, expected",
    [
        (["pe=rotary"], "unknown pe 'rotary'; valid: alibi, learned, none, rope"),
        (["block=middle"], "unknown block 'middle'; valid: deepnorm, post, pre, sandwich"),
        (["ffn=mish"], "unknown ffn 'mish'; valid: geglu, gelu"),
        (["arch=seq2seq"], "unknown arch 'seq2seq'; valid: decoder, encoder"),
        (["model.d_model=10", "model.n_heads=3"],
         "model.d_model=10 is not divisible by model.n_heads=3"),
        (["pe=rope", "model.d_model=12", "model.n_heads=2", "pe.rotary_fraction=0.5"],
         "rot=int(head_dim * rotary_fraction)=int(6 * 0.5)=3"),
        (["pe=learned", "model.max_len=3"], "pe=learned"),
        (["model.d_model=0"], "model.d_model=0 is not valid; it must be a positive number"),
        (["model.n_layers=-1"], "model.n_layers=-1 is not valid"),
        (["train.steps=0"], "train.steps=0 is not valid"),
        (["routine.steps=0"], "routine.steps=0 is not valid"),
        (["model.d_modle=16"], "d_modle"),
        (["pe="], "unknown pe ''"),
        (["model.d_model==3"], "malformed override 'model.d_model==3'"),
        (["train.schedule=linear"], "train.schedule='linear' is not known; valid: constant, noam"),
        (["train.precision=fp16"],
         "train.precision=fp16 is not valid; it must be one of fp32, bf16"),
        (["task=lm"], "task=lm is next-token prediction and needs arch=decoder"),
        (["task=text", "arch=decoder", "task.path=/no/such/file.txt"],
         "task.path='/no/such/file.txt' is not a readable file"),
        (["hydra/launcher=nonesuch"], "hydra/launcher=nonesuch is not available"),
    ],
)
def test_bad_input_exits_2_with_a_short_message(tlab, tmp_path, args, expected):
    out = tmp_path / "run"  # nothing may be written for an invalid configuration
    stderr = assert_refused(tlab("experiment=smoke", *args, f"hydra.run.dir={out}"), out,
                            expected)
    assert len(stderr.strip().splitlines()) <= 2


def test_learned_pe_longer_than_max_len_names_both_lengths(tlab, tmp_path):
    code, _, stderr = tlab("experiment=smoke", "pe=learned", "model.max_len=3", "task.seq_len=5",
                           f"hydra.run.dir={tmp_path / 'r'}")
    flat = " ".join(stderr.split())
    assert code == 2 and "sequence length 5 is longer than" in flat and "(max_len=3)" in flat


def test_out_directory_holding_a_run_is_refused_and_untouched(tlab, tmp_path):
    out = tmp_path / "run"
    assert tlab("experiment=smoke", f"hydra.run.dir={out}")[0] == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    code, _, stderr = tlab("experiment=smoke", "pe=alibi", f"hydra.run.dir={out}")
    assert code == 2 and "already holds a run" in stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_cli_option_errors_from_typer(tmp_path):
    import subprocess

    result = subprocess.run([TLAB, "smoke", "--steps", "many"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "--steps" in result.stderr and "Traceback" not in result.stderr


def test_default_run_dirs_never_collide(tlab, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert tlab("experiment=smoke", "out_root=outs")[0] == 0
    runs = list((tmp_path / "outs" / "smoke").iterdir())
    assert len(runs) == 2


@pytest.mark.parametrize("old, new", [("norm=post", "block"), ("activation=relu", "ffn")])
def test_old_group_names_still_work_with_a_deprecation_line(tlab, tmp_path, old, new):
    out = tmp_path / "run"
    code, _, err = tlab("experiment=smoke", old, f"hydra.run.dir={out}")
    assert code == 0, err
    assert f"'{old.split('=')[0]}=' is now '{new}='" in " ".join(err.split())
    assert f"{new}={old.split('=')[1]}" in (out / ".hydra" / "overrides.yaml").read_text()
    summary = (out / "summary.csv").read_text().splitlines()
    column = summary[0].split(",").index({"block": "norm", "ffn": "activation"}[new])
    assert summary[1].split(",")[column] == old.split("=")[1]  # the CSV column keeps its name


def test_an_old_group_name_with_a_bad_choice_names_the_new_group(tlab, tmp_path):
    out = tmp_path / "run"
    assert_refused(tlab("experiment=smoke", "activation=mish", f"hydra.run.dir={out}"), out,
                   "unknown ffn 'mish'")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["experiment=smoke", "train.steps=50"],
         "train.steps=50 is not used by tlab smoke: its training length is routine.steps"),
        (["experiment=reverse_task", "train.steps=50"],
         "train.steps=50 is not used by tlab reverse-task: its training length is "
         "routine.max_steps"),
        (["experiment=budget", "train.steps=50"],
         "train.steps=50 is not used by tlab budget: it trains no model"),
        (["experiment=plot_pe", "train.lr=0.1"],
         "train.lr=0.1 is not used by tlab plot-pe: it trains no model"),
        (["experiment=budget", "optimizer=sgd"],
         "optimizer=sgd is not used by tlab budget: it trains no model"),
        (["experiment=smoke", "train.checkpoint_every=5"],
         "train.checkpoint_every=5 is not used by tlab smoke: only tlab train keeps checkpoints"),
        (["experiment=compare_activations", "train.checkpoint=false"],
         "train.checkpoint=false is not used by tlab compare-activations: only tlab train"),
    ],
)
def test_a_key_the_command_would_not_read_is_refused(tlab, tmp_path, args, expected):
    """Never silently ignored: the key the command reads instead is named."""
    out = tmp_path / "run"
    assert_refused(tlab(*args, f"hydra.run.dir={out}"), out, expected)


def test_the_keys_a_command_reads_are_accepted(tlab, tmp_path):
    code, _, err = tlab("experiment=smoke", "routine.steps=3", f"hydra.run.dir={tmp_path / 'r'}")
    assert code != 2 and (tmp_path / "r" / "smoke.csv").exists(), err  # ran, not refused
    code, _, err = tlab("experiment=budget", "train.threads=1", f"hydra.run.dir={tmp_path / 'b'}")
    assert code == 0 and (tmp_path / "b" / "budget.csv").exists(), err  # every job's threads
