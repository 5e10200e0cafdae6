"""``minibert adapter infer MODULE``: propose an adapter
(:func:`minibert_spec.suite.adapters.layer`) for the classes and the module-level function pairs of
a module, from their forward outputs and shapes only.

The subjects are the module's classes with a forward-like and a backward-like method
(:class:`~minibert_spec.suite.infer.subjects.ClassLayer`) and its functions paired by name
(``f`` or ``f_forward`` with ``f_backward``, ``_grad``, ``d_f``, ...:
:class:`~minibert_spec.suite.infer.subjects.FunctionPair`).  For each op it knows
(:data:`PROBES`) and each subject, it builds the subject with the probe's distinct sizes (so a
size names its axis) and its parameters placed in either layout, and keeps it only where the
forward's output equals the reference forward's (the *only* numeric evidence,
:mod:`~minibert_spec.suite.infer.match`).  The backward's call is decided by its parameters'
names and its gradients are mapped by shape and name, never by value
(:mod:`~minibert_spec.suite.infer.backward`), so that no bug of a backward can be inferred away:
the adapter written is judged by ``minibert check`` like a hand-written one.  Blocks, optimizers,
schedules, clipping and whole decoders have searches of their own (the sibling modules).

It returns the adapter's source: one comment per decision with its evidence, and the list of
what it could not map.  The user reviews it and keeps it.
"""

from __future__ import annotations

# re-exported: the names imported from the package (the CLI, the tests, the benchmark)
from minibert_spec.suite.infer.isolated import infer_isolated
from minibert_spec.suite.infer.match import infer
from minibert_spec.suite.infer.probes import PROBES, Mapping_, _probe_values
from minibert_spec.suite.infer.render import infer_source, render_source
from minibert_spec.suite.infer.subjects import load_module

__all__ = ["PROBES", "Mapping_", "_probe_values", "infer", "infer_isolated", "infer_source",
           "load_module", "render_source"]
