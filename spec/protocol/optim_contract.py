"""The optimizer contract is the suite's, not the adapter's (issue 23): what the suite supplies
when an implementation's ``adam_step`` lacks the ``no_decay`` keyword, reported as a convention.

AdamW's decay is decoupled: ``p1 = p - lr (update + wd p)``, elementwise and per tensor.  For an
``adam_step(..., weight_decay)`` that decays every tensor, the protocol's no-decay set (the
``no_decay`` passed, else BERT's default rule ``minibert_reference.optim.default_no_decay``) is
applied by adding ``lr wd p`` back to those tensors after the step: exact in real arithmetic, one
rounding in floating point.  A coupled decay (L2 folded into the gradient) is not undone by this and
stays red where it was.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np

from minibert_spec.protocol.conventions import ConventionWarning

NO_DECAY_NOTE = ("adam_step has no no_decay keyword: the suite applies the protocol's no-decay "
                 "set (default: embeddings, LayerNorm gamma/beta, biases) by adding lr * wd * p "
                 "back to those tensors after the step")


def accepts(fn, name: str) -> bool:
    """``fn`` takes the keyword ``name`` (explicitly, or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True  # a builtin without a signature: pass everything, as before
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _exempt(params, no_decay) -> list[str]:
    from minibert_reference.optim import default_no_decay

    rule = default_no_decay if no_decay is None else no_decay
    if callable(rule):
        return [k for k in params if rule(k)]
    names = set(rule)
    return [k for k in params if k in names]


def adam_step_adapter(fn):
    """``adapt(args, kwargs) -> (args, kwargs, post)`` for the proxy, or None when ``fn`` takes
    ``no_decay`` itself."""
    if accepts(fn, "no_decay"):
        return None

    def adapt(args, kwargs):
        kwargs = dict(kwargs)
        missing = object()
        no_decay = kwargs.pop("no_decay", missing)
        wd = float(kwargs.get("weight_decay", 0.0) or 0.0)
        params = args[0] if args else kwargs.get("params")
        if wd == 0.0 or params is None:
            return args, kwargs, None
        exempt = _exempt(params, None if no_decay is missing else no_decay)
        lr = float(kwargs["lr"])
        old = {k: np.array(params[k], copy=True) for k in exempt}
        warnings.warn(NO_DECAY_NOTE, ConventionWarning, stacklevel=3)

        def post(result):
            new, state = result
            new = dict(new)
            for k in exempt:
                p = np.asarray(new[k])
                new[k] = (p + lr * wd * old[k]).astype(p.dtype)
            return new, state

        return args, kwargs, post

    return adapt
