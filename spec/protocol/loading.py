"""Loading an implementation from ``package.module[:object]``: any failure -- a missing module, a
module raising on import (``SystemExit`` included), a missing attribute -- is one line."""

from __future__ import annotations

import importlib

from minibert_spec.protocol import proxy


class ImplLoadError(Exception):
    """The implementation could not be loaded; the message is one line."""


def load_impl(spec: str):
    """'pkg.mod' -> the module; 'pkg.mod:obj' -> attribute obj of it (dotted paths allowed).

    Any failure -- a missing module, a module raising (even ``SystemExit``) on import, a
    missing attribute -- raises :class:`ImplLoadError` with a one-line reason."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not all(p.isidentifier() for p in module_name.split(".")):
        raise ImplLoadError(f"impl: expected package.module[:object], got {spec!r}")
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ImplLoadError(f"impl: cannot import {module_name!r}: {e}") from None
    except BaseException as e:  # noqa: BLE001 -- a module raising on import is a load failure
        if isinstance(e, KeyboardInterrupt) and proxy.sigint_seen():
            raise
        where = ""
        tb = e.__traceback__
        while tb is not None:
            where = f" ({tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})"
            tb = tb.tb_next
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ImplLoadError(f"impl: importing {module_name!r} raised {type(e).__name__}"
                            + (f": {msg}" if msg else "") + where) from None
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except BaseException as e:  # noqa: BLE001
            if isinstance(e, KeyboardInterrupt) and proxy.sigint_seen():
                raise
            raise ImplLoadError(f"impl: {spec!r}: cannot read {part!r}: "
                                f"{type(e).__name__}: {e}") from None
    return as_implementation(obj)


def as_implementation(obj):
    """``obj``, or the whole model a bare function stands for (``mymodel:loss_and_grads``,
    minibert_spec.protocol.wholemodel.implementation); an ImplLoadError when that function's
    params or batch cannot be told."""
    from minibert_spec.protocol.wholemodel import implementation

    try:
        return implementation(obj)
    except ValueError as e:
        raise ImplLoadError(f"impl: {e}") from None

