"""The commands that read a trained run's kept weights: ``tlab sample RUN_DIR`` (a model's
continuations of a prompt, ``routines.sample``) and ``tlab export RUN_DIR --to-hf OUT_DIR`` (a
Hugging Face checkpoint, ``routines.export``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from transformer_lab.cli.common import TrustCode, usage_errors

RunPath = Annotated[Path, typer.Argument(
    help="A run directory (tlab train, tlab compare) or one of its weights files.",
    show_default=False)]
Variant = Annotated[str | None, typer.Option(
    "--variant", help="A compared run's model of this variant (default: the first).",
    show_default=False)]
ModelSeed = Annotated[int | None, typer.Option(
    "--model-seed", help="The run's model trained with this seed (default: the first).",
    show_default=False)]


def model_used(result: Any) -> str:
    """``"RUN/models/rope/seed0.safetensors (rope; 3 other models in the run: --variant,
    --model-seed)"``: the weights a command read (no other models: no hint)."""
    others = len(result.models) - 1
    hint = (f"; {others} other model{'s' if others > 1 else ''} in the run: --variant, "
            "--model-seed") if others else ""
    return f"{result.header.path} ({result.header.name}{hint})"


def sample(
    run_dir: RunPath,
    prompt: Annotated[str | None, typer.Option(
        "--prompt", help="Text to continue (a text task's run: its tokenizer encodes it), or "
        "token ids separated by spaces (a synthetic task's run). Default: a newline, or token "
        "0.", show_default=False)] = None,
    tokens: Annotated[int, typer.Option("--tokens", min=1, help="New tokens to generate.")
                      ] = 100,
    greedy: Annotated[bool, typer.Option("--greedy", help="Take the most likely token each "
                                         "time (deterministic).")] = False,
    temperature: Annotated[float | None, typer.Option(
        "--temperature", min=0.0, help="Draw each token from softmax(logits / T) (default 1; "
        "0 is --greedy).", show_default=False)] = None,
    top_k: Annotated[int | None, typer.Option(
        "--top-k", min=1, help="Draw among the K most likely tokens only.",
        show_default=False)] = None,
    top_p: Annotated[float | None, typer.Option(
        "--top-p", min=0.0, max=1.0, help="Draw among the most likely tokens whose "
        "probabilities first add up to P (nucleus sampling).", show_default=False)] = None,
    num_samples: Annotated[int, typer.Option(
        "--num-samples", "-n", min=1, help="Continuations to draw (one seed for all).")] = 1,
    seed: Annotated[int | None, typer.Option(
        "--seed", min=0, help="Seed of the draws (the same seed, the same continuations). "
        "Default: a fresh one, printed to reuse.", show_default=False)] = None,
    echo: Annotated[bool, typer.Option(
        "--echo/--no-echo", help="Print the prompt (in bold on a terminal) before each "
        "continuation.")] = True,
    variant: Variant = None,
    model_seed: ModelSeed = None,
    trust_code: TrustCode = False,
) -> None:
    """Print a trained model's continuations of --prompt (text with a text task's tokenizer,
    token ids on a synthetic task), from the final weights RUN_DIR kept (tlab train, tlab
    compare); stderr says which model was used and the seed. Greedy, or sampled with
    --temperature/--top-k/--top-p; past the model's context window (a learned position
    table) the context is cropped to it."""
    from transformer_lab.app.hydra_app import trusted
    from transformer_lab.results.console import err_console
    from transformer_lab.routines.sample import Sampling
    from transformer_lab.routines.sample import sample as sample_run

    with usage_errors(), trusted(trust_code):  # trusted: a run with your own components
        settings = Sampling.from_options(tokens, greedy, temperature, top_k, seed, top_p,
                                         num_samples)
        result = sample_run(run_dir, prompt, settings, variant, model_seed)
    window = result.window
    fed = len(result.prompt) + settings.tokens - 1  # the last token drawn is never fed back
    cropped = "" if window is None or fed <= window else \
        f", context cropped to the model's last {window} tokens (its position table)"
    err_console.print(f"{model_used(result)}: {len(result.prompt)} prompt tokens, "
                      f"{settings.tokens} new, {settings.describe()}{cropped}",
                      markup=False, highlight=False, soft_wrap=True)
    for index, text in enumerate(result.texts):
        if index:
            typer.echo("-" * 15)
        head = typer.style(result.prompt_text + result.joiner, bold=True) if echo else ""
        typer.echo(head + text)


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
    from transformer_lab.app.hydra_app import trusted
    from transformer_lab.results.console import console
    from transformer_lab.routines.export import export_run

    with usage_errors(), trusted(trust_code):  # trusted: a run with your own components
        result = export_run(run_dir, to_hf, variant, model_seed)
    tokenizer = f"{result.tokenizer} tokenizer" if result.tokenizer else \
        "no tokenizer (a synthetic task's tokens are their ids)"
    route = result.route
    load = ", trust_remote_code=True" if route.remote_code else ""
    console.print(f"{model_used(result)} -> {result.out_dir}: "
                  f"{route.hf_class}, {tokenizer} ({', '.join(result.files)})\n"
                  f"  why: {route.why}\n"
                  f"  load: AutoModelForCausalLM.from_pretrained({str(result.out_dir)!r}{load})",
                  markup=False, highlight=False, soft_wrap=True)
