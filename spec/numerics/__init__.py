"""The numerics of checking, NumPy only: what a check computes and how it compares.

* :mod:`minibert_spec.numerics.finite_differences` -- central finite differences in float64
(directional
  and element-wise), the model-level gradient check and its random inputs;
* :mod:`minibert_spec.numerics.fdcheck` -- an op's backward against finite differences, on one case
of
  its case family;
* :mod:`minibert_spec.numerics.identities` -- the identities every correct implementation satisfies,
  each written once (``f(impl, inputs) -> findings``);
* :mod:`minibert_spec.numerics.asserts` -- the assertions of the checks (no pytest needed), each
failure
  naming what was compared and both values.

The tolerances they compare with live one layer lower, in :mod:`minibert_spec.tolerances` (the op
table reads one too).  This package sits above ``minibert_spec.protocol`` and below everything that
checks (``minibert_spec.equations``, ``minibert_spec.suite``, ``minibert_spec.claims``): see
``[tool.importlinter]`` in pyproject.toml.
"""
