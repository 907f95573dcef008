"""The schema a Hugging Face ``config.json`` is checked against before ``transformers`` sees it.

A config is data from anywhere, and planning builds the model it describes (on the meta device, layer by
layer), so every value is bounded before anything is built: sizes and counts are integers within what real
models use (a 200,000-layer config would be minutes of planning, not a model), every number is finite,
nesting, lists and strings are short. A field the architecture's config class declares must have the type it
declares; a config that leaves out the model's sizes is refused rather than planned from transformers'
defaults (that would plan another model). Each refusal is one line naming the field, the file's value and
what is allowed. Checks that need the architecture (``check_fields``) take its config class; the rest
(``check_structure``) need nothing but the parsed JSON.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from typing import Any
from ..errors import HpuBackendError

MAX_DEPTH = 8  # a config nests a few levels (text_config, rope_scaling, quantization_config)
MAX_ITEMS = 4096  # keys of one object, items of one list
MAX_STRING = 4096  # characters of one string
MAX_INT = 1 << 53  # any other integer: what JSON carries exactly

# field -> (lowest, highest): what real models use, with room; more would only make planning slow
SIZES = {
    "vocab_size": (1, 1 << 22), "hidden_size": (1, 1 << 16), "intermediate_size": (1, 1 << 18),
    "num_hidden_layers": (1, 256), "num_attention_heads": (1, 1024), "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096), "max_position_embeddings": (1, 1 << 24), "moe_intermediate_size": (1, 1 << 18),
    "num_local_experts": (1, 1024), "num_experts": (1, 1024), "n_routed_experts": (1, 1024),
    "num_experts_per_tok": (1, 1024), "sliding_window": (1, 1 << 24),
}
# any other integer field named as a size or count (num_*, n_*, *_size, *_dim, *_layers ...)
COUNT_NAME = re.compile(r"^(num|n)_|_(size|dim|heads|layers|experts|len|length|window)$")
COUNT_BOUND = (0, 1 << 24)
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
NOT_PASSED = ("model_type", "auto_map", "transformers_version")  # read here, never given to transformers


class SchemaError(HpuBackendError, ValueError):
    """A config field outside the schema: one line naming the field, the value and what is allowed."""


def shown(value: Any) -> str:
    """The file's value as JSON, short (``NaN``, ``Infinity`` as JSON writes them)."""
    text = json.dumps(value) if not isinstance(value, str) else json.dumps(value[:60])
    return text if len(text) <= 60 else text[:59] + "…"


def parse(text: str) -> Any:
    """The JSON document in ``text``; SchemaError for a document nested past Python's parser."""
    try:
        return json.loads(text)
    except RecursionError:
        raise SchemaError(f"nested deeper than {MAX_DEPTH} levels; a config.json is a flat object of fields "
                          "with a few small nested ones") from None


def check_structure(fields: dict[str, Any]) -> None:
    """Every value bounded: nesting, sizes of lists, objects and strings, finite numbers, and the integers of
    size and count fields within SIZES (or COUNT_BOUND by their name)."""
    stack = [(name, value, 1) for name, value in fields.items()]
    if len(fields) > MAX_ITEMS:
        raise SchemaError(f"{len(fields):,} fields; a config.json has at most {MAX_ITEMS:,}")
    while stack:
        name, value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SchemaError(f"{name}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            _check_length(name, value, "keys")
            stack.extend((f"{name}.{k}", v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            _check_length(name, value, "items")
            stack.extend((f"{name}[{i}]", v, depth + 1) for i, v in enumerate(value))
        else:
            _check_scalar(name, value, depth == 1)


def _check_length(name: str, value: Any, what: str) -> None:
    if len(value) > MAX_ITEMS:
        raise SchemaError(f"{name}: {len(value):,} {what}; at most {MAX_ITEMS:,}")


def _check_scalar(name: str, value: Any, top: bool) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"{name}: {shown(value)}; expected a finite number")
    if isinstance(value, str) and len(value) > MAX_STRING:
        raise SchemaError(f"{name}: a string of {len(value):,} characters; at most {MAX_STRING:,}")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise SchemaError(f"{name}: {value:.3g}; integers in a config are at most 2**53")
    bound = SIZES.get(name) if top else None
    if bound is None and top and COUNT_NAME.search(name) and _integral(value):
        bound = COUNT_BOUND
    if bound is not None and value is not None:
        check_size(name, value, bound)


def _integral(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_size(name: str, value: Any, bound: tuple[int, int]) -> None:
    """SchemaError unless ``value`` is an integer (not a bool, not a float) within ``bound``."""
    low, high = bound
    if not _integral(value) or not low <= value <= high:
        raise SchemaError(f"{name}: {shown(value)}; expected an integer from {low:,} to {high:,}")


# -- what needs the architecture: its config class ----------------------------------------------------------

def check_fields(fields: dict[str, Any], config_class: type, causal_classes: set[str]) -> None:
    """The file against its architecture: a causal LM, the sizes given (under the class's names for them),
    each field the class declares of the type it declares, and the sizes consistent with each other."""
    _check_causal(fields.get("architectures"), causal_classes)
    names = _aliases(config_class)
    _check_required(fields, config_class, names)
    hints = _hints(config_class)
    for name, value in fields.items():
        canonical = names.get(name, name)
        if canonical in SIZES and value is not None:
            check_size(name, value, SIZES[canonical])
        elif name in hints and name not in NOT_PASSED:
            _check_type(name, value, hints[name])
    _check_shapes({names.get(k, k): v for k, v in fields.items()}, names)


def _aliases(config_class: type) -> dict[str, str]:
    """The file's name -> the canonical one (GPT-2's ``n_embd`` is ``hidden_size``)."""
    mapping = getattr(config_class, "attribute_map", None) or {}
    return {alias: name for name, alias in mapping.items() if isinstance(alias, str)}


def _check_causal(architectures: Any, causal_classes: set[str]) -> None:
    if architectures is None:
        return
    if not (isinstance(architectures, list) and architectures and all(isinstance(a, str) for a in architectures)):
        raise SchemaError(f"architectures: {shown(architectures)}; expected a list of class names, "
                          "e.g. [\"LlamaForCausalLM\"]")
    if not causal_classes.intersection(architectures):
        raise SchemaError(f"architectures: {shown(architectures)}: not a causal LM; serving and capacity plans "
                          "take a causal (decoder) LM such as LlamaForCausalLM")


def _check_required(fields: dict[str, Any], config_class: type, names: dict[str, str]) -> None:
    given = {names.get(k, k) for k in fields}
    wanted = [*REQUIRED, *(["intermediate_size"] if "intermediate_size" in _hints(config_class) else [])]
    missing = [name for name in wanted if name not in given]
    if missing:
        raise SchemaError(f"no {', '.join(missing)}: a config.json states its model's sizes; planned from "
                          "transformers' defaults it would be another model (use the model's own config.json)")


def _check_shapes(fields: dict[str, Any], names: dict[str, str]) -> None:
    """Heads that split the hidden size (unless head_dim says otherwise) and the KV heads; experts per token."""
    original = {v: k for k, v in names.items()}
    hidden, heads = fields.get("hidden_size"), fields.get("num_attention_heads")
    if not (_integral(hidden) and _integral(heads)):
        return  # null in the file: transformers refuses it, naming the field
    if fields.get("head_dim") is None and hidden % heads:
        raise SchemaError(f"{original.get('hidden_size', 'hidden_size')}: {hidden} is not divisible by "
                          f"num_attention_heads {heads}; expected a multiple of it (or give head_dim)")
    kv = fields.get("num_key_value_heads")
    if kv is not None and (kv > heads or heads % kv):
        raise SchemaError(f"num_key_value_heads: {kv}; expected a divisor of num_attention_heads {heads}")
    experts = fields.get("num_local_experts") or fields.get("num_experts") or fields.get("n_routed_experts")
    per_token = fields.get("num_experts_per_tok")
    if experts and per_token and per_token > experts:
        raise SchemaError(f"num_experts_per_tok: {per_token}; expected at most the {experts} experts")


def _hints(config_class: type) -> dict[str, Any]:
    """The field annotations of a (dataclass) config class and its bases, as declared: one written as a string
    (a forward reference) allows anything here, and transformers checks it."""
    hints: dict[str, Any] = {}
    for cls in reversed(config_class.__mro__):
        hints.update(vars(cls).get("__annotations__", {}))
    return hints


def _check_type(name: str, value: Any, hint: Any) -> None:
    kinds = _kinds(hint)
    if kinds is None or any(_is(value, kind) for kind in kinds):
        return
    allowed = " or ".join(sorted({_KIND_NAMES.get(k, "a value") for k in kinds}))
    raise SchemaError(f"{name}: {shown(value)}; expected {allowed}")


_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null",
               list: "a list", dict: "an object"}


def _kinds(hint: Any) -> set[type] | None:
    """The JSON kinds an annotation allows; None when it allows anything (or a type this does not know)."""
    if hint in _KIND_NAMES:
        return {hint}
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_kinds(a) for a in typing.get_args(hint)]
        return None if any(p is None for p in parts) else set().union(*parts)
    if origin in (list, tuple):
        return {list}
    if origin is dict:
        return {dict}
    if origin is typing.Literal:
        return {type(a) for a in typing.get_args(hint)}
    return None


def _is(value: Any, kind: type) -> bool:
    if kind is int:
        return _integral(value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)
