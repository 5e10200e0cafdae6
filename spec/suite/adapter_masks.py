"""The mask converter of a class-style attention or block (``layer(..., mask=converter)``): the
suite's ``[B, T]`` key mask (1 = attend, 0 = padded key; ``None``: no padding) and its
``causal`` flag turned into the class's own mask format -- an additive float mask ``[B, 1, T,
T]`` of 0 and -1e9 (or -inf), a boolean ``[B, T, T]``, a padding mask the class combines with its
own causal one.

The converter names what it needs among :data:`MASK_ARGS` (``lambda mask, causal, T, dtype:
...``: ``T`` the sequence length, ``dtype`` the input's, so that an additive mask keeps float32
float32).  Its result is checked on every call: one that raises, or returns a shape no mask of
``[B, T]`` keys can have, is a :class:`MaskConverterError` -- a red of the check that called
it, one line naming the converter -- never a pass and never *not applicable*."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["MASK_ARGS", "MaskConverter", "MaskConverterError", "mask_converter"]

MASK_ARGS = ("mask", "causal", "T", "dtype")  # what a converter may ask for, by name


class MaskConverterError(RuntimeError):
    """The declared mask converter raised or returned what no mask can be: a red, one line.
    Not a ValueError: a bad-input check must not take it for the implementation's refusal."""


@dataclass(frozen=True)
class MaskConverter:
    """A converter and the arguments it names (a subset of :data:`MASK_ARGS`)."""

    op: str
    fn: Callable
    names: tuple[str, ...]

    @property
    def label(self) -> str:
        """``<lambda> (adapter.py:12)``: which converter, where it is written."""
        name = callable_name(self.fn)
        code = getattr(self.fn, "__code__", None)
        where = f" ({os.path.basename(code.co_filename)}:{code.co_firstlineno})" if code else ""
        return f"{name}{where}"

    def carries(self, mask, causal: bool) -> bool:
        """What the converter reads masks something: a key mask it names, or causal it names
        (a class that builds its own causal mask is not asked for it)."""
        return ("mask" in self.names and mask is not None) or \
            ("causal" in self.names and bool(causal))

    def __call__(self, mask, causal: bool, x):
        """The class's mask for a call with ``mask`` and ``causal`` on the input ``x [B, T,
        H]``."""
        B, T = np.shape(x)[0], np.shape(x)[-2]
        given = {"mask": mask, "causal": bool(causal), "T": T, "dtype": np.asarray(x).dtype}
        called = (f"mask {'None' if mask is None else list(np.shape(mask))}, "
                  f"causal={bool(causal)}, T={T}")
        try:
            out = self.fn(**{n: given[n] for n in self.names})
        except Exception as e:  # noqa: BLE001 -- the converter's failure is the check's red
            text = " ".join(str(e).split())
            raise MaskConverterError(
                f"layer({self.op!r}): the mask converter {self.label} raised "
                f"{type(e).__name__}{': ' + text if text else ''} (called with {called})"
            ) from e
        if out is None:
            if not self.carries(mask, causal):
                return None  # nothing it reads to mask: the class's own "no mask"
            raise MaskConverterError(
                f"layer({self.op!r}): the mask converter {self.label} returned None for "
                f"{called}: expected the class's mask (None only when what it reads masks "
                f"nothing)")
        shape = np.shape(out)
        if not fits(shape, B, T):
            raise MaskConverterError(
                f"layer({self.op!r}): the mask converter {self.label} returned shape "
                f"{list(shape)} for {called}: expected [B, T], [T, T], [B, T, T] or "
                f"[B, A, T, T] (size-1 axes broadcast; B={B}, T={T})")
        return out


def fits(shape: tuple, B: int, T: int) -> bool:
    """A mask over ``T`` keys for a batch of ``B``: ``[B, T]`` (padding only), ``[T, T]``
    (causal only), ``[B, T, T]`` or ``[B, A, T, T]`` (queries x keys, per head or one for all),
    each axis but the keys' possibly 1 (broadcast)."""
    if len(shape) < 2 or len(shape) > 4 or shape[-1] != T:
        return False
    if len(shape) == 2:
        return shape[0] in (1, B, T)
    return shape[0] in (1, B) and shape[-2] in (1, T)


def mask_converter(op: str, fn) -> MaskConverter:
    """``layer``'s ``mask=`` checked when declared: a callable naming some of
    :data:`MASK_ARGS` (``mask`` or ``causal`` at least), else a ValueError naming it."""
    if not callable(fn):
        raise ValueError(f"layer({op!r}): mask= expected a callable (mask, causal, T, dtype) -> "
                         f"the class's mask, got {fn!r}")
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    names = tuple(p.name for p in params if p.name in MASK_ARGS)
    unknown = [p.name for p in params if p.name not in MASK_ARGS and p.default is p.empty]
    if unknown or not {"mask", "causal"} & set(names):
        raise ValueError(f"layer({op!r}): mask= takes {[p.name for p in params]}: expected "
                         f"parameters among "
                         f"{list(MASK_ARGS)}, with mask or causal (e.g. lambda mask, causal, T: "
                         f"...)")
    return MaskConverter(op, fn, names)


def callable_name(fn) -> str:
    """How an adapter's messages name a user's callable: its qualified name (a class, a
    function, a lambda), else its type's name (a callable instance)."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__
