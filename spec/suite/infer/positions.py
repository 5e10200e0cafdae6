"""The position rows of :mod:`minibert_spec.suite.infer`: ``sinusoidal_position`` (a fixed table
added to x, and the protocol's ``sinusoidal_encoding(T, d, dtype)`` beside the pair) and
``position_embedding`` (a learned table ``W_pos [T_max, H]`` added to x).  Once the forward
matched, :func:`settle` decides what the row still needs:

* ``position_embedding``: the table's gradient must have been found: a table added to x without
  one is a fixed buffer, not this op's parameter (unmapped, never a row missing a gradient);
* ``sinusoidal_position``: where ``sinusoidal_encoding`` comes from, each candidate compared by
  value with the reference's table: an array attribute of the matched class (its forward adds
  that very table, so one table is judged both ways), else a module function named like a table
  (its two sizes in either order), else the adapter's own forward at x = 0 (x + PE at 0 is PE).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import numpy as np

from minibert_spec.suite.infer.probes import FORWARD_RTOL, Mapping_, Probe, deviation
from minibert_spec.suite.infer.subjects import _arrays, _module_functions

POSITION_OPS = ("sinusoidal_position", "position_embedding")
# the module functions tried as the table (called with two sizes): named like one, so that no
# other function of the user's (a training loop) is ever run
TABLE_NAMES = re.compile(r"pos|sinus|encod|angle|^pe_|_pe$|^pe$", re.I)
# a class constructor's arguments, from the layer's (x) to the encoding function's (T, d, dtype)
ENCODING_ARGS = {"x.shape[-2]": "T", "x.shape[-1]": "d", "x.dtype": "dtype"}


@dataclass(frozen=True)
class Encoding:
    """Where the adapter's ``sinusoidal_encoding`` takes its table from."""

    kind: str  # "attribute" (of the class), "function" (of the module), "forward" (x = 0)
    name: str = ""  # the class's or the function's
    args: tuple = ()  # the class's (argument, expression) pairs; the function's ("T", "d") order
    path: str = ""  # the attribute
    dtype: bool = False  # it takes a dtype (else the adapter casts)
    exact: bool = True  # it is [T, d] itself (else its first T rows of d features)
    evidence: str = ""


def settle(subject, m: Mapping_, probe: Probe, missing: list) -> tuple[Mapping_ | None, list]:
    """``m`` completed for a position row, or (None, []) where it must not stand."""
    lacking = [p for p in probe.learned if p in m.params and p not in m.grads]
    if lacking:
        # a fixed table (a sinusoidal one not the reference's, a buffer) is no learned parameter
        subject.unmapped = (f"; its forward adds a {list(probe.shapes[lacking[0]])} table as "
                            f"{probe.op} does, but no gradient of it was found (a fixed table "
                            "is not a learned one)")
        return None, []
    if probe.op == "sinusoidal_position":
        T, d = probe.shapes["x"][1:]
        m.encoding = (_table_attribute(m, T, d) if m.cls is not None else None) or \
            _table_function(subject, m, T, d) or \
            Encoding("forward", dtype=True, exact=False,
                     evidence="sinusoidal_encoding: no attribute or module function gives the "
                     "reference's table; written as the forward at x = 0 (x + PE = PE)")
        m.evidence.append(m.encoding.evidence)
    return m, missing


def _is_table(a, T: int, d: int) -> bool:
    """Whether ``a`` holds the reference's sinusoidal table for (T, d): [T, d] itself, or
    more positions ([max_len, d], [1, max_len, d]) whose first T rows are it."""
    import minibert_reference

    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.floating) or a.ndim < 2 or a.shape[-1] != d or \
            a.size < T * d:
        return False
    return deviation(a.reshape(-1, d)[:T], minibert_reference.sinusoidal_encoding(T, d)) \
        <= FORWARD_RTOL


def _attribute(obj, path: str):
    """``obj.a.b`` for the path ``a.b``; None where a step is not an attribute (a dict's item,
    which the written ``.a.b`` could not reach)."""
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj


def _table_attribute(m: Mapping_, T: int, d: int) -> Encoding | None:
    """The class's array attribute holding the table, on the class built as the probe built it
    (at T = 3, d = 4 where it takes them)."""
    ctor = {k: ENCODING_ARGS.get(v, v) for k, v in m.ctor.items()}
    if any(v.startswith("x") for v in ctor.values()):  # a size the encoding's (T, d) do not give
        return None
    try:
        obj = m.cls(**m.trial.fixed)
    except Exception:  # noqa: BLE001 -- built once by the probe already: no table to offer
        return None
    for path, a in _arrays(obj).items():
        if _attribute(obj, path) is a and _is_table(a, T, d):
            return Encoding("attribute", m.cls.__name__, tuple(ctor.items()), path,
                            "dtype" in ctor, a.shape == (T, d),
                            f"sinusoidal_encoding: .{path} {list(a.shape)} of "
                            f"{m.cls.__name__} built for T={T}, d={d} holds the reference's "
                            f"table{'' if a.shape == (T, d) else ' in its first T rows'}")
    return None


def _table_function(subject, m: Mapping_, T: int, d: int) -> Encoding | None:
    """A module function named like a table giving the table for the sizes in either order."""
    module = inspect.getmodule(m.cls if m.cls is not None else m.forward)
    own = {getattr(subject, "fn", None), getattr(subject, "bfn", None)}
    for f in _module_functions(module) if module is not None else ():
        if f in own or not TABLE_NAMES.search(f.__name__):
            continue
        try:
            params = inspect.signature(f).parameters
        except (TypeError, ValueError):  # no signature to read: not tried
            continue
        kw = {"dtype": np.float64} if "dtype" in params else {}
        for order in (("T", "d"), ("d", "T")):
            try:
                out = f(*(T if n == "T" else d for n in order), **kw)
            except Exception:  # noqa: BLE001 -- not a function of two sizes
                continue
            if isinstance(out, np.ndarray) and _is_table(out, T, d):
                return Encoding("function", f.__name__, order, "", bool(kw), out.shape == (T, d),
                                f"sinusoidal_encoding: {f.__name__}({', '.join(order)}) gives "
                                f"the reference's table for T={T}, d={d}")
    return None


def encoding_source(m, alias: str) -> list[str]:
    """The adapter's ``sinusoidal_encoding`` ([] where the mapping has none)."""
    enc = getattr(m, "encoding", None)
    if enc is None:
        return []
    if enc.kind == "attribute":
        ctor = ", ".join(f"{k}={v}" for k, v in enc.args)
        table = f"{alias}.{enc.name}({ctor}).{enc.path}"
    elif enc.kind == "function":
        table = f"{alias}.{enc.name}({', '.join(enc.args)}{', dtype=dtype' if enc.dtype else ''})"
    else:  # the adapter's own forward, defined above it
        table = "sinusoidal_position_forward(np.zeros((1, T, d), dtype))[0]"
    if not enc.dtype:  # a table built in float64 alone: cast as the reference casts
        table = f"np.asarray({table}, dtype=dtype)"
    if not enc.exact:
        table += ".reshape(-1, d)[:T]"
    return ["def sinusoidal_encoding(T, d, dtype=np.float64):", f"    return {table}", ""]
