"""``tlab sample RUN_DIR``: a trained model's continuation of a prompt (not a Hydra routine;
docs/routines.md)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import torch

from transformer_lab.data.tokenizer import CharTokenizer
from transformer_lab.errors import ConfigError
from transformer_lab.training.checkpoint import (
    TrainedModel,
    WeightsHeader,
    choose_model,
    load_trained,
)
from transformer_lab.training.optimizers import first_line

DEFAULT_TEXT_PROMPT = "\n"  # a text's usual separator; a char vocabulary without it: its first


@dataclass(frozen=True)
class Sampling:
    """How the continuation is drawn: ``temperature`` 0 is greedy (argmax)."""

    tokens: int = 100
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0
    num_samples: int = 1
    seed_given: bool = True  # False: a fresh seed drawn for this call (printed, to reuse)

    @classmethod
    def from_options(cls, tokens: int, greedy: bool, temperature: float | None,
                     top_k: int | None, seed: int | None, top_p: float | None = None,
                     num_samples: int = 1) -> Sampling:
        """The command's options (default: temperature 1, a fresh seed); ``ConfigError`` when
        they contradict."""
        drawing = [f"--{name} {value}" for name, value in (("temperature", temperature or None),
                                                           ("top-k", top_k), ("top-p", top_p))
                   if value is not None]
        if greedy and drawing:
            raise ConfigError(f"--greedy takes the most likely token; {drawing[0]} draws one: "
                              "give one of them")
        if top_p is not None and not 0 < top_p <= 1:  # --tokens, --num-samples: typer's min=1
            raise ConfigError(f"--top-p {top_p} is not valid; give a probability in (0, 1]")
        chosen = 0.0 if greedy else (1.0 if temperature is None else float(temperature))
        return cls(int(tokens), chosen, top_k, top_p,
                   secrets.randbelow(2**31) if seed is None else int(seed), int(num_samples),
                   seed_given=seed is not None)

    def describe(self) -> str:
        samples = f" x {self.num_samples} samples" if self.num_samples > 1 else ""
        if self.temperature == 0:
            return "greedy" + samples
        top = f", top-k {self.top_k}" if self.top_k is not None else ""
        top += f", top-p {self.top_p:g}" if self.top_p is not None else ""
        reuse = "" if self.seed_given else f" (reuse with --seed {self.seed})"
        return f"temperature {self.temperature:g}{top}{samples}, seed {self.seed}{reuse}"


def prompt_ids(trained: TrainedModel, prompt: str | None) -> torch.Tensor:
    """The prompt as token ids (1, P), by the run's tokenizer or read as ids on a synthetic
    task (default: a newline, or token 0)."""
    tokenizer, vocab = trained.tokenizer, int(trained.model.token_embedding.num_embeddings)
    if tokenizer is None:  # "3 1 4" (spaces or commas) -> [3, 1, 4]
        prompt = "0" if prompt is None else prompt
        words = prompt.replace(",", " ").split()
        bad = [w for w in words if not w.lstrip("-").isdigit() or not 0 <= int(w) < vocab]
        if bad or not words:
            problem = f": {bad[0]!r} is no token of this run's synthetic task" if bad else \
                " has no token"
            raise ConfigError(f"--prompt {prompt!r}{problem}; give token ids 0..{vocab - 1} "
                              "separated by spaces")
        return torch.tensor([[int(word) for word in words]])
    if prompt is None:
        known = not isinstance(tokenizer, CharTokenizer) or DEFAULT_TEXT_PROMPT in tokenizer.chars
        prompt = DEFAULT_TEXT_PROMPT if known else tokenizer.chars[0]
    if prompt == "":
        raise ConfigError("--prompt is empty; give at least one character to continue")
    if isinstance(tokenizer, CharTokenizer) and (unknown := set(prompt) - set(tokenizer.chars)):
        raise ConfigError(f"--prompt {prompt!r} has characters the run's tokenizer does not know: "
                          f"{''.join(sorted(unknown))!r}; its {len(tokenizer.chars)} are "
                          f"{''.join(tokenizer.chars)!r}")
    return torch.tensor([tokenizer.encode(prompt).tolist()])


def render(trained: TrainedModel, ids: list[int]) -> str:
    """Token ids as text (the run's tokenizer) or, on a synthetic task, as ids."""
    return " ".join(map(str, ids)) if trained.tokenizer is None else trained.tokenizer.decode(ids)


@dataclass(frozen=True)
class Sample:
    """Continuations and where they came from."""

    header: WeightsHeader  # the model used
    models: list[WeightsHeader]  # every model of the run
    prompt: list[int]
    prompt_text: str  # the prompt, rendered as the continuations are
    texts: list[str]  # each continuation, rendered
    window: int | None  # the model's context window (cropped past it), or None
    joiner: str  # between the prompt and a continuation: "" (text) or " " (token ids)


def continue_prompt(trained: TrainedModel, ids: torch.Tensor,
                    sampling: Sampling) -> list[list[int]]:
    """``sampling.num_samples`` continuations of ``ids`` (1, P), ``sampling.tokens`` ids each,
    from one generator seeded by ``sampling.seed``."""
    generator = torch.Generator().manual_seed(sampling.seed)
    rows = ids.repeat(sampling.num_samples, 1)  # (N, P)
    try:
        new = trained.model.generate(rows, sampling.tokens, temperature=sampling.temperature,
                                     top_k=sampling.top_k, top_p=sampling.top_p,
                                     generator=generator)  # (N, tokens)
    except (ValueError, IndexError) as exc:  # e.g. a PE of your own that cannot go further
        first = first_line(exc).split(";")[0]
        raise ConfigError(f"the model cannot continue the prompt ({ids.shape[1]} tokens) by "
                          f"--tokens {sampling.tokens} (model.max_len="
                          f"{trained.spec.model.max_len}, pe={trained.spec.model.pe.name}): "
                          f"{first}; give a shorter --prompt or fewer --tokens") from None
    return new.tolist()


def sample(path: Path, prompt: str | None, sampling: Sampling, variant: str | None = None,
           model_seed: int | None = None) -> Sample:
    """The continuations of ``prompt`` by the model of run ``path`` (a run directory or one of
    its weights files) chosen by ``variant`` and ``model_seed``."""
    header, models = choose_model(path, variant, model_seed, option="tlab sample")
    trained = load_trained(header.path)
    if not trained.spec.model.causal:  # an encoder's tokens see the later ones
        raise ConfigError(f"{trained.header.path}: the model is an encoder (arch=encoder); its "
                          "tokens see the later ones, so it cannot continue a prompt: sample a "
                          "decoder's run (arch=decoder)")
    ids = prompt_ids(trained, prompt)
    texts = [render(trained, new) for new in continue_prompt(trained, ids, sampling)]
    return Sample(header, models, ids[0].tolist(), render(trained, ids[0].tolist()), texts,
                  trained.model.context_window, " " if trained.tokenizer is None else "")
