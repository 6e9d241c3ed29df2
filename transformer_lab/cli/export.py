"""``tlab export RUN_DIR --to-hf OUT_DIR``: a trained model as a Hugging Face checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from transformer_lab.cli.common import (
    ModelSeed,
    RunPath,
    TrustCode,
    Variant,
    other_models,
    trusted,
    usage_errors,
)


def export(
    run_dir: RunPath,
    to_hf: Annotated[Path, typer.Option(
        "--to-hf", help="The folder to write (new or empty): config.json, model.safetensors, "
        "generation_config.json, the tokenizer's files (and modeling_tlab.py where no "
        "transformers class computes the run's model).", show_default=False)],
    variant: Variant = None,
    model_seed: ModelSeed = None,
    trust_code: TrustCode = False,
) -> None:
    """Write the trained model of RUN_DIR (tlab train, tlab compare) as a Hugging Face causal LM
    with its tokenizer: AutoModelForCausalLM and AutoTokenizer.from_pretrained(OUT_DIR) load it
    offline, with the same logits and token ids as tlab: as LLaMA, Mixtral, GPT-2, GPT-NeoX or
    BLOOM where one of them computes the run's model, else with the run's own code beside the
    weights (modeling_tlab.py: from_pretrained(OUT_DIR, trust_remote_code=True), no tlab
    needed). The console says which and why."""
    from transformer_lab.results.console import console
    from transformer_lab.routines.export import export_run

    with usage_errors(), trusted(trust_code):  # trusted: a run with your own components
        result = export_run(run_dir, to_hf, variant, model_seed)
    choice = other_models(result.models)
    tokenizer = f"{result.tokenizer} tokenizer" if result.tokenizer else \
        "no tokenizer (a synthetic task's tokens are their ids)"
    route = result.route
    load = ", trust_remote_code=True" if route.remote_code else ""
    console.print(f"{result.header.path} ({result.header.name}{choice}) -> {result.out_dir}: "
                  f"{route.hf_class}, {tokenizer} ({', '.join(result.files)})\n"
                  f"  why: {route.why}\n"
                  f"  load: AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r}{load})",
                  markup=False, highlight=False, soft_wrap=True)
