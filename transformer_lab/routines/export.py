"""``tlab export RUN_DIR --to-hf OUT_DIR``: a trained run's model as a Hugging Face checkpoint,
written in a staging folder and renamed into place (docs/export.md)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transformer_lab.errors import ConfigError
from transformer_lab.interop.hf_export import Route, export_model
from transformer_lab.training.checkpoint import WeightsHeader, choose_model, load_trained


@dataclass(frozen=True)
class Export:
    """What was exported and where."""

    header: WeightsHeader  # the model exported
    models: list[WeightsHeader]  # every model of the run
    out_dir: Path
    route: Route  # the transformers class and why
    files: list[str]  # the file names written in out_dir
    tokenizer: str | None  # the tokenizer written (char, byte, bpe), or None


def check_new_directory(out_dir: Path) -> None:
    """``ConfigError`` for an ``OUT_DIR`` that is a file or a folder holding files."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--to-hf {out_dir} is a file; give a new or empty directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise ConfigError(f"--to-hf {out_dir} holds files already; tlab never writes among your "
                          "files: give a new or empty directory")


def export_run(path: Path, out_dir: Path, variant: str | None = None,
               model_seed: int | None = None) -> Export:
    """Export the model of run ``path`` (a run directory or a weights file) chosen by
    ``variant`` and ``model_seed`` to ``out_dir``."""
    from transformer_lab.interop.hf_tokenizer import hf_tokenizer

    check_new_directory(out_dir)
    header, models = choose_model(path, variant, model_seed, option="tlab export")
    trained = load_trained(header.path)
    tokenizer = None if trained.tokenizer is None else hf_tokenizer(trained.tokenizer)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"tlab_export_{out_dir.name}_".replace(".", "_"),
                                    suffix="_part", dir=out_dir.parent))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a one-file write needs no "Writing model shards" bar
    try:
        route = export_model(trained.model, trained.spec.model, staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        check_new_directory(out_dir)  # still new: nobody wrote there meanwhile
        if out_dir.is_dir():
            out_dir.rmdir()
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Export(header, models, out_dir, route, sorted(p.name for p in out_dir.iterdir()),
                  None if trained.tokenizer is None else trained.tokenizer.name)
