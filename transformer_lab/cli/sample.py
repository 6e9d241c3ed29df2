"""``tlab sample RUN_DIR``: print a trained model's continuation of a prompt. The work is in
``transformer_lab.routines.sample``."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Annotated

import typer

from transformer_lab.cli.common import ModelSeed, RunPath, TrustCode, Variant, other_models


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
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seed of the draws (the same seed, "
                                      "the same continuation).")] = 0,
    variant: Variant = None,
    model_seed: ModelSeed = None,
    trust_code: TrustCode = False,
) -> None:
    """Print a trained model's continuation of --prompt (text with a text task's tokenizer,
    token ids on a synthetic task), from the final weights RUN_DIR kept (tlab train, tlab
    compare); stderr says which model was used. Greedy, or sampled with --temperature/--top-k
    and --seed."""
    from transformer_lab.app.hydra_app import working_directory_importable
    from transformer_lab.config.registry import trusting_code
    from transformer_lab.errors import EXIT_USAGE, ConfigError
    from transformer_lab.results.console import err_console, print_error
    from transformer_lab.routines.sample import Sampling
    from transformer_lab.routines.sample import sample as sample_run

    try:
        settings = Sampling.from_options(tokens, greedy, temperature, top_k, seed)
        # a run with your own components (_target_): --trust-code, the working directory
        importable = working_directory_importable() if trust_code else nullcontext()
        with trusting_code(trust_code), importable:
            result = sample_run(run_dir, prompt, settings, variant, model_seed)
    except ConfigError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None
    choice = other_models(result.models)
    err_console.print(f"{result.header.path} ({result.header.name}{choice}): {len(result.prompt)}"
                      f" prompt tokens, {len(result.tokens)} new, {settings.describe()}",
                      markup=False, highlight=False, soft_wrap=True)
    typer.echo(result.text)
