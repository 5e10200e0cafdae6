"""Op pairs, llm.c style: ``X_forward(...) -> (out, cache)``, ``X_backward(dout, cache) -> grads``.

Conventions
-----------
* Pure functions, no hidden state: everything backward needs travels in ``cache``, a
  ``typing.NamedTuple`` whose field names are the derivation's (``LayerNormCache(x_hat, rstd,
  gamma)``).  Backwards read the fields by name.  The cache is opaque to the adapter protocol:
  only this package reads it (and, for the reference only, the claims ledger).
* A backward returns a tuple with one gradient per differentiable input of the forward, in the
  forward's argument order (``None`` where an optional input such as a bias was ``None``).
* float32 and float64 go through the same code; the dtype of the inputs is the dtype of every
  output (no silent casts, mixing dtypes is a ValueError).
* Shapes in comments: B batch, T sequence, H hidden, A heads, d_k = H / A, I intermediate, V vocab.
* Equation IDs (``@implements``) name the derivation in ``spec/`` each function realises; they sit
  on the kernels, which hold the maths.

Validation at the edge: kernels and public ops
----------------------------------------------
Every op comes in two layers, side by side:

* ``_X_forward(...)`` / ``_X_backward(dout, cache)`` -- the *kernel*: the maths only, no argument
  checks.  Kernels call kernels.  Private to the ``minibert_reference`` package
  (``minibert_reference.model`` composes them), never part of ``__all__``.
* ``X_forward`` / ``X_backward`` -- the *public op* of the protocol: checks every argument once
  (a ValueError naming the argument, see ``minibert_reference.validate``) and calls its kernel.
  Argument checks shared with composite ops live in ``_check_X`` helpers.

A composite op (attention, ffn, block, pooler) checks its own arguments once and then runs kernels
only; ``minibert_reference.model.forward`` checks params, ids and mask once and then runs kernels
only.

Sections
--------
One module per section, each op's kernels, public pair, cache and argument checks together, its
public ops listed in its own ``__all__``; this package gathers every name of every section (below,
no list of its own), so ``minibert_reference.ops.<name>`` reaches each of them, and its
``__all__`` is the sections' ``__all__`` together.  A new op in a section needs no edit here:

* ``_common`` -- ``IGNORE_INDEX``, ``_rows``, ``_sum_to_last``;
* ``embeddings`` -- token, tied, learned and sinusoidal position embeddings, BERT's token types
  and embedding LayerNorm;  ``rope`` -- rotary position embedding;
* ``linear``;  ``norms`` -- LayerNorm, RMSNorm;  ``activations`` -- softmax, ReLU, tanh, GELU,
  SiLU, GeGLU;
* ``attention``;  ``ffn`` -- the MLP and SwiGLU;  ``blocks`` -- the transformer blocks;
* ``heads`` -- pooler, MLM head, classifier;  ``losses`` -- cross-entropy (plain, next-token,
  fused with the linear map) and MSE.
"""

from __future__ import annotations

# Where the names of this package come from: every module of it (reference/ops/*.py, a section)
# is imported, and every name the section holds -- the public ops of its ``__all__``, and the
# kernels, caches, tables and argument checks (``ops._layernorm_backward``, ``ops.LayerNormCache``,
# ``ops.BLOCK_PARTS``), and what it imports (``ops.np``, ``ops.implements``, ``ops.as_float_array``)
# -- becomes a name of this package, the very object, so a mutant swapped into any namespace that
# holds it (minibert_spec.mutants.activate) is the one every caller runs.  This is the one-file
# module the package was (issue 38 split it by section): minibert_reference.model and .decoder
# compose the kernels as ``ops._X``, the mutation catalog targets ``"ops._layernorm_backward"``.
# ``__all__`` is the sections' ``__all__`` in section order; a name two sections bind to different
# objects is an ImportError here, never a silent pick.


def _gather(package: dict) -> list[str]:
    """Bind every name of every section in ``package`` (this module's globals); the public names."""
    import importlib
    import pkgutil

    public: list[str] = []
    origin: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        section = importlib.import_module(f"{__name__}.{info.name}")
        for name, value in vars(section).items():
            if name.startswith("__") and name.endswith("__"):
                continue  # the module's own dunders (__doc__, __all__, __file__...)
            if name in origin and package[name] is not value:
                raise ImportError(f"minibert_reference.ops: {name!r} is bound to different "
                                  f"objects in sections {origin[name]!r} and {info.name!r}")
            origin.setdefault(name, info.name)
            package[name] = value
        public += [n for n in section.__all__ if n not in public]
    return public


__all__ = _gather(globals())
del _gather
