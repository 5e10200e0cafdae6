"""``minibert adapter infer MODULE``: propose an adapter
(:func:`minibert_spec.suite.adapters.layer`) for the classes and the module-level function pairs of
a module, from their forward outputs and shapes only.

The subjects are the module's classes with a forward-like and a backward-like method
(:class:`ClassLayer`) and its functions paired by name, ``f`` or ``f_forward`` with
``f_backward`` (``_grad``, ``d_f``, ...: :class:`FunctionPair`; a notebook's functions, whose
``__module__`` is None, count as the module's).  For each op it knows (:data:`PROBES`: linear,
layernorm, rmsnorm, relu, gelu, silu, tanh, softmax, the ReLU FFN, embedding, attention,
cross-entropy, the LM head fused with its cross-entropy, the sinusoidal and learned positions)
and each subject, it

* builds the class with its integer arguments drawn from the probe's distinct sizes (so a
  size names its axis: ``Linear(4, 5)`` is ``n_in = W.shape[0]``; an argument named as the
  op's parameter, ``LayerNorm(gamma, beta)``, given an array of its shape), and places the
  protocol's parameters on the array attributes of their shape, or of the transposed shape
  (``transposed``); a function's parameters go to its arguments after the first (the input),
  each in either layout, ``eps``/``epsilon`` getting the protocol's eps,
* runs the forward on the probe's input: the candidate is kept only where the output (or item
  0 of a tuple) equals the reference forward's (the *only* numeric evidence),
* decides the backward's call by its parameters' names (the forward's input or arguments
  again, its cache ``forward[1]``, its output ``out``, the upstream gradient), runs it once
  and maps each gradient by shape -- attributes, a returned dict, a returned tuple's items --
  and, where shapes tie, by the parameter's name in the gradient's path (a tuple's items: in
  the forward's argument order, the protocol's rule): the gradient *values* are never
  compared with anything, so that no bug of a backward can be inferred away -- the adapter it
  writes is then judged by ``minibert check`` like a hand-written one,
* reads a class backward's source for the conventions (``+=`` into a gradient:
  ``accumulate``; ``del self.``: ``single_use``),
* for a loss, probes its forms once more by its forward alone (``ignore_index``, ``reduction``:
  :mod:`~minibert_spec.suite.infer.losses`).

A transformer block is found by its own search: a class (:mod:`~minibert_spec.suite.infer.blocks`)
or, where no class is one, a function pair in the protocol's shape, module-level or held by a
module-level SimpleNamespace (:mod:`~minibert_spec.suite.infer.fnblocks`).

It returns the adapter's source: one comment per decision with its evidence, and the list of
what it could not map (a forward function without a backward is named there).  The user
reviews it and keeps it.
"""

from __future__ import annotations

# re-exported: every public name of the one module this package was split from, and the private
# ones imported from here (tests/suite/test_infer.py: _probe_values)
from minibert_spec.suite.infer.isolated import Inferred, infer_isolated  # noqa: F401 (re-exported)
from minibert_spec.suite.infer.match import (  # noqa: F401 (re-exported)
    FIXED_EPS,
    FIXED_EPS_RTOL,
    infer,
)
from minibert_spec.suite.infer.probes import (  # noqa: F401 (re-exported)
    BACKWARD_AFFIXES,
    BACKWARDS,
    CACHE_NAMES,
    EPS_NAMES,
    FORWARD_RTOL,
    FORWARD_SUFFIXES,
    FORWARDS,
    GRAD_DEPTH,
    INPUT_NAMES,
    OP_NAMES,
    OUT_NAMES,
    PROBES,
    PROTOCOL_EPS,
    UPSTREAM_NAMES,
    VARIANT_PROBES,
    Mapping_,
    Probe,
    Trial,
    _probe_values,
)
from minibert_spec.suite.infer.render import infer_source, render_source  # noqa: F401 (re-exported)
from minibert_spec.suite.infer.subjects import (  # noqa: F401 (re-exported)
    ClassLayer,
    FunctionPair,
    load_module,
)

__all__ = ["PROBES", "Mapping_", "infer", "infer_isolated", "infer_source"]
