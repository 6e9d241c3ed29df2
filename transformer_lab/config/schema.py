"""The typed schema of tlab's config: every key's type, range and whether a run needs it, checked
in the pre-flight with one ``ConfigError`` line per violation (``docs/cli.md``, "Config checks")."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from transformer_lab.errors import ConfigError

_ABSENT = object()
_FIXED_TEXTS = {"embed_scale": "sqrt, none or a positive number", "any": "any value",
                "bool": "true or false"}


@dataclass(frozen=True)
class Rule:
    """What one key may hold, and its check. ``kind``: int, number, bool, str, list, embed_scale
    (sqrt, none or a number) or any; ``open_low``/``open_high``: strict bounds; ``item``: a list's
    rule."""

    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    nullable: bool = False
    required: bool = False
    choices: tuple[str, ...] = ()
    item: Rule | None = None
    min_items: int = 0

    def describe(self) -> str:
        """What is valid, in words (the end of the one-line message)."""
        if self.kind in _FIXED_TEXTS:
            text = _FIXED_TEXTS[self.kind]
        elif self.kind == "list":
            items = self.item.describe() if self.item else "values"
            text = f"a {'non-empty ' if self.min_items else ''}list of {items}"
        elif self.kind == "str":
            text = ("one of " + ", ".join(self.choices)) if self.choices else "a string"
        elif self.kind == "int" and self.low == 1 and self.high is None:
            text = "a positive number (an integer)"
        elif self.kind == "number" and self.low == 0 and self.open_low and self.high is None:
            text = "a positive number"
        else:
            text = ("an integer" if self.kind == "int" else "a number") + self._range_text()
        return text + (" or null" if self.nullable else "")

    def _range_text(self) -> str:
        low, high = self.low, self.high
        if low is not None and high is not None:
            left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
            return f" in {left}{low:g}, {high:g}{right}"
        if low is not None:
            return f" {'>' if self.open_low else '>='} {low:g}"
        return "" if high is None else f" {'<' if self.open_high else '<='} {high:g}"

    def fits(self, value: Any) -> bool:
        """True if ``value`` (not null) satisfies the rule."""
        number = isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value)
        if self.kind == "list":
            return isinstance(value, list) and len(value) >= self.min_items \
                and (self.item is None or all(self.item.fits(v) for v in value))
        if self.kind not in ("int", "number"):
            return {"any": True, "bool": isinstance(value, bool),
                    "str": isinstance(value, str) and (not self.choices or value in self.choices),
                    "embed_scale": value in ("sqrt", "none") or (number and value > 0)}[self.kind]
        if not number or (self.kind == "int" and not isinstance(value, int)):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    def check(self, key: str, value: Any) -> None:
        """``ConfigError`` (one line) unless ``value`` (``_ABSENT``: missing) fits at ``key``."""
        if value is _ABSENT and self.required:
            raise ConfigError(f"{key} is required and cannot be deleted (~{key}); set it "
                              f"instead: {key}=<{self.describe()}>")
        if value is not _ABSENT and not (value is None and self.nullable) \
                and (value is None or not self.fits(value)):
            raise ConfigError(f"{key}={value_name(value)} is not valid; it must be "
                              f"{self.describe()}")


def int_rule(low: float | None = None, **kw: Any) -> Rule:
    return Rule("int", low=low, **kw)


def number_rule(low: float | None = None, high: float | None = None, **kw: Any) -> Rule:
    return Rule("number", low=low, high=high, **kw)


POSITIVE_INT = int_rule(1)
COUNT = int_rule(0)                               # 0, 1, 2, ...
POSITIVE = number_rule(0, open_low=True)
PROBABILITY = number_rule(0, 1, open_high=True)      # dropout rates
FRACTION = number_rule(0, 1, open_low=True, open_high=True)

SCHEMA: dict[str, Rule] = {
    "seed": int_rule(0, required=True),
    "seed_init": int_rule(0, nullable=True), "seed_data": int_rule(0, nullable=True),
    "out_root": Rule("str", required=True),
    "force": Rule("bool"),
    # model
    "model.d_model": int_rule(1, required=True), "model.n_heads": int_rule(1, required=True),
    "model.n_layers": int_rule(1, required=True), "model.d_ff": int_rule(1, required=True),
    "model.vocab_size": int_rule(2, nullable=True), "model.max_len": int_rule(1, required=True),
    "model.attn_bias": Rule("bool"), "model.ffn_bias": Rule("bool"),
    "model.gated_match_params": Rule("bool"),
    "model.embed_scale": Rule("embed_scale", nullable=True),
    "model.pe_scale": number_rule(0), "model.residual_scale": POSITIVE, "model.init_std": POSITIVE,
    # knobs of real architectures (GQA, head size, logit scale, biases, tying, parallel block)
    "model.n_kv_heads": int_rule(1, nullable=True), "model.head_dim": int_rule(1, nullable=True),
    "model.attn_scale": number_rule(0, open_low=True, nullable=True),
    "model.qkv_bias": Rule("bool", nullable=True), "model.out_bias": Rule("bool", nullable=True),
    "model.tie_embeddings": Rule("bool"), "model.embed_norm": Rule("bool"),
    "model.parallel_block": Rule("bool"),
    **{f"model.dropout.{k}": PROBABILITY for k in ("embedding", "attention", "ffn", "residual")},
    # train
    "train.steps": int_rule(1, required=True), "train.batch_size": int_rule(1, required=True),
    "train.lr": number_rule(0, open_low=True, required=True),
    "train.schedule": Rule("str", required=True),
    "train.warmup": COUNT, "train.noam_factor": POSITIVE, "train.min_lr_ratio": number_rule(0, 1),
    "train.weight_decay": number_rule(0),
    "train.grad_clip": number_rule(0, open_low=True, nullable=True),
    "train.betas": Rule("list", item=PROBABILITY, min_items=2),
    "train.log_every": POSITIVE_INT, "train.eval_every": COUNT, "train.checkpoint_every": COUNT,
    "train.checkpoint": Rule("bool"),
    "train.threads": int_rule(1, nullable=True),
    "train.device": Rule("str", required=True),
    "train.precision": Rule("str", required=True, choices=("fp32", "bf16")),
    "train.compile": Rule("bool"), "train.grad_accum": POSITIVE_INT,
    # optimizer (the class and its arguments: training.optimizers.check_optimizer, pre-flight)
    "optimizer._target_": Rule("str", required=True), "optimizer.name": Rule("str"),
    "optimizer.params": Rule("str", choices=("all", "hidden_matrices")),
    "optimizer.lr_ratio": POSITIVE, "optimizer.weight_decay": number_rule(0),
    "optimizer.rest._target_": Rule("str"), "optimizer.rest.lr_ratio": POSITIVE,
    # the groups every run needs
    "arch.causal": Rule("bool", required=True),
    "task.name": Rule("str", required=True), "task._target_": Rule("str", required=True),
    "pe._target_": Rule("str", required=True), "block._target_": Rule("str", required=True),
    "ffn._target_": Rule("str", required=True), "norm_layer._target_": Rule("str", required=True),
    # task
    "task.seq_len": POSITIVE_INT, "task.vocab_size": int_rule(2), "task.eval_size": POSITIVE_INT,
    "task.holdout_mod": POSITIVE_INT, "task.data_seed": COUNT, "task.branching": POSITIVE_INT,
    "task.n_chains": POSITIVE_INT, "task.chain_len": int_rule(2), "task.eval_fraction": FRACTION,
    "task.path": Rule("str", nullable=True), "task.corpus": Rule("str", nullable=True),
    "task.url": Rule("str", nullable=True),
    "task.tokenizer": Rule("str", choices=("char", "byte", "bpe")),
    "task.bpe_vocab_size": int_rule(257),
    # positional encodings
    "pe.base": POSITIVE, "pe.rotary_fraction": number_rule(0, 1, open_low=True),
    "pe.factor": POSITIVE, "pe.original_max_len": int_rule(1, nullable=True),
    "pe.num_buckets": POSITIVE_INT, "pe.max_distance": POSITIVE_INT,
    "pe.beta_fast": POSITIVE, "pe.beta_slow": POSITIVE,
    "pe.attention_factor": number_rule(0, open_low=True, nullable=True),
    "pe.low_freq_factor": POSITIVE, "pe.high_freq_factor": POSITIVE,
    # Mixture of Experts (ffn=moe)
    "ffn.n_experts": POSITIVE_INT, "ffn.top_k": POSITIVE_INT,
    "ffn.expert": Rule("str", choices=("gelu", "gelu_tanh", "geglu", "leaky_relu", "reglu",
                                       "relu", "silu", "swiglu", "swish")),
    "ffn.router": Rule("str", choices=("softmax_then_topk", "topk_then_softmax")),
    "ffn.normalize_topk": Rule("bool"),
    "ffn.load_balance_coef": number_rule(0), "ffn.z_loss_coef": number_rule(0),
    # the routine's own keys are its module's ``SETTINGS`` (``routines.check_settings``)
    "routine.name": Rule("str", required=True),
}

# The config groups, for the message when a whole group is deleted (~model).
GROUPS = ("model", "pe", "block", "norm_layer", "ffn", "arch", "task", "train", "optimizer")


def _value(cfg: DictConfig, key: str) -> Any:
    """The value at ``key``, resolved; ``_ABSENT`` if the key is missing or ``???``."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, default=_ABSENT) if parent_key else cfg
    if not isinstance(parent, DictConfig) or leaf not in parent \
            or OmegaConf.is_missing(parent, leaf):
        return _ABSENT
    try:
        value = parent[leaf]
    except Exception as exc:  # an interpolation that cannot be resolved
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{key} cannot be resolved: {message}") from None
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, ListConfig) else value


def value_name(value: Any) -> str:
    """A value as written on a command line: ``rope``, ``0.001``, ``true``, ``null``."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(value_name(v) for v in value) + "]"
    return str(value)


def check_schema(cfg: DictConfig) -> None:
    """``ConfigError`` (one line) for the first key of ``cfg`` that breaks ``SCHEMA``."""
    for group in GROUPS:
        if OmegaConf.select(cfg, group, default=_ABSENT) is _ABSENT:
            raise ConfigError(f"the config group '{group}' is required and cannot be deleted "
                              f"(~{group}); choose one with {group}=... (tlab list)")
    check_keys(cfg, SCHEMA)
    for node in ("model", "model.dropout", "train"):
        check_known(cfg, node, {key[len(node) + 1:].split(".")[0] for key in SCHEMA
                                if key.startswith(node + ".")})


def check_known(cfg: DictConfig, node: str, known: set[str]) -> None:
    """``ConfigError`` naming a key of ``cfg[node]`` not in ``known`` (``+model.x=1``)."""
    found = OmegaConf.select(cfg, node, default=None)
    unknown = sorted(set(found.keys()) - known) if isinstance(found, DictConfig) else []
    if unknown:
        raise ConfigError(f"{node}.{unknown[0]} is not a key of {node}; valid: "
                          f"{', '.join(sorted(known))}")


def check_keys(cfg: DictConfig, rules: Mapping[str, Rule]) -> None:
    """``ConfigError`` (one line) for the first dotted key of ``rules`` that ``cfg`` breaks."""
    for key, rule in rules.items():
        rule.check(key, _value(cfg, key))
