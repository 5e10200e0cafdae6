"""Global-norm gradient clipping (Mini-BERT derivation §7.3).  The implementation:
``clip_by_global_norm``."""

from __future__ import annotations

import numpy as np
import sympy as sp

from minibert_spec.equations import Equation, Numeric, Proof, register
from minibert_spec.equations._cache import maps_cache
from minibert_spec.equations._sym import lambdify_map
from minibert_spec.sources import MINIBERT
from minibert_spec.tolerances import CLIP_NORM_RTOL


def _prove_clip() -> Proof:
    """scale = max_norm / ||g|| when ||g|| > max_norm: the clipped gradients have global norm
    exactly max_norm and the same direction; otherwise unchanged (min(1, c/||g||))."""
    for n in (2, 3):
        gs = sp.symbols(f"g0:{n}", real=True)
        c = sp.Symbol("c", positive=True)
        norm = sp.sqrt(sp.Add(*[x ** 2 for x in gs]))
        clipped = [x * c / norm for x in gs]
        if sp.simplify(sp.sqrt(sp.Add(*[x ** 2 for x in clipped])) - c) != 0:
            return Proof("refuted", (n,), "clipped norm != max_norm")
    return Proof("proven", (2, 3), "||scale * g|| = max_norm, direction kept")


# --------------------------------------------------------------------------- SymPy <-> code
def _clip_code(impl, size, g, max_norm):
    clipped = impl.clip_by_global_norm({"a": g[:2], "b": g[2:]}, float(max_norm[0]))
    clipped = clipped[0] if isinstance(clipped, tuple) else clipped
    return (np.concatenate([clipped["a"], clipped["b"]]),)


@maps_cache
def _clip_map(size):
    n = size[0]
    gs = np.array([sp.Symbol(f"g{i}", real=True) for i in range(n)], dtype=object)
    c = sp.Symbol("c", positive=True)
    norm = sp.sqrt(sp.Add(*[x ** 2 for x in gs]))
    out = np.array([sp.Piecewise((x * c / norm, norm > c), (x, True)) for x in gs],
                   dtype=object)
    return lambdify_map(dict(g=gs, max_norm=np.array([c], dtype=object)), [out])


def _clip_sympy(size):
    f = _clip_map(size)

    def clip(g, max_norm):
        # NumPy's Piecewise evaluates both branches: c / norm of an all-zero g is 0/0 in the
        # branch that is not taken
        with np.errstate(invalid="ignore", divide="ignore"):
            return f(g=g, max_norm=max_norm)
    return clip


register(Equation(
    "clip.global_norm", "Global-norm gradient clipping", (f"{MINIBERT} §7.3",),
    r"n = \sqrt{\sum_p \lVert g_p \rVert^2},\ g_p \leftarrow g_p \cdot \frac{c}{n}\ (n > c)",
    _prove_clip, torch_op="torch.nn.utils.clip_grad_norm_",
    numeric=Numeric(((4,), (5,)), lambda s: dict(g=("float", s, 2.0),
                                                 max_norm=("float", (1,), 3.0)),
                    _clip_sympy, _clip_code,
                    accept=lambda s, g, max_norm: bool(max_norm[0] > 0.1),
                    needs=("clip_by_global_norm",),
                    convention=(CLIP_NORM_RTOL, "a divisor guard in clipping (norm + eps)"))))
