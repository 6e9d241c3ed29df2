"""A run directory from elsewhere is data, never code (issue 33; docs/security.md).

Crafted copies of one tiny trained run name callables in their saved config (a library function
that writes a file, a module planted in the working directory, a nested ``_target_``, ``_args_``
and ``_partial_`` tricks, a target in the weights' header only, an interpolation): every command
that loads a run refuses them with exit code 2 before anything is imported or written. Runs made
by tlab (one model, a compared run's variant, an exported HF directory) load as before, a run
with the user's own component loads with ``--trust-code`` only, and ``tlab train from_run=``
fine-tunes from the run's weights.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from helpers import read_csv
from omegaconf import OmegaConf
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file
from typer.testing import CliRunner

from transformer_lab.app.hydra_app import main
from transformer_lab.cli import app
from transformer_lab.config.instantiate import components_given
from transformer_lab.config.registry import check_saved_config, trusting_code, user_components
from transformer_lab.config.spec import RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.model import build_model
from transformer_lab.results.run_directory import WEIGHTS_FILE

VERSE = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
         "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of "
         "troubles\nAnd by opposing end them. To die: to sleep;\nNo more; and by a sleep to say "
         "we end\nThe heart-ache and the thousand natural shocks\nThat flesh is heir to.\n\n")
TINY_TEXT = ["task=text", "task.seq_len=32", "task.eval_size=32", "train.batch_size=8",
             "train.lr=1e-2", "train.eval_every=0", "train.warmup=5", "logger.progress=false"]
FINE_TUNE = [*TINY_TEXT, "train.steps=4", "train.eval_every=2", "train.lr=1e-4",
             "train.warmup=0"]  # 2 steps at a small learning rate before the first held-out loss
LLAMA = ["preset=llama", "model.n_layers=1", "model.d_model=32", "model.d_ff=86"]
PLANTED = "tlab_planted_component"  # the module a crafted run names, planted in the cwd
REPO = Path(__file__).resolve().parent.parent


def tlab(*args: str | Path) -> tuple[int, str, str]:
    """A ``tlab`` command through its command line: (exit code, stdout, stderr)."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("safe")


@pytest.fixture(scope="module")
def verse(root) -> Path:
    path = root / "verse.txt"
    path.write_text(VERSE * 8, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def llama_run(root, verse) -> Path:
    """A tiny LLaMA trained 200 steps on the verse, characters (a few seconds on one core)."""
    out = root / "llama"
    assert main(["experiment=train", *TINY_TEXT, f"task.path={verse}", *LLAMA,
                 "train.steps=200", f"hydra.run.dir={out}"]) == 0
    return out


# --- crafted runs ---------------------------------------------------------------------------

def numpy_save(marker: Path) -> dict:
    """A node that calls ``numpy.save(marker, [1, 2])``: writes a file where the crafter says."""
    return {"_target_": "numpy.save", "file": str(marker), "arr": [1, 2]}


def library_function(cfg: dict, marker: Path) -> str:
    cfg["pe"] = {"name": "rope", **numpy_save(marker)}
    return "pe._target_=numpy.save"


def planted_module(cfg: dict, marker: Path) -> str:
    cfg["pe"]["_target_"] = f"{PLANTED}.PlantedPE"
    return f"pe._target_={PLANTED}.PlantedPE"


def nested_target(cfg: dict, marker: Path) -> str:
    cfg["ffn"]["activation"] = numpy_save(marker)  # inside a registered component's arguments
    return "ffn.activation._target_=numpy.save"


def partial_args(cfg: dict, marker: Path) -> str:
    # built as a partial, later called with d_model: numpy.save(marker, d_model)
    cfg["norm_layer"] = {"name": "rmsnorm", "_target_": "numpy.save", "_partial_": True,
                         "_args_": [str(marker)]}
    return "norm_layer._target_=numpy.save"


def args_of_a_registered_component(cfg: dict, marker: Path) -> str:
    cfg["norm_layer"]["_args_"] = [numpy_save(marker)]  # tlab's RMSNorm, a callable argument
    return "norm_layer._args_"


def interpolation(cfg: dict, marker: Path) -> str:
    cfg["ffn"]["activation"] = "${oc.create:{_target_: numpy.save, file: " + str(marker) + "}}"
    return "ffn.activation="


CRAFTS = {f.__name__: f for f in (library_function, planted_module, nested_target,
                                  partial_args, args_of_a_registered_component, interpolation)}


def craft(base: Path, out: Path, edit: Callable[[dict, Path], str], marker: Path,
          header_only: bool = False) -> str:
    """A copy of run ``base`` whose saved config ``edit`` changed, in the weights' header and
    (unless ``header_only``) in config.yaml; returns the text the refusal must name."""
    shutil.copytree(base, out)
    weights = out / WEIGHTS_FILE
    with safe_open(str(weights), framework="pt") as file:
        metadata = file.metadata()
    cfg = yaml.safe_load(metadata["config"])
    named = edit(cfg, marker)
    save_file(load_file(str(weights)), str(weights),
              {**metadata, "config": yaml.safe_dump(cfg)})
    if not header_only:
        (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    return named


@pytest.fixture
def planted(tmp_path, monkeypatch) -> Path:
    """The working directory holds a module that writes a marker file when imported."""
    marker = tmp_path / "planted-was-imported"
    (tmp_path / f"{PLANTED}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "class PlantedPE:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    return marker


def loading_commands(run: Path, out: Path, verse: Path) -> dict[str, list[str | Path]]:
    """Every command that loads a run, writing (if it ran) under ``out``."""
    text = [f"task.path={verse}", "task.seq_len=32", "task.eval_size=32"]
    return {
        "sample": ["sample", run, "--prompt", "To", "--tokens", "4"],
        "export": ["export", run, "--to-hf", out],
        "check": ["check", "--from-run", run, "--out", out, "-q"],
        "plot-pe": ["plot-pe", "--from-run", run, "--max-len", "16", "--out", out, "-q"],
        "extrapolate": ["extrapolate", "--from-run", run, "--task", "text", *text,
                        "--out", out, "-q"],
        "train": ["train", f"from_run={run}", *text, "--steps", "2", "--out", out, "-q"],
    }


@pytest.mark.parametrize("header_only", [False, True], ids=["config", "header-only"])
@pytest.mark.parametrize("name", list(CRAFTS))
def test_every_loading_command_refuses_a_crafted_run(llama_run, verse, tmp_path, planted,
                                                     name, header_only):
    marker = tmp_path / "written-by-the-crafted-run.npy"
    run = tmp_path / "crafted"
    named = craft(llama_run, run, CRAFTS[name], marker, header_only=header_only)
    if header_only:  # the run's config.yaml is untouched: only the weights' header names it
        assert (run / "config.yaml").read_text() == (llama_run / "config.yaml").read_text()
    for command, args in loading_commands(run, tmp_path / "out", verse).items():
        for trust in ([], ["--trust-code"]):  # nothing recorded: refused even when trusted
            code, stdout, err = tlab(*args, *trust)
            flat = " ".join(err.split())
            assert code == 2, (command, trust, err + stdout)
            assert named in flat and f"{run / WEIGHTS_FILE}" in flat, (command, flat)
            assert "Traceback" not in err + stdout
            assert not (tmp_path / "out").exists(), command
            assert not marker.exists() and not planted.exists(), command
            assert PLANTED not in sys.modules, command
            if not trust and name != "interpolation":  # how a run of your own components loads
                assert "--trust-code" in flat, flat


def test_a_resumed_run_refuses_recorded_code(llama_run, tmp_path, planted):
    """``--resume`` runs the overrides a run recorded again: one that names code is refused."""
    marker = tmp_path / "written.npy"
    for i, override in enumerate((
            "pe._target_=numpy.save", f"pe._target_={PLANTED}.PlantedPE",
            "+ffn.activation={_target_:numpy.save,file:" + str(marker) + ",arr:[1]}",
            "+norm_layer._args_=[" + str(marker) + "]", "+norm_layer._partial_=false",
            "+ffn.activation=${oc.create:x}", "+hydra.job.env_set.LD_PRELOAD=/tmp/x.so")):
        run = tmp_path / f"run{i}"
        shutil.copytree(llama_run, run)
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["task=text", override]))
        (run / "checkpoint.pt").write_bytes(b"")  # refused before the checkpoint is read
        info = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**info, "status": "interrupted"}))
        before = sorted(p.name for p in run.rglob("*"))
        code, stdout, err = tlab("train", "--resume", run)
        assert code == 2 and override in " ".join(err.split()), err + stdout
        assert sorted(p.name for p in run.rglob("*")) == before
        assert not marker.exists() and not planted.exists() and PLANTED not in sys.modules


def test_a_resumed_sweep_refuses_recorded_code(tmp_path):
    for i, (task, hydra) in enumerate(((["pe=rope", "ffn._target_=numpy.save"], []),
                                       (["pe=rope"], ["hydra.job.env_set.PYTHONSTARTUP=/x.py"]),
                                       (["pe=rope"], ["+hydra.callbacks.x._target_=numpy.save"]),
                                       (["pe=rope"], ["hydra.launcher.setup=[sh,/x]"]))):
        sweep = tmp_path / f"sweep{i}"
        sweep.mkdir()
        (sweep / "multirun.yaml").write_text(yaml.safe_dump(
            {"hydra": {"overrides": {"task": task, "hydra": hydra}}}))
        code, stdout, err = tlab("smoke", "--resume", sweep)
        flat = " ".join(err.split())
        assert code == 2 and [*task, *hydra][-1] in flat, err + stdout
        assert "multirun.yaml" in flat and sorted(sweep.iterdir()) == [sweep / "multirun.yaml"]


def test_report_reads_a_crafted_run_as_data(llama_run, tmp_path, planted, monkeypatch):
    marker = tmp_path / "written.npy"
    runs = tmp_path / "runs"
    runs.mkdir()
    craft(llama_run, runs / "crafted", library_function, marker)
    monkeypatch.setenv("TLAB_TEST_SECRET", "secret-value-from-the-environment")
    config = yaml.safe_load((runs / "crafted" / "config.yaml").read_text())
    config["seed_init"] = "${oc.env:TLAB_TEST_SECRET}"  # read as text, never resolved
    config["task"]["_target_"] = f"{PLANTED}.PlantedPE"
    (runs / "crafted" / "config.yaml").write_text(yaml.safe_dump(config))
    code, stdout, err = tlab("report", runs, "--out", tmp_path / "report")
    assert code == 0, err + stdout
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "report").iterdir()
                      if p.suffix in (".csv", ".md"))
    assert "secret-value-from-the-environment" not in written + stdout
    assert not marker.exists() and not planted.exists() and PLANTED not in sys.modules


# --- runs made by tlab load as before -------------------------------------------------------

def greedy_reference(weights: Path, prompt: list[int], tokens: int) -> list[int]:
    """The greedy continuation by a model built from the header's config, the whole sequence
    forward for each token (no KV cache, no tlab loading code)."""
    with safe_open(str(weights), framework="pt") as file:
        cfg = OmegaConf.create(file.metadata()["config"])
    model = build_model(RunSpec.of(cfg).model, seed=0).eval()
    load_model(model, str(weights), strict=True)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(tokens):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def test_a_run_and_a_compared_run_sample_as_before(llama_run, tmp_path):
    from transformer_lab.training.checkpoint import tokenizer_from_spec

    with safe_open(str(llama_run / WEIGHTS_FILE), framework="pt") as file:
        tokenizer = tokenizer_from_spec(file.metadata()["tokenizer"])
    code, out, err = tlab("sample", llama_run, "--prompt", "To be", "--tokens", "16", "--greedy",
                          "--no-echo")
    assert code == 0, err
    expected = greedy_reference(llama_run / WEIGHTS_FILE, tokenizer.encode("To be").tolist(), 16)
    assert out == tokenizer.decode(expected) + "\n"

    compared = tmp_path / "cmp"
    assert main(["experiment=compare", "routine.vary.key=pe", "routine.vary.values=[rope,alibi]",
                 "routine.steps=5", "task=lm", "model=tiny", "logger.progress=false",
                 f"hydra.run.dir={compared}"]) == 0
    code, out, err = tlab("sample", compared, "--variant", "alibi", "--prompt", "3 1 4",
                          "--tokens", "8", "--greedy", "--no-echo")
    assert code == 0, err
    expected = greedy_reference(compared / "models" / "alibi" / "seed0.safetensors", [3, 1, 4], 8)
    assert out.split() == [str(t) for t in expected]


def test_an_exported_directory_loads_with_the_same_logits(llama_run, verse, tmp_path):
    """``from_hf`` gives the run's logits; ``tlab train from_hf=DIR`` starts from them."""
    pytest.importorskip("transformers")
    from transformer_lab.interop.hf import from_hf
    from transformer_lab.training.checkpoint import load_trained

    code, _, err = tlab("export", llama_run, "--to-hf", tmp_path / "hf")
    assert code == 0, err
    _, imported = from_hf(str(tmp_path / "hf"))
    tokens = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        ours, theirs = load_trained(llama_run / WEIGHTS_FILE).model(tokens), imported(tokens)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)  # fp32, same weights
    assert main(["experiment=train", f"from_hf={tmp_path / 'hf'}", *FINE_TUNE,
                 f"task.path={verse}", f"hydra.run.dir={tmp_path / 'tuned'}"]) == 0
    assert main(["experiment=train", *LLAMA, *FINE_TUNE, f"task.path={verse}",
                 f"hydra.run.dir={tmp_path / 'fresh'}"]) == 0
    assert_starts_from(llama_run, tmp_path / "tuned", tmp_path / "fresh")


def test_a_run_of_your_own_component_loads_with_trust_code_only(tmp_path, monkeypatch, verse):
    """pe=my_sinusoidal of examples/configs (``examples.my_components``, importable from the
    repository root): recorded with the weights, loaded only with --trust-code."""
    monkeypatch.chdir(REPO)
    run = tmp_path / "mine"
    assert main(["--config-dir", str(REPO / "examples" / "configs"), "experiment=train",
                 "pe=my_sinusoidal", "task=lm", "model=tiny", "train.steps=3",
                 "logger.progress=false", f"hydra.run.dir={run}"]) == 0
    with safe_open(str(run / WEIGHTS_FILE), framework="pt") as file:
        recorded = json.loads(file.metadata()["components"])
    assert recorded == [yaml.safe_load((REPO / "examples" / "configs" / "pe" /
                                        "my_sinusoidal.yaml").read_text())["_target_"]]
    code, stdout, err = tlab("sample", run, "--prompt", "3 1", "--tokens", "5", "--greedy")
    assert code == 2 and recorded[0] in err and "--trust-code" in " ".join(err.split()), err
    code, out, err = tlab("sample", run, "--prompt", "3 1", "--tokens", "5", "--greedy",
                          "--trust-code", "--no-echo")
    assert code == 0, err
    assert out.split() == [str(t) for t in greedy_reference(run / WEIGHTS_FILE, [3, 1], 5)]
    code, _, err = tlab("check", "--from-run", run, "--out", tmp_path / "c", "-q")
    assert code == 2 and "--trust-code" in " ".join(err.split()), err
    assert not (tmp_path / "c").exists()
    # trusted, but a target the run did not record is still refused
    crafted = tmp_path / "crafted"
    named = craft(run, crafted, nested_target, tmp_path / "x.npy")
    code, _, err = tlab("sample", crafted, "--prompt", "3", "--trust-code")
    assert code == 2 and named in " ".join(err.split()) and recorded[0] in err, err


def test_saved_config_check_by_name():
    cfg = {"pe": {"_target_": "transformer_lab.components.positional.RotaryPositionalEncoding"},
           "norm_layer": {"_target_": "transformer_lab.components.norms.RMSNorm",
                          "_partial_": True},
           "optimizer": {"_target_": "torch.optim.AdamW"},
           "task": {"_target_": "transformer_lab.tasks.TextTask"}}
    check_saved_config(cfg, "saved.yaml")  # tlab's own: accepted
    for bad, named in (
            ({"a": [{"b": {"_target_": "os.getcwd"}}]}, "a[0].b._target_=os.getcwd"),
            ({"pe": {"_target_": "transformer_lab.config.instantiate.functools.partial"}},
             "functools.partial"),  # an attribute path through one of tlab's modules
            ({"pe": {"_target_": "__main__.MyPE"}},
             "__main__.MyPE"),  # a Python API class not given in this process
            ({"norm_layer": {"_target_": "transformer_lab.components.norms.RMSNorm",
                             "_partial_": "yes"}}, "_partial_"),
            ({"pe": {"_partial_": True}}, "_partial_"),
            ({"pe": {"_target_": ["not", "a", "name"]}}, "not a component name")):
        with pytest.raises(ConfigError, match="saved.yaml") as refused:
            check_saved_config(bad, "saved.yaml")
        assert named in str(refused.value)
    given = {**cfg, "pe": {"_target_": "__main__.MyPE", "name": "MyPE"}}
    with components_given({("__main__.MyPE", "MyPE"): torch.nn.Identity}):
        check_saved_config(given, "saved.yaml")  # given to the Python API in this process
        assert user_components(given) == ["__main__.MyPE"]  # recorded for --trust-code
    with pytest.raises(ConfigError, match="__main__.MyPE"):  # and only while it is given
        check_saved_config(given, "saved.yaml")
    with trusting_code():  # trusted: only what the run recorded
        check_saved_config({"pe": {"_target_": "mine.PE"}}, "saved.yaml", recorded=["mine.PE"])
        with pytest.raises(ConfigError, match="recorded"):
            check_saved_config({"pe": {"_target_": "other.PE"}}, "saved.yaml",
                               recorded=["mine.PE"])


# --- tlab train from_run= -------------------------------------------------------------------

def assert_starts_from(source: Path, tuned: Path, fresh: Path) -> None:
    """The first held-out loss of a fine-tune (small learning rate, 2 steps) is near the
    source run's final one, far below a fresh model's after as many steps."""
    (summary,) = read_csv(source / "summary.csv")
    loaded = float(summary["final_loss"])  # the source model on the same held-out windows

    def first_loss(run: Path) -> float:
        return next(float(r["loss"]) for r in read_csv(run / "metrics.csv") if r["split"] == "val")

    first, scratch = first_loss(tuned), first_loss(fresh)
    assert abs(first - loaded) < 0.1 * (scratch - loaded), (first, loaded, scratch)


def test_train_from_run_starts_from_its_weights(llama_run, verse, tmp_path):
    assert main(["experiment=train", f"from_run={llama_run}", *FINE_TUNE, f"task.path={verse}",
                 f"hydra.run.dir={tmp_path / 'tuned'}"]) == 0
    assert main(["experiment=train", *LLAMA, *FINE_TUNE, f"task.path={verse}",
                 f"hydra.run.dir={tmp_path / 'fresh'}"]) == 0
    assert_starts_from(llama_run, tmp_path / "tuned", tmp_path / "fresh")


def test_train_from_run_refuses_another_architecture(llama_run, verse, tmp_path):
    code, stdout, err = tlab("train", f"from_run={llama_run}", *TINY_TEXT,
                             f"task.path={verse}", "model.n_layers=2", "--out",
                             tmp_path / "out")
    flat = " ".join(err.split())
    assert code == 2 and "model.n_layers is 2 here, 1 in the run" in flat, err + stdout
    assert not (tmp_path / "out").exists()
