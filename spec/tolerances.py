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
# Where the case's own truncation error is larger (a ~0 gradient of a sharply curved function: a
# LayerNorm row [0, 0, 0, a] in a block, truncation ~3e-9), a failing comparison is allowed that
# error, estimated from a second step (minibert_spec.numerics.finite_differences.truncation_slack):
# derived, not loosened.
FD_FLOOR = 1e-3

# Float32-only code (a whole model that computes in float32 whatever it is given,
# minibert_spec.numerics.finite_differences.gradcheck_dict): run as it is, so its loss carries
# float32 rounding (~1e-7 relative per op) and an FD step of FD_EPS would measure rounding alone.
# The step is 1e-2 along a unit direction (near eps32^(1/3) ~ 5e-3, where truncation ~ h^2 and
# rounding ~ u / h balance), and each comparison is allowed the loss's own rounding noise,
# measured on the case (FD_F32_NOISE_SIGMAS times the spread that fourth differences of the loss
# show, whose smooth part ~ h^4 is ~1e-8): a floor that is stated in the verdict, since a gradient
# error below it is not seen.  Above the floor, 1e-3 relative: the direction's own float32
# rounding on the way in (~1e-5 relative) with 100x room; a wrong backward is off by O(1).
FD_F32_EPS = 1e-2
FD_F32_RTOL = 1e-3
FD_F32_NOISE_SIGMAS = 6.0

# SymPy <-> code: the lambdified SymPy expression and the NumPy function evaluate the same real
# formula in float64 in different orders (a few ulps, 2.2e-16, per op over <= ~100 terms), on
# inputs bounded by ~2.  Compared as max|a - b| / max(|a|, |b|, SYMPY_CODE_FLOOR): relative for
# O(1) outputs, absolute 1e-12 for outputs that are ~0 by cancellation (LayerNorm dx at N = 2).
SYMPY_CODE_RTOL = 1e-12
SYMPY_CODE_FLOOR = 1.0

# PyTorch oracle, float64: the same maths in a different summation order differs by a few ulps
# per op; 1e-10 relative leaves room for ~1e6 ulps accumulated through the model.  Relative to
# the magnitude of the whole tensor (tests/torch_oracle.allowed_error says why), so no absolute
# floor.
ORACLE_RTOL_F64 = 1e-10
# PyTorch oracle, either dtype: the absolute floor under the relative rule, in units of roundoff
# (np.finfo(dtype).eps) of the magnitude of the op's inputs (spec/suite/torch_oracle.
# rounding_floor).  A result that is small only because terms of the inputs' size cancelled
# (GELU's tail: -1.9e-7 at x = -5.1, where ours and torch's float64 differ by 5.4e-17; a float32
# pooler output of 2e-4 from terms of size 2, off by 1e-7) carries rounding of the size of those
# terms, so "1e-10 of the scale" alone demands more than the dtype resolves -- a random red on a
# correct implementation.  Each side rounds ~10-30 times per element on the suite's sizes
# (reductions of <= 8 terms, a few elementwise ops); 64 ulps of the input magnitude covers that
# with margin, and is still ~1e-14 absolute in float64 and ~1e-5 in float32 on inputs of size 2:
# every catalog mutant changes results by >= 1e-3 relative.  The floor never drops below the
# smallest normal number (denormal results: 0.0 vs 2.8e-45 is no disagreement).
ORACLE_FLOOR_ULPS = 64


def layernorm_backward_scale(x, gamma, dy, eps) -> float:
    """The magnitude of the terms LayerNorm's dx sums, the scale of its oracle rounding floor
    (above the inputs' when sigma is small): dx = (g - mean(g) - x_hat mean(g x_hat)) / sigma
    with g = gamma dy, so terms of |g| / sigma (x_hat^2 <= 1 for N = 2), up to 10x the inputs at
    sigma >= 0.1.  They cancel when x_hat^2 -> 1 (N = 2: dx is eps-sized), and both sides carry
    the rounding of those terms (found by the deep profile: 4.8e-14 apart on dx = -8.9e-9 at
    eps = 1e-11; tests/suite/test_oracle_floor.py).  NumPy only."""
    import numpy as np

    sigma_min = float(np.sqrt(np.asarray(x, np.float64).var(axis=-1) + eps).min())
    g_max = float(np.abs(dy).max()) * (1.0 if gamma is None else float(np.abs(gamma).max()))
    return 2.0 * g_max / sigma_min

# PyTorch oracle, float32: unit roundoff 6e-8, times the depth of the longest reduction chain
# (8192-way logsumexp, 768-wide matmuls, 3 layers) gives a few 1e-5 relative; gradients pass
# through ~30 ops, so 1e-4 relative to the tensor's magnitude.
ORACLE_RTOL_F32 = 1e-4

# float32 vs float64 run of the same reference code: the float64 run is exact to ~1e-15, so
# this is float32's own error, with the same reasoning as the float32 oracle.
F32_VS_F64_RTOL = 1e-4
F32_VS_F64_ATOL = 1e-6
# ... unless the case is ill-conditioned: where the float32 run misses that allowance, the check
# measures (in float64) how far 1-ulp roundings of the inputs alone move each result
# (minibert_spec.numerics.fdcheck.input_rounding_sensitivity, the largest of 2 random-sign
# draws) and allows 4 times that on top.  Float32 code computes from rounded inputs and rounds
# every intermediate as well, so no correct code is closer to the float64 result than the
# rounding of its inputs allows.  Found by --seed 0 on the reference's own LLaMA block (RMSNorm,
# RoPE, causal attention, SwiGLU): dx off by 1.02e-4 where 9.9e-5 was allowed, while 1-ulp input
# roundings alone moved that very entry by 3.6e-5 to 1.6e-4 (tests/suite/test_f32_conditioning.py).
# Over 5,700 random draws of the LLaMA, causal-RoPE, RMSNorm and pre-LN block families, one more
# was red on the reference (1.05x the plain allowance; 0.18x with this rule), and no case came
# above 0.66x of the allowance with it.  A precision
# bug (a one-pass variance, a softmax without its max subtracted) misses by orders of magnitude
# more than its inputs' rounding explains, and stays red.
F32_CONDITIONING_FACTOR = 4.0
F32_CONDITIONING_SAMPLES = 2
F32_CONDITIONING_SEED = 20240529

# Hypothesis value generators keep ReLU pre-activations at least this far from 0, so a central
# difference of step FD_EPS (times the input's sensitivity) never crosses the kink.
KINK_MARGIN = 1e-3

# Hypothesis value generators keep LayerNorm rows at least this variance: with eps ~ 0 the map
# x -> x_hat has curvature ~ 1/std^3, so the central-difference truncation error relative to the
# slope is ~ FD_EPS^2 / var; at var >= 1e-2 that is <= 1e-8, 100x below FD_RTOL.  (Near-constant
# rows are a near-singularity of LayerNorm, excluded for the same reason as ReLU kinks.)
LN_MIN_VAR = 1e-2

# Identities that hold exactly in real arithmetic (linearity of a backward in its upstream
# gradient, shift/scale invariances), checked in float64 on the tiny shapes of the tests: each
# side carries a few ulps (2.2e-16) per op over chains of ~10-30 ops and sums of <= ~100 terms,
# so 1e-12 relative to the magnitude of the terms leaves ~100x headroom and still catches any
# missing or extra term (an error of order 1).  The one tolerance of every identity of
# minibert_spec.numerics.identities (shared by the Hypothesis tests and ``minibert check``), applied
# to the magnitude of the compared tensor or of the terms that cancelled into it.
F64_IDENTITY_RTOL = 1e-12

# Stored regression values of a short float64 training run (tests/train/test_train.py): the same
# code on another BLAS/CPU may sum in another order, ~1e-16 per op; 10 Adam steps of a tiny model
# carry that forward without amplifying it beyond ~1e-13 (Adam's m / sqrt(v) is scale-free, so a
# relative gradient error stays relative).  1e-9 is far above that and far below any change to
# the training dynamics (a different lr, schedule or bias correction moves the losses by >1e-4).
REGRESSION_RTOL_F64 = 1e-9

# Global-norm clipping: the clipped norm equals max_norm up to the guard some implementations add
# to the divisor (PyTorch's clip_grad_norm_ scales by max_norm / (norm + 1e-6)); with the norms of
# order 1-100 the checks use, that guard shifts the result by at most 1e-6 relative.
CLIP_NORM_RTOL = 1e-6
