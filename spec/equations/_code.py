"""The code side of the SymPy <-> code checks: how an op's forward and backward are called on a
sample, beside the SymPy side of each equation file.  Apart from the SymPy helpers of
``_nn`` so that a proof's cache key (its module's import closure,
minibert_spec.equations._cache) does not follow code plumbing: editing the LayerNorm helper
re-proves no linear proof."""

from __future__ import annotations

import numpy as np

from minibert_spec.equations import Numeric


def op_code(which, forward, backward, call, upstream, pick=None, loss=False):
    """The code side of an op's SymPy <-> code check: ``impl.<forward>(*args, **kwargs)``
    (``call(**sample) -> (args, kwargs)``) -> ``(out,)`` for ``which`` 0 (``loss``:
    ``np.asarray(out)``); else ``impl.<backward>(g, cache)`` at that forward's cache, ``g`` the
    sample's array named ``upstream`` (a number: a loss's 1.0), as it returns it, its entry
    ``pick`` (an int) or ``tuple(...)[pick]`` (a slice)."""
    def run(impl, size, **a):
        args, kwargs = call(**a)
        out, cache = getattr(impl, forward)(*args, **kwargs)
        if which == 0:
            return (np.asarray(out) if loss else out,)
        grads = getattr(impl, backward)(a[upstream] if isinstance(upstream, str) else upstream,
                                        cache)
        return grads if pick is None else (grads[pick],) if isinstance(pick, int) else \
            tuple(grads)[pick]
    return run


def op_check(which, sizes, inputs, sympy, forward, backward, call, upstream, *, pick=None,
             loss=False, **numeric) -> Numeric:
    """The :class:`Numeric` of an op's forward (``which`` 0) or backward check, its code side
    :func:`op_code`; ``needs`` (unless given): the forward, and the backward it calls."""
    numeric.setdefault("needs", (forward,) + ((backward,) if which else ()))
    return Numeric(sizes, inputs, sympy, op_code(which, forward, backward, call, upstream, pick,
                                                 loss), **numeric)


def forward_backward_code(forward, backward, args, upstream, *fixed, **kwargs):
    """``code(which)``: :func:`op_code` calling ``impl.<forward>(*sample[args], *fixed,
    **kwargs)`` (``args``: the names of the sample's arrays, in the op's order)."""
    return lambda which: op_code(which, forward, backward,
                                 lambda **a: ((*(a[n] for n in args), *fixed), kwargs), upstream)


def fb_checks(sizes, inputs, sympy, forward, backward, args, upstream, *fixed, needs=None,
              kwargs=None, **numeric) -> tuple[Numeric, Numeric]:
    """The forward and backward :class:`Numeric` of an op, the code side
    :func:`forward_backward_code`'s, the SymPy side ``sympy(which)``; ``needs`` (unless given):
    the forward, and the backward where it is called."""
    code = forward_backward_code(forward, backward, args, upstream, *fixed, **(kwargs or {}))
    return tuple(Numeric(sizes, inputs, sympy(w), code(w),
                         needs=needs or (forward,) + ((backward,) if w else ()), **numeric)
                 for w in (0, 1))


def by_rows(f, rows: dict, n_stacked: int, **shared) -> tuple:
    """Rows are independent: the lambdified row map ``f`` on each row of the arrays ``rows``
    ({name: [R, N]}) with the ``shared`` arguments; its first ``n_stacked`` outputs stacked
    over rows, the others (parameter gradients) summed over them -- the sum is what the code's
    [..., N] -> [N] reduction must equal."""
    outs = [f(**dict(zip(rows, r)), **shared) for r in zip(*rows.values())]
    return tuple(np.stack([o[k] for o in outs]) if k < n_stacked else sum(o[k] for o in outs)
                 for k in range(len(outs[0])))
