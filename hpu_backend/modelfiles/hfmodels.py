"""A Hugging Face causal LM described by its ``config.json`` (a file, or a directory holding one) as a model file:
built from the config alone with ``transformers`` (on the meta device when planned), nothing downloaded.

The model file has the shape of ``models/llama.py``: a prefill step (``AXES`` batch, input_len) whose forward
returns the last position's logits and every layer's keys and values, a ``DECODE`` step (batch, kv_len) that
reads one token per sequence and a KV cache of kv_len tokens, ``LAYERS`` and ``PER_CARD(cards, group, layers)``,
one card's tensor-parallel shard (heads, KV heads, MLP and vocabulary split over the cards, an all-reduce
after attention and after the MLP, the logits gathered). So every planner that takes a model file
(``analyze``, capacity, ``--cards``, training, the serving plan) takes a config.

The config is data: it is read as JSON (bounded in size), its ``model_type`` must name an architecture
``transformers`` registers as a causal LM, and no code named in it (``auto_map``, remote code) is imported.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path
from typing import Any

from . import hfschema
from .modelspec import ModelFileError, ModelSpec, generative_steps, spec_from

MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; anything larger is not one
EXPERTS = "hpu_backend_planned"  # how MoE experts run when planned (see planned_experts)


class HFConfigError(ModelFileError):
    """A config.json that is malformed or names an architecture that cannot be built (one line)."""


def is_config(selector: str | Path) -> bool:
    """Whether ``selector`` names a config.json (a .json file, or a directory holding config.json)."""
    path = Path(str(selector))
    return path.suffix == ".json" or (path.is_dir() and (path / "config.json").is_file())


def config_path(selector: str | Path) -> Path:
    path = Path(str(selector))
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise HFConfigError(f"{selector}: no such config.json (expected a config.json file or a directory holding one)")
    return path


def read_config(selector: str | Path) -> dict[str, Any]:
    """The config.json's fields, checked: a JSON object of at most 1 MiB with a string model_type, every value
    within the schema's bounds (``hfschema.check_structure``)."""
    path = config_path(selector)
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise HFConfigError(f"{path}: {path.stat().st_size:,} bytes; a config.json is at most {MAX_CONFIG_BYTES:,}")
    try:
        fields = hfschema.parse(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFConfigError(f"{path}: not valid JSON ({e})") from None
    except hfschema.SchemaError as e:
        raise HFConfigError(f"{path}: {e}") from None
    if not isinstance(fields, dict):
        raise HFConfigError(f"{path}: expected a JSON object of config fields, got {type(fields).__name__}")
    if not isinstance(fields.get("model_type"), str):
        raise HFConfigError(f"{path}: model_type: expected a string naming the architecture (e.g. \"llama\")")
    try:
        hfschema.check_structure(fields)
    except hfschema.SchemaError as e:
        raise HFConfigError(f"{path}: {e}") from None
    return fields


def build_config(fields: dict[str, Any], where: str):
    """The transformers config object for ``fields`` (HFConfigError naming the architecture or field), checked
    against its architecture's schema first; ``hpu_file_fields`` holds the names the file itself gave."""
    transformers, causal = _transformers(where)
    kind = fields["model_type"]
    if kind not in causal:
        raise HFConfigError(f"{where}: model_type {kind!r:.60} is not a causal LM architecture transformers "
                            f"{transformers.__version__} can build")
    try:
        hfschema.check_fields(fields, transformers.CONFIG_MAPPING[kind], _class_names(causal.values()))
    except hfschema.SchemaError as e:
        raise HFConfigError(f"{where}: {e}") from None
    rest = {k: v for k, v in fields.items() if k not in hfschema.NOT_PASSED}
    try:
        config = transformers.AutoConfig.for_model(kind, **rest)
    except (TypeError, ValueError, KeyError, AttributeError, _strict_error()) as e:
        raise HFConfigError(f"{where}: {kind} config: {_first_reason(e)}") from None
    _check_dims(config, where)
    config.hpu_file_fields = tuple(sorted(fields))
    return config


def _transformers(where: str):
    """(transformers, its model_type -> causal LM class names), or HFConfigError saying how to install it."""
    try:
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        raise HFConfigError(f"{where}: reading a Hugging Face config needs transformers: "
                            "pip install 'hpu_backend[hf]'") from None
    return transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def _class_names(values) -> set[str]:
    names: set[str] = set()
    for v in values:
        names.update([v] if isinstance(v, str) else v)
    return names


def _strict_error() -> type:
    """The error transformers' config dataclasses raise for a field they refuse (huggingface_hub's)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: its configs raise ValueError and TypeError only
        return ValueError
    return StrictDataclassError


def _first_reason(e: BaseException) -> str:
    """One line of what transformers refused: "Validation error for field 'x':\n    TypeError: ..." becomes
    "field 'x': TypeError: ..."."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    head = lines[0].removeprefix("Validation error for ").removeprefix("Class validation error for ").rstrip(":")
    return (head + (f": {lines[1]}" if len(lines) > 1 else ""))[:300]


def _check_dims(config, where: str) -> None:
    for name in ("vocab_size", "num_hidden_layers", "num_attention_heads", "hidden_size"):
        value = getattr(config, name, None)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 24):
            raise HFConfigError(f"{where}: {name}: expected a positive integer up to {1 << 24:,}, got {value!r}")


def context_length(config) -> int | None:
    """The longest sequence the config.json says the model takes (max_position_embeddings, n_positions), or None:
    only a value the file gives (a transformers default would describe some other model)."""
    given = getattr(config, "hpu_file_fields", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None) if given is None or name in given else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def card_bytes(config, cards: int, dtype_bytes: int) -> tuple[int, float]:
    """(Weight bytes, KV-cache bytes a token) on one card of ``cards``: the parameters counted on the meta device
    (nothing allocated), split evenly over the cards; each layer's keys and values, KV heads split as the shard
    splits them. At ``dtype_bytes`` a value (fp8 stores weights and KV cache in one byte)."""
    import torch

    from .modelspec import user_call

    with torch.device("meta"):
        step = user_call(config.model_type, "building the model on the meta device", make_model, config)
    params = sum(p.numel() for p in step.parameters())
    kv, head_dim = kv_shape(config)
    per_token = 2 * config.num_hidden_layers * max(1, kv // cards) * head_dim * dtype_bytes
    return -(-params * dtype_bytes // cards), float(per_token)


def load_config(selector: str | Path) -> ModelSpec:
    """The model file of the causal LM a config.json describes."""
    where = str(selector)
    fields = read_config(selector)
    config = build_config(fields, where)
    label = Path(config_path(selector)).parent.name if Path(where).is_dir() else Path(where).stem
    if label == "config":
        label = Path(config_path(selector)).resolve().parent.name or config.model_type
    spec = spec_from(model_file(config, label or config.model_type), where, label)
    return spec


# -- the model file -----------------------------------------------------------------------------------------

def model_file(config, label: str) -> dict[str, Any]:
    """The model-file names for ``config``: prefill, DECODE, LAYERS and PER_CARD."""
    config.hpu_kv_shape = cache_shape(config)
    return {**_steps(config, label), "LAYERS": config.num_hidden_layers, "CONFIG": config,
            "LAYER_PERIOD": layer_period(config), "PER_CARD": partial(_per_card_file, config, label)}


def layer_period(config) -> int:
    """How many decoder layers repeat as one group: Llama 4 interleaves a dense layer and a mixture of experts
    (``interleave_moe_layer_step``); 1 where every layer has the same weights. (Attention patterns that differ
    only in their mask, sliding or chunked, cost nearly the same and are not a period here.)"""
    step = getattr(config, "interleave_moe_layer_step", None)
    layers = config.num_hidden_layers
    return step if isinstance(step, int) and 1 < step <= layers and layers % step == 0 else 1


def _steps(config, label: str) -> dict[str, Any]:
    return generative_steps(partial(make_model, config), partial(make_inputs, config=config),
                            partial(make_decode_inputs, config=config), label)


def make_model(config):
    """The causal LM wrapped as a step: ``forward(tokens, *cache)`` (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    _register_experts()
    config._experts_implementation = EXPERTS
    if hasattr(config, "_attn_implementation_internal"):
        config._attn_implementation_internal = attention(config)
    return Step(AutoModelForCausalLM.from_config(config))


def attention(config) -> str:
    """The attention path the model is built with: SDPA where the architecture has one (what the device's fused
    SDPA runs), else its own eager attention (Gemma-2's logit soft-capping has no SDPA path in transformers)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls = getattr(transformers, str(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)), None)
    return "sdpa" if getattr(cls, "_supports_sdpa", True) else "eager"


def kv_shape(config) -> tuple[int, int]:
    """(KV heads, head size) of one layer's cache, as the config's own attributes say."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return kv, head_dim


def cache_shape(config) -> tuple[int, int]:
    """(KV heads, head size) of one layer's cache as the architecture builds it: a one-token prefill on the
    meta device (attribute names differ between architectures; the cache the model returns does not)."""
    import torch

    from .modelspec import user_call

    with torch.device("meta"):
        step = user_call(config.model_type, "building the model on the meta device", make_model, config)
        out = user_call(config.model_type, "a one-token prefill on the meta device", step,
                        torch.zeros(1, 1, dtype=torch.long))
    return tuple(out[1].shape[1:2]) + tuple(out[1].shape[3:4])


def make_inputs(batch: int, input_len: int, seed: int = 0, config=None) -> tuple:
    import torch

    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, config.vocab_size, (batch, input_len), generator=g),)


def make_decode_inputs(batch: int, kv_len: int, seed: int = 0, config=None) -> tuple:
    import torch

    g = torch.Generator().manual_seed(seed)
    kv, head_dim = getattr(config, "hpu_kv_shape", None) or kv_shape(config)
    tokens = torch.randint(0, config.vocab_size, (batch, 1), generator=g)
    shape = (batch, kv, kv_len, head_dim)
    return (tokens, *(torch.randn(shape, generator=g) / math.sqrt(head_dim)
                      for _ in range(2 * config.num_hidden_layers)))


def _step_class():
    import torch

    class Step(torch.nn.Module):
        """A causal LM as a serving step: prefill without a cache, one decode step with one (k, v per layer)."""

        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, tokens, *cache):
            from transformers import DynamicCache

            past = DynamicCache()
            for i in range(len(cache) // 2):
                past.update(cache[2 * i], cache[2 * i + 1], i)
            start = cache[0].shape[2] if cache else 0
            positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)[None]
            out = self.lm(input_ids=tokens, cache=past, position_ids=positions, use_cache=True,
                          logits_to_keep=1)
            new = []
            cache = out.cache if "cache" in out else out.past_key_values  # renamed in transformers 5.x
            for layer in cache.layers:
                new += [layer.keys[:, :, start:], layer.values[:, :, start:]]
            return (out.logits[:, -1], *new)

    return Step


def Step(lm):  # noqa: N802 (a class built on first use, so that importing this file imports no torch)
    return _step_class()(lm)


def planned_experts(self, hidden, top_k_index, top_k_weights):
    """MoE experts as a server runs them at load, without data-dependent shapes: each token through top-k
    experts' MLPs (the compute), every expert's weights read once a step (at serving batch sizes every expert
    gets tokens). The experts a token uses are the first k (routing changes which, not how much, work)."""
    k = top_k_index.size(-1)
    out = 0
    for j in range(k):
        up = hidden @ (self.gate_up_proj[j] if self.is_transposed else self.gate_up_proj[j].t())
        h = self._apply_gate(up) if self.has_gate else self.act_fn(up)
        down = h @ (self.down_proj[j] if self.is_transposed else self.down_proj[j].t())
        out = out + down * top_k_weights[:, j:j + 1].to(down.dtype)
    touched = self.gate_up_proj[k:].amax() + self.down_proj[k:].amax() if self.num_experts > k else 0
    return (out + touched * 0).to(hidden.dtype)


def _register_experts() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if EXPERTS not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(EXPERTS, planned_experts)


# -- tensor parallelism ---------------------------------------------------------------------------------------

def per_card_config(config, cards: int, layers: int | None = None):
    """One card's shard of ``config`` over ``cards``: heads, KV heads, MLP and vocabulary split."""
    import copy

    heads = config.num_attention_heads
    kv, head_dim = kv_shape(config)
    hidden = getattr(config, "intermediate_size", None)
    if hidden is None or heads % cards or hidden % cards or (kv % cards and cards % kv):
        raise HFConfigError(f"{config.model_type}: {heads} heads, {kv} KV heads and MLP {hidden} do not split "
                            f"over {cards} cards")
    shard = copy.deepcopy(config)
    shard.num_attention_heads, shard.num_key_value_heads = heads // cards, max(1, kv // cards)
    shard.intermediate_size, shard.head_dim = hidden // cards, head_dim
    shard.hpu_kv_shape = (max(1, kv // cards), head_dim)
    for moe in ("moe_intermediate_size", "intermediate_size_mlp"):  # experts' MLP; Llama 4's dense layers' MLP
        if getattr(config, moe, None):
            setattr(shard, moe, getattr(config, moe) // cards)
    if config.vocab_size % cards == 0:
        shard.vocab_size = config.vocab_size // cards
    if layers:
        shard.num_hidden_layers = layers
        if getattr(shard, "layer_types", None):
            shard.layer_types = list(shard.layer_types)[:layers]
    return shard


def _per_card_file(config, label: str, cards: int, group: str, layers: int | None = None) -> dict:
    shard = per_card_config(config, cards, layers)
    names = _steps(shard, f"{label}-tp{cards}")
    names["make_model"] = partial(_tp_model, shard, cards, group, gather=config.vocab_size % cards == 0)
    return names


def _tp_model(shard, cards: int, group: str, gather: bool):
    step = make_model(shard)
    _add_collectives(step.lm, cards, group, gather)
    return step


def _add_collectives(lm, cards: int, group: str, gather: bool = True) -> None:
    """All-reduce each layer's attention and MLP outputs (row-parallel), gather the logits (column-parallel):
    forward hooks, so that the architecture's own code runs unchanged."""
    import torch

    def reduce(t):
        return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(t, "sum", group))

    def after(module, args, output):
        if isinstance(output, tuple):
            return (reduce(output[0]), *output[1:])
        return reduce(output)

    def gathered(module, args, x):
        parts = torch.ops._c10d_functional.wait_tensor(
            torch.ops._c10d_functional.all_gather_into_tensor(x.contiguous(), cards, group))
        return parts.view(cards, *x.shape).movedim(0, -2).reshape(*x.shape[:-1], cards * x.shape[-1])

    for layer in _decoder_layers(lm):
        for name in ("self_attn", "attn", "attention", "mlp", "block_sparse_moe", "feed_forward"):
            part = getattr(layer, name, None)
            if part is not None:
                part.register_forward_hook(after)
    head = lm.get_output_embeddings()
    if gather and head is not None:
        head.register_forward_hook(gathered)


def _decoder_layers(lm) -> list:
    # The base model under its prefix; Llama 4's causal LM names a prefix it does not have and holds ``model``.
    for base in (getattr(lm, lm.base_model_prefix, None), getattr(lm, "model", None), lm):
        for name in ("layers", "h", "blocks"):
            layers = getattr(base, name, None)
            if layers is not None:
                return list(layers)
    raise HFConfigError(f"{lm.config.model_type}: cannot find the decoder layers to shard over cards")


__all__ = ["HFConfigError", "build_config", "card_bytes", "context_length", "is_config", "kv_shape", "load_config",
           "model_file", "per_card_config", "read_config"]
