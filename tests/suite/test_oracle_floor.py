"""The LayerNorm oracle's rounding floor (minibert_spec.tolerances.layernorm_backward_scale, the
rule of the layernorm case families' oracle checks):
on an example where dx is eps-sized (two features, no affine: x_hat = +-sqrt(1 - eps / sigma^2)),
ours and torch differ by the rounding of the |dy| / sigma terms dx cancels, more than a floor
scaled by the inputs alone allows.  The deep profile found such a case on the reference; this is
one like it, written out.  The floor scaled by dx's terms passes the reference and still fails
every catalog mutant of LayerNorm's dx that changes this example."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import minibert_reference  # noqa: E402
from minibert_spec.mutants import applied  # noqa: E402
from minibert_spec.suite.checks.oracle_ops import compare_with_torch  # noqa: E402
from minibert_spec.suite.strategies import OpCase, family  # noqa: E402
from minibert_spec.tolerances import layernorm_backward_scale  # noqa: E402

EPS = 1e-12
# rows of two features 0.2-0.24 apart (sigma ~0.1, the check's LN_MIN_STD), values within +-3
X = np.array([[[2.826333766375601, 2.620767174069277], [1.8401392310358864, 1.6222598098510053],
               [-2.2629066478063247, -2.0301157385597848]],
              [[2.301124705137064, 2.0785019516324015], [-1.0766002925893852, -1.2795667621782516],
               [-0.040790153583881605, -0.25358737319418034]]])
DY = np.array([[[3.70284652508941, 6.146871590362834], [-1.9502316926846788, 0.9051795077404438],
                [0.3069721775570841, -1.4233708285389994]],
               [[-2.01925250896925, 2.3275468621401663], [2.4593287285293384, 5.215979504190571],
                [-2.8561804978739986, 3.6199993130661814]]])


CASE = OpCase({"x": X, "gamma": None, "beta": None}, {"eps": EPS}, DY)


def _backward_against_torch(scale: float | None) -> None:
    """The generic oracle's backward comparison on the affine-free family (``scale`` None: the
    family's own rule)."""
    compare_with_torch(minibert_reference, family("layernorm_plain"), CASE, "backward", np.float64,
                       backward_scale=scale)


def test_an_input_scaled_floor_calls_the_reference_wrong_here():
    """The example is one the fix is for: at the inputs' scale the reference is red."""
    with pytest.raises(AssertionError, match="layernorm_plain dx .* differs from torch"):
        _backward_against_torch(0.0)


def test_the_floor_of_dx_terms_passes_the_reference():
    _backward_against_torch(layernorm_backward_scale(X, None, DY, EPS))
    _backward_against_torch(None)  # the rule the layernorm families' oracle checks use


@pytest.mark.parametrize("mutant", ["layernorm_missing_mean_term", "layernorm_missing_xhat_term",
                                    "layernorm_eps_outside_sqrt", "layernorm_unbiased_variance"])
def test_the_floor_of_dx_terms_still_fails_a_wrong_dx(mutant):
    scale = layernorm_backward_scale(X, None, DY, EPS)
    with applied(mutant), pytest.raises(AssertionError, match="differs from torch"):
        _backward_against_torch(scale)
