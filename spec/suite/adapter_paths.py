"""Attribute paths into a class-style layer or optimizer (``"heads[0].W.grad"``, ``"p['W_q']"``,
``"heads[*].W"``): read and set by :func:`minibert_spec.suite.adapters.layer` and
:func:`minibert_spec.suite.adapters.optimizer` alike, defined once here."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

__all__ = ["EACH", "path_parts", "get_path", "set_path"]


# --------------------------------------------------------------------------- attribute paths
_PART = re.compile(r"\.?([A-Za-z_]\w*)|\[(-?\d+|\*)\]|\[['\"]([^'\"]+)['\"]\]")
EACH = "*"  # a list's every item: "heads[*].W" spreads an array's first axis over the heads


def path_parts(path: str) -> list:
    """``"heads[0].W.grad"`` -> ``["heads", 0, "W", "grad"]`` (a name, an integer index, ``*``
    for every item of a list, or a quoted key ``["W_q"]``); a malformed path is a ValueError
    naming it."""
    parts, pos = [], 0
    while pos < len(path):
        m = _PART.match(path, pos)
        if m is None or (pos == 0 and path.startswith(".")):
            raise ValueError(f"path {path!r}: expected names, [index], [*] or ['key'] (e.g. "
                             f"'heads[0].W'), stuck at {path[pos:]!r}")
        name, index, key = m.groups()
        parts.append(name if name is not None else key if key is not None else
                     EACH if index == EACH else int(index))
        pos = m.end()
    if not parts:
        raise ValueError("path: empty")
    return parts


def _step(obj, part):
    if isinstance(part, int) or isinstance(obj, Mapping):
        return obj[part]
    return getattr(obj, part)


def _get(obj, parts: list):
    for i, part in enumerate(parts):
        if part == EACH:  # one value per item, stacked along a new first axis
            return np.stack([np.asarray(_get(item, parts[i + 1:])) for item in obj])
        obj = _step(obj, part)
    return obj


def get_path(obj, path: str):
    """``obj.a.b`` for the path ``"a.b"``; ``[i]`` indexes a list (``[*]``: every item, the
    values stacked), and a dict on the way is indexed by the component (``"p.W_q"``,
    ``"p['attn.W_q']"``)."""
    return _get(obj, path_parts(path))


def _set(obj, parts: list, value) -> None:
    *head, last = parts
    for i, part in enumerate(head):
        if part == EACH:  # item a gets value[a]
            for a, item in enumerate(obj):
                _set(item, parts[i + 1:], None if value is None else value[a])
            return
        try:
            obj = _step(obj, part)
        except (AttributeError, KeyError, IndexError):
            if value is None:
                return
            raise
        if obj is None and value is None:
            return
    if last == EACH:
        obj[:] = list(value)
    elif isinstance(obj, (dict, list)) or isinstance(last, int):
        obj[last] = value
    else:
        setattr(obj, last, value)


def set_path(obj, path: str, value) -> None:
    """Set the path's last component (``[*]`` on the way: item ``a`` of the list gets
    ``value[a]``).  A ``None`` value (an absent bias) reached through a missing or ``None``
    sub-object is skipped: the object has no place for it, and needs none."""
    _set(obj, path_parts(path), value)
