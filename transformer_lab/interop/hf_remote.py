"""Any tlab decoder as a Hugging Face checkpoint with its own code: ``modeling_tlab.py`` bundles the
source of tlab's model and built-in components (torch and transformers only), ``config.json`` holds
the run's components (key ``tlab``) and an ``auto_map`` for ``trust_remote_code``."""

from __future__ import annotations

import ast
import inspect
import json
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from transformer_lab.components import attention, block, feedforward, moe, norms
from transformer_lab.components.positional import (
    alibi,
    base,
    learned,
    none,
    rope_scaling,
    rotary,
    sinusoidal,
    t5_bias,
)
from transformer_lab.config.spec import ModelSpec
from transformer_lab.errors import ConfigError
from transformer_lab.interop.hf_families import COMPONENTS
from transformer_lab.model import TransformerModel

MODELING_FILE = "modeling_tlab.py"
# In dependency order: a module's names are defined before a later one uses them.
BUNDLED: tuple[ModuleType, ...] = (base, rope_scaling, sinusoidal, learned, none, rotary, alibi,
                                   t5_bias, attention, norms, feedforward, moe, block)
MODEL_NAMES = ("embedding_scale", "attention_knobs", "TransformerModel", "next_token",
               "assemble_model")
COMPONENTS_PACKAGE = "transformer_lab.components."
# The model settings ``assemble_model`` reads (the components' own are in their nodes).
REMOTE_MODEL_KEYS = ("vocab_size", "d_model", "n_layers", "n_heads", "attn_bias", "n_kv_heads",
                     "head_dim", "attn_scale", "qkv_bias", "out_bias", "parallel_block",
                     "embed_norm", "tie_embeddings", "max_len", "init_std")


WRAPPER = '''

# --- the Hugging Face model around it -------------------------------------------------------

class ConfigError(ValueError):
    """tlab's one-line refusals (a ValueError here)."""


def _component(settings: dict, group: str, **kwargs):
    """The component of ``group`` from its resolved tlab config node in ``settings`` (its
    ``_target_`` one of the classes above)."""
    spec = dict(settings[group])
    target = globals()[spec.pop("_target_").rsplit(".", 1)[-1]]
    spec.pop("name", None)
    if spec.pop("_partial_", False):
        return functools.partial(target, **spec, **kwargs)
    return target(**spec, **kwargs)


def _non_persistent(model: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf in model.get_submodule(owner)._non_persistent_buffers_set


class TlabConfig(PretrainedConfig):
    model_type = "tlab"

    def __init__(self, tlab: dict | None = None, **kwargs) -> None:
        self.tlab = tlab or {}
        super().__init__(**kwargs)


class TlabCache(KVCache):
    """tlab's KV cache, with the length query ``generate`` makes."""

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length


class TlabForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = TlabConfig
    base_model_prefix = "tlab"
    main_input_name = "input_ids"

    def __init__(self, config: TlabConfig) -> None:
        super().__init__(config)
        with torch.device("cpu"):  # tables computed in __init__ (sinusoidal, ALiBi slopes)
            self.model = assemble_model(config.tlab["model"],
                                        functools.partial(_component, config.tlab), causal=True)
        # transformers may re-create non-persistent buffers empty while loading: keep them
        self._computed_buffers = {name: buffer.clone() for name, buffer in
                                  self.named_buffers() if _non_persistent(self, name)}
        if config.tlab["model"]["tie_embeddings"]:
            self._tied_weights_keys = {"model.lm_head.weight": "model.token_embedding.weight"}
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = super().from_pretrained(*args, **kwargs)
        with torch.no_grad():
            for name, value in model._computed_buffers.items():
                owner, _, leaf = name.rpartition(".")
                buffer = model.get_buffer(name)
                model.get_submodule(owner).register_buffer(
                    leaf, value.to(buffer.device, buffer.dtype), persistent=False)
        return model

    def _init_weights(self, module) -> None:
        """Nothing: every weight comes from model.safetensors."""

    def get_input_embeddings(self):
        return self.model.token_embedding

    def get_output_embeddings(self):
        return self.model.lm_head

    def forward(self, input_ids=None, attention_mask=None, cache=None, past_key_values=None,
                use_cache=None, labels=None, **kwargs) -> CausalLMOutputWithPast:
        """input_ids (B, T) -> logits (B, T, vocab); with ``use_cache`` the tokens follow those
        of the ``cache`` (``past_key_values`` before transformers 5: a ``TlabCache``)."""
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("a tlab model attends to every earlier token: padding "
                             "(attention_mask zeros) is not supported; give rows of one length")
        kv = next((c for c in (cache, past_key_values) if isinstance(c, TlabCache)), None)
        if use_cache and kv is None:
            kv = TlabCache.empty(len(self.model.blocks))
        logits = self.model(input_ids, cache=kv)  # (B, T, vocab)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                   labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss, logits, kv if use_cache else None)

    def prepare_inputs_for_generation(self, input_ids, **kwargs) -> dict:
        """The tokens not yet in the cache; past the model's context window (a learned
        position table) its last tokens, without a cache, as ``tlab sample`` does."""
        key = "cache" if "cache" in kwargs else "past_key_values"
        kv, use_cache = kwargs.get(key), kwargs.get("use_cache", True)
        window = self.model.context_window
        if window is not None and input_ids.shape[1] > window:
            input_ids, kv, use_cache = input_ids[:, -window:], None, False  # (B, window)
        elif isinstance(kv, TlabCache) and kv.length > 0:
            input_ids = input_ids[:, kv.length:]  # (B, new)
        else:
            kv = None
        return {"input_ids": input_ids, key: kv, "use_cache": use_cache,
                "attention_mask": kwargs.get("attention_mask")}  # padding refused in forward
'''


def _tlab_version() -> str:
    """The installed transformer_lab's version (its metadata: interop does not import the
    package's top level)."""
    try:
        return metadata.version("transformer_lab")
    except metadata.PackageNotFoundError:
        return "unknown"


HEADER = '''"""{name}: a tlab (transformer_lab {version}) decoder as a transformers causal LM.

Generated by ``tlab export``: the source of tlab's model and components, bundled, so that
``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` computes tlab's logits
without tlab installed. The run's components are in config.json (key ``tlab``).
"""

from __future__ import annotations

'''


def _module_parts(module: ModuleType, names: tuple[str, ...] | None = None
                  ) -> tuple[list[str], str, set[str]]:
    """(imports from outside tlab, the module's code without imports and docstring, its top-level
    names); ``names`` keeps only those definitions."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    imports, keep, defined = [], [], set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            package = node.names[0].name if isinstance(node, ast.Import) else node.module
            if getattr(node, "level", 0) == 0 and package.split(".")[0] not in (
                    "transformer_lab", "__future__"):  # from outside tlab
                imports.append(ast.unparse(node))
            continue
        node_names = _defined_names(node)
        if not node_names or names is not None and not node_names & set(names):
            continue  # the module docstring, or a definition not asked for
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        keep.append("\n".join(lines[first - 1:node.end_lineno]))  # with its decorators
        defined |= node_names
    return imports, "\n\n\n".join(keep), defined


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def modeling_source() -> str:
    """The text of ``modeling_tlab.py``: tlab's components and model, then the HF wrapper.
    ``ValueError`` if two bundled modules define one name (one would hide the other)."""
    imports = ["import functools", "import torch", "import torch.nn.functional as F",
               "from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel",
               "from transformers.modeling_outputs import CausalLMOutputWithPast"]
    bodies, owners = [], {}
    parts = [(m, None) for m in BUNDLED] + [(inspect.getmodule(TransformerModel), MODEL_NAMES)]
    for module, names in parts:
        module_imports, body, defined = _module_parts(module, names)
        clash = {n: owners[n] for n in defined if n in owners}
        if clash:
            raise ValueError(f"bundling {module.__name__}: {clash} defined twice")
        owners.update(dict.fromkeys(defined, module.__name__))
        imports += module_imports
        bodies.append(f"# --- {module.__name__} " + "-" * max(0, 80 - len(module.__name__))
                      + "\n\n" + body)
    unique = list(dict.fromkeys(imports))
    return (HEADER.format(name=MODELING_FILE, version=_tlab_version())
            + "\n".join(unique) + "\n\n\n" + "\n\n\n".join(bodies) + WRAPPER)


def write_remote_code(model: TransformerModel, spec: ModelSpec, directory: Path) -> None:
    """Write ``modeling_tlab.py``, ``config.json`` (the settings ``assemble_model`` rebuilds the
    model from), ``generation_config.json`` and ``model.safetensors`` into ``directory``;
    ``ConfigError`` for a component of the user's own (its code is not tlab's to bundle)."""
    import transformers
    from safetensors.torch import save_file

    settings: dict[str, Any] = {}
    for group in COMPONENTS:
        node = dict(spec.component(group))
        target = str(node.get("_target_", ""))
        if not target.startswith(COMPONENTS_PACKAGE):
            raise ConfigError(f"{group}={node.get('name')} is your own component (_target_="
                              f"{target}); tlab export bundles tlab's built-in components only: "
                              f"train with a built-in {group} to export")
        settings[group] = node
    model_settings = spec.settings()
    m = settings["model"] = {key: model_settings[key] for key in REMOTE_MODEL_KEYS} | {
        "embed_scale": model.embed_scale, "pe_scale": float(model.pe_scale),
        "dropout": {"attention": 0.0, "embedding": 0.0}}  # an export for inference
    (directory / MODELING_FILE).write_text(modeling_source(), encoding="utf-8")
    no_special_tokens = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
                         "transformers_version": transformers.__version__}
    config = {"architectures": ["TlabForCausalLM"], "model_type": "tlab",
              "auto_map": {"AutoConfig": "modeling_tlab.TlabConfig",
                           "AutoModelForCausalLM": "modeling_tlab.TlabForCausalLM"},
              "tlab": settings, "tie_word_embeddings": m["tie_embeddings"],
              "vocab_size": m["vocab_size"], "hidden_size": m["d_model"],
              "num_hidden_layers": m["n_layers"], "num_attention_heads": m["n_heads"],
              "max_position_embeddings": m["max_len"], "dtype": "float32", **no_special_tokens}
    for name, content in (("config.json", config), ("generation_config.json", no_special_tokens)):
        (directory / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
    state = {f"model.{key}": value.detach().contiguous().clone()
             for key, value in model.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})


def load_remote(directory: Path) -> Any:
    """The model written by ``write_remote_code``, loaded as a user would (its own code)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True,
                                                local_files_only=True).eval()
