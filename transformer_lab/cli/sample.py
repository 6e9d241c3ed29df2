"""``tlab sample RUN_DIR``: a trained model's continuations of a prompt (``routines.sample``)."""

from __future__ import annotations

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
    from transformer_lab.results.console import err_console
    from transformer_lab.routines.sample import Sampling
    from transformer_lab.routines.sample import sample as sample_run

    with usage_errors(), trusted(trust_code):  # trusted: a run with your own components
        settings = Sampling.from_options(tokens, greedy, temperature, top_k, seed, top_p,
                                         num_samples)
        result = sample_run(run_dir, prompt, settings, variant, model_seed)
    choice = other_models(result.models)
    window = result.window
    fed = len(result.prompt) + settings.tokens - 1  # the last token drawn is never fed back
    cropped = "" if window is None or fed <= window else \
        f", context cropped to the model's last {window} tokens (its position table)"
    err_console.print(f"{result.header.path} ({result.header.name}{choice}): {len(result.prompt)}"
                      f" prompt tokens, {settings.tokens} new, {settings.describe()}{cropped}",
                      markup=False, highlight=False, soft_wrap=True)
    for index, text in enumerate(result.texts):
        if index:
            typer.echo("-" * 15)
        head = typer.style(result.prompt_text + result.joiner, bold=True) if echo else ""
        typer.echo(head + text)
