"""Next-token language modelling (``arch=decoder``): a seeded synthetic Markov-chain corpus, or real
text (docs/data.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from transformer_lab.data.corpus import corpus_path
from transformer_lab.data.tokenizer import NotUtf8Error, TokenFile, load_tokens
from transformer_lab.tasks.base import Batch, Task


class LanguageModelTask(Task):
    """Random windows of ``seq_len + 1`` tokens from train/held-out token streams (NumPy
    arrays, or a tokenised file's ``TokenFile``, of which only the windows are read)."""

    def __init__(self, train: np.ndarray | TokenFile, held_out: np.ndarray | TokenFile,
                 seq_len: int, vocab_size: int, eval_size: int, data_seed: int) -> None:
        if seq_len < 2:
            raise ValueError(f"task.seq_len={seq_len} is too short; it must be at least 2")
        for name, stream in (("training", train), ("held-out", held_out)):
            if len(stream) <= seq_len + 1:
                raise ValueError(f"the {name} text has {len(stream)} tokens, fewer than "
                                 f"task.seq_len+2={seq_len + 2}; use a shorter task.seq_len or "
                                 "more text")
        self.train_tokens, self.held_out_tokens = train, held_out
        self.seq_len = self.model_seq_len = seq_len
        self.vocab_size = vocab_size
        self._eval = self._windows(held_out, eval_size, torch.Generator().manual_seed(data_seed))

    def _windows(self, stream: np.ndarray | TokenFile, n: int,
                 generator: torch.Generator) -> Batch:
        starts = torch.randint(0, len(stream) - self.seq_len - 1, (n,), generator=generator)
        if isinstance(stream, TokenFile):  # read from the file, a window at a time
            window = torch.from_numpy(stream.windows(starts.numpy(), self.seq_len + 1))
        else:
            index = starts[:, None] + torch.arange(self.seq_len + 1)  # (n, T+1)
            window = torch.from_numpy(stream[index.numpy()].astype(np.int64))  # (n, T+1)
        return Batch(window[:, :-1], window[:, 1:])

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self._windows(self.train_tokens, batch_size, generator)

    def eval_batch(self) -> Batch:
        return self._eval


class SyntheticLanguageTask(LanguageModelTask):
    """Offline synthetic language: a seeded sparse Markov chain (docs/data.md)."""

    def __init__(self, seq_len: int = 32, vocab_size: int = 64, branching: int = 4,
                 n_chains: int = 256, chain_len: int = 512, eval_fraction: float = 0.1,
                 eval_size: int = 256, data_seed: int = 1234) -> None:
        if not 1 <= branching <= vocab_size:
            raise ValueError(f"task.branching={branching} must be in 1..vocab_size={vocab_size}")
        rng = np.random.default_rng(data_seed)
        successors = np.stack([rng.choice(vocab_size, branching, replace=False)
                               for _ in range(vocab_size)])  # (V, branching)
        probs = 1.0 / np.arange(1, branching + 1)
        probs /= probs.sum()
        self.entropy_rate = float(-(probs * np.log(probs)).sum())
        chains = np.empty((n_chains, chain_len), dtype=np.int64)
        chains[:, 0] = rng.integers(0, vocab_size, n_chains)
        for t in range(1, chain_len):  # all chains advance together
            choice = rng.choice(branching, size=n_chains, p=probs)
            chains[:, t] = successors[chains[:, t - 1], choice]
        n_eval = max(1, int(round(n_chains * eval_fraction)))
        super().__init__(chains[:-n_eval].reshape(-1), chains[-n_eval:].reshape(-1),
                         seq_len, vocab_size, eval_size, data_seed)


class TextTask(LanguageModelTask):
    """Next-token LM on real text: ``path=FILE`` (wins over ``corpus``) or a named ``corpus``, cut
    by ``tokenizer`` and cached once; the first ``1 - eval_fraction`` of the tokens train.
    ``vocab_size`` is accepted and unused (a text's vocabulary is its tokenizer's)."""

    def __init__(self, path: str | None = None, corpus: str | None = None,
                 url: str | None = None, tokenizer: str = "char", bpe_vocab_size: int = 512,
                 seq_len: int = 64, eval_fraction: float = 0.1, eval_size: int = 256,
                 data_seed: int = 1234, vocab_size: int | None = None) -> None:
        if path is not None:
            file = Path(str(path)).expanduser()
            if not file.is_file():
                raise ValueError(f"task.path='{path}' is not a readable file")
        elif corpus is not None:
            file = corpus_path(str(corpus), url)
        else:
            raise ValueError("task=text needs a text: task.corpus=tinyshakespeare (downloaded "
                             "once) or task.path=FILE (your own UTF-8 file)")
        where = f"task.path='{path}'" if path is not None else f"task.corpus={corpus} ({file})"
        try:
            ids, self.tokenizer = load_tokens(file, str(tokenizer), bpe_vocab_size)
        except NotUtf8Error as exc:
            raise ValueError(f"{where} is not UTF-8 text (byte {exc.start}: {exc.reason}); give "
                             "a UTF-8 text file") from None
        if len(ids) == 0:
            raise ValueError(f"{where} is empty; give a text of at least task.seq_len+2="
                             f"{seq_len + 2} tokens per split")
        stream = TokenFile.of(ids) if isinstance(ids, np.memmap) else ids  # (N,) token ids
        split = int(len(ids) * (1 - eval_fraction))
        try:
            super().__init__(stream[:split], stream[split:], seq_len,
                             self.tokenizer.vocab_size, eval_size, data_seed)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
