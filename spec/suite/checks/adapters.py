"""Checks of what a declarative class-layer adapter (minibert_spec.suite.adapters.layer) declares:
the layer's gradient attributes accumulate (``+=``) when ``accumulate=True`` -- two backward calls
after one forward leave the sum of the two gradients -- and are replaced otherwise.  A layer
whose gradients accumulate is what makes gradient accumulation over micro-batches work in the
implementation's own training loop; a fresh layer per call (the adapter's cache) would never
exercise it, so the suite does.  Not applicable to ops not adapted with ``layer``."""

from __future__ import annotations

import numpy as np

from minibert_spec.numerics.asserts import worst
from minibert_spec.protocol import OPS, NotApplicable, capabilities
from minibert_spec.protocol.capabilities import unmet
from minibert_spec.suite import strategies as S
from minibert_spec.suite.registry import check
from minibert_spec.tolerances import F64_IDENTITY_RTOL

PAIR_OPS = [name for name, row in OPS.items() if row.pair is not None]


def _layer_spec(impl, op):
    """The layer() declaration behind ``op``'s backward (the pair itself is each case family's
    own call: CaseFamily.bind)."""
    bwd = OPS[op].pair[1]
    spec = getattr(getattr(impl, bwd), "__minibert_layer__", None)
    if spec is None or not spec.attribute_grads:
        raise NotApplicable(f"not applicable: {impl._impl_label} does not claim gradients "
                            f"accumulated on a layer ({bwd} is not a class layer with gradient "
                            "attributes declared with minibert_spec.suite.adapters.layer)")
    if spec.single_use:
        raise NotApplicable(f"not applicable: {bwd} is declared single use (single_use=True: "
                            "its backward frees the forward's activations), so two backward "
                            "calls on one forward are not a use it has")
    return spec


def _own(cache):
    """The layer's own cache (minibert_spec.suite.adapters.LayerCache) inside the proxy's wrappers
    (a per-head layout, a rank adaptation, a reduction: each keeps the inner cache as .inner) and
    the suite's own case adapters (strategies.block_adapter: the implementation's cache first
    in a tuple)."""
    while not hasattr(cache, "layer"):
        if hasattr(cache, "inner"):
            cache = cache.inner
        elif isinstance(cache, tuple) and cache:
            cache = cache[0]
        else:
            break
    return cache


@check("invariant", "", cases=[(f"{op}.grad_accumulates", {"op": op}) for op in PAIR_OPS],
       ops=lambda kw: (kw["op"],), quick=True)
def layer_gradients_accumulate_as_declared(impl, op):
    """On the op's fixed-seed cases (its case families'): backward(d1) then the layer's own
    backward(d2) on the same forward leaves g(d1) + g(d2) in the gradient attributes when the
    adapter declares accumulate=True, and g(d2) otherwise (g from fresh forwards, to
    F64_IDENTITY_RTOL)."""
    spec = _layer_spec(impl, op)
    rng = np.random.default_rng(0)
    last = None
    caps = capabilities(impl)
    # each family's own call of the pair (a block's through the suite's adapter, its
    # parameters as the one dict p the protocol takes): the layer underneath is the same
    for forward, backward, ex in ((*f.bind(impl), c) for f in S.families()
                                  if f.op == op and not unmet(caps, dict(f.needs))
                                  for c in f.examples(caps)):
        try:
            out, _ = forward(**ex.inputs, **ex.fixed)
        except NotApplicable as e:  # a variant the layer does not take: try the next example
            last = e
            continue
        d1, d2 = (rng.standard_normal(np.shape(out)) if np.ndim(out) else float(rng.normal())
                  for _ in range(2))

        def grads_for(dout, ex=ex, forward=forward, backward=backward):
            _, cache = forward(**ex.inputs, **ex.fixed)
            backward(dout, cache)
            return {k: np.array(v, copy=True) for k, v in spec.read_grads(_own(cache)).items()}

        g1, g2 = grads_for(d1), grads_for(d2)
        _, cache = forward(**ex.inputs, **ex.fixed)
        backward(d1, cache)  # zeroes the attributes first when accumulate=True
        spec.run_backward(_own(cache), d2)  # the layer's own backward, nothing zeroed
        got = spec.read_grads(_own(cache))
        rule = "g(d1) + g(d2) (accumulate=True)" if spec.accumulate else \
            "g(d2) (accumulate=False: replaced)"
        for name, path in spec.attribute_grads.items():
            if name not in got:
                continue
            want = g1[name] + g2[name] if spec.accumulate else g2[name]
            a, b = np.asarray(got[name], dtype=np.float64), want.astype(np.float64)
            bound = F64_IDENTITY_RTOL * max(float(np.max(np.abs(b), initial=0.0)), 1e-300)
            if a.shape != b.shape or not np.all(np.abs(a - b) <= bound):
                hint = (" -- the layer replaces it (= instead of +=)" if spec.accumulate
                        and np.allclose(a, g2[name]) else
                        " -- the layer accumulates it: declare accumulate=True"
                        if not spec.accumulate and np.allclose(a, g1[name] + g2[name]) else "")
                raise AssertionError(
                    f"{op}: d{name} (layer attribute {path!r}) after backward(d1) and "
                    f"backward(d2) on one forward should be {rule}: "
                    f"{worst(a, b, bound)}{hint}")
        return
    raise last or NotApplicable(f"not applicable: {op} has no fixed-seed example")
