"""Every tolerance of the suite, with the reason for its value.  Tests import these; none restates
a number.

Central differences in float64: truncation error ~ eps^2 |f'''| / 6 and rounding error
~ u |f| / eps with u = 2^-53 ~ 1.1e-16.  For |f| ~ 1..10 and eps = 1e-5 both are ~1e-10, so a
correct backward agrees with the FD slope to ~1e-9 relative wherever the slope is >= 1e-3.
Below that, the comparison is absolute (the floor): an exactly-zero true gradient (the key
projection bias, softmax's shift invariance) is judged against FD noise, not divided by it.
"""

# Finite-difference step for smooth maps (float64 only: float32 FD is useless at any step).
FD_EPS = 1e-5
# Relative tolerance of FD vs analytic, float64: ~1000x the expected FD error above.
FD_RTOL = 1e-6
# Magnitudes below FD_FLOOR are compared in absolute terms: |a - b| <= FD_RTOL * FD_FLOOR = 1e-9.
FD_FLOOR = 1e-3

# PyTorch oracle, float64: the same maths in a different summation order differs by a few ulps
# per op; 1e-10 relative leaves room for ~1e6 ulps accumulated through the model.
ORACLE_RTOL_F64 = 1e-10
ORACLE_ATOL_F64 = 1e-12
# PyTorch oracle, float32: unit roundoff 6e-8, times the depth of the longest reduction chain
# (8192-way logsumexp, 768-wide matmuls, 3 layers) gives a few 1e-5 relative; gradients pass
# through ~30 ops, so 1e-4 relative with an absolute floor of 1e-6 (entries near 0).
ORACLE_RTOL_F32 = 1e-4
ORACLE_ATOL_F32 = 1e-6

# float32 vs float64 run of the same reference code: the float64 run is exact to ~1e-15, so
# this is float32's own error, with the same reasoning as the float32 oracle.
F32_VS_F64_RTOL = 1e-4
F32_VS_F64_ATOL = 1e-6

# Hypothesis value generators keep ReLU pre-activations at least this far from 0, so a central
# difference of step FD_EPS (times the input's sensitivity) never crosses the kink.
KINK_MARGIN = 1e-3

# Global-norm clipping: the clipped norm equals max_norm up to the guard some implementations add
# to the divisor (PyTorch's clip_grad_norm_ scales by max_norm / (norm + 1e-6)); with the norms of
# order 1-100 the checks use, that guard shifts the result by at most 1e-6 relative.
CLIP_NORM_RTOL = 1e-6
