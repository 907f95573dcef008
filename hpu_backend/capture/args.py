"""An aten op's arguments as one flat list and back: aten ops take values and lists of values, flattened here
without pytree's generality (its cost, paid on every op the device runs or records, was most of the device's own);
anything nested deeper goes to pytree. The spec is hashable (a layout key holds it)."""

from __future__ import annotations

import torch.utils._pytree as pytree


def flatten(args: tuple, kwargs: dict) -> tuple[list, tuple]:
    """The arguments' values, lists opened, and the spec ``unflatten`` rebuilds them from."""
    flat, shape, nested = [], [], False
    for a in (*args, *kwargs.values()):
        if type(a) is list or type(a) is tuple:
            if any(type(x) is list or type(x) is tuple or type(x) is dict for x in a):
                leaves, spec = pytree.tree_flatten((args, kwargs))
                return leaves, (None, spec)
            shape.append((type(a), len(a)))
            flat.extend(a)
            nested = True
        else:
            shape.append(None)
            flat.append(a)
    return flat, (len(args), tuple(shape) if nested else None, tuple(kwargs))


def unflatten(flat: list, spec: tuple) -> tuple[tuple, dict]:
    """``(args, kwargs)`` again, from values in ``flatten``'s order (the same ones, or their replacements)."""
    if spec[0] is None:
        return pytree.tree_unflatten(flat, spec[1])
    n, shape, keys = spec
    if shape is None:  # no list among the arguments (most ops): the values as they are
        return tuple(flat[:n]), (dict(zip(keys, flat[n:])) if keys else {})
    values, i = [], 0
    for s in shape:
        if s is None:
            values.append(flat[i])
            i += 1
        else:
            values.append(s[0](flat[i:i + s[1]]))
            i += s[1]
    return tuple(values[:n]), dict(zip(keys, values[n:]))
