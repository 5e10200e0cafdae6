"""The drawing kit of the suite's strategies: the bounds of every draw, the building blocks
the case families draw from (arrays, sizes, upstream gradients, LayerNorm and ReLU inputs, ids,
masks, labels), :class:`OpCase` and :class:`CaseFamily`, the ``@cases`` and ``@fixed_examples``
decorators and the registry they fill (:data:`FAMILIES`, defined here alone, with
``families``, ``family``, ``ops_without_cases``), and the generic helpers of the fixed-seed
examples."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minibert_spec.protocol import IGNORE_INDEX, OPS
from minibert_spec.protocol.variants import (
    CLAIMS,
    VARIANTS,
    reaches,
    resolve_variant,
    strategy_keyword,
    with_pinned_eps,
)
from minibert_spec.tolerances import KINK_MARGIN, LN_MIN_VAR

# Values of inputs and parameters: large enough that softmax is far from uniform, small enough
# that nothing saturates to exact 0/1 in float64.
VALUE_BOUND = 2.0
# Upstream gradients.
DOUT_BOUND = 1.0

MAX_B = 3
MAX_T = 4
MAX_HEADS = 3
MAX_D_K = 3


# --------------------------------------------------------------------------- building blocks
# Strategies are built once per set of arguments (``reused``): a composite draws its parts
# afresh for every example, and Hypothesis validates every new strategy object on its first
# draw -- that cost more than the drawing (a third of the time the oracle spent drawing a
# block's weights; ~12% of ``minibert check``).  The same strategy draws the same values.
def reused(fn):
    """One strategy object per distinct arguments of the strategy function ``fn``; with an
    unhashable argument (a list), a fresh one as before."""
    cached = functools.lru_cache(maxsize=4096)(fn)

    @functools.wraps(fn)
    def strategy(*args, **kwargs):
        try:
            return cached(*args, **kwargs)
        except TypeError:  # an unhashable argument
            return fn(*args, **kwargs)

    return strategy


@reused
def np_arrays(dtype, shape, elements=None, fill=None) -> st.SearchStrategy[np.ndarray]:
    """``hypothesis.extra.numpy.arrays``, one strategy object per distinct arguments."""
    return hnp.arrays(dtype, shape, elements=elements, fill=fill)


@reused
def floats(lo: float = -VALUE_BOUND, hi: float = VALUE_BOUND) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, allow_subnormal=False,
                     width=64)


# An array of SEEDED_FROM elements or more is uniform over its bounds from one drawn seed, not
# drawn element by element: hypothesis.extra.numpy draws every element through the engine, and
# that was a third of ``minibert check``'s time (121 s of 350 in a profile).  What it costs: such
# an array's values shrink toward seed 0's, not toward simple numbers (its shape still shrinks;
# a red names the index and both values whatever was drawn), and its values are never the
# bounds, 0 or ties -- the checks keep those out anyway.  Small arrays (biases, gamma of a few
# features) keep Hypothesis's draws.
SEEDED_FROM = 8


def arrays(shape, lo: float = -VALUE_BOUND, hi: float = VALUE_BOUND, *,
           margin: float = 0.0) -> st.SearchStrategy[np.ndarray]:
    """float64 array of ``shape`` with entries in [lo, hi]; ``margin`` > 0 (then lo = -hi):
    every |entry| above ``margin`` (away from a kink at 0)."""
    shape = tuple(int(n) for n in shape)
    lo, hi, margin = float(lo), float(hi), float(margin)
    if margin > 0 and lo != -hi:
        raise ValueError(f"arrays: margin > 0 needs symmetric bounds, got lo={lo}, hi={hi}")
    if int(np.prod(shape)) >= SEEDED_FROM:
        return seeded_arrays(shape, lo, hi, margin)
    elements = away_from_zero(margin, hi) if margin > 0 else floats(lo, hi)
    return np_arrays(np.float64, shape, elements, st.nothing())


@reused
@st.composite
def seeded_arrays(draw, shape, lo: float, hi: float, margin: float) -> np.ndarray:
    """``shape`` entries uniform over [lo, hi) (``margin``: |v| in (margin, hi), mixed signs)
    from one drawn seed, salted with how many seeded arrays this example drew before: Hypothesis
    gives two draws of one example the same integer on purpose (4 seeds of an example collided in
    82% of examples), and equal weights W_q = W_k would hide a swap of their gradients."""
    rng = np.random.default_rng((draw(_seed()), _seeded_before()))
    if margin == 0:
        return rng.uniform(lo, hi, shape)
    return rng.choice((-1.0, 1.0), size=shape) * rng.uniform(np.nextafter(margin, hi), hi, shape)


_SEEDED_DRAWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _seeded_before() -> int:
    """The number of seeded arrays drawn so far in this example (its build context), counted
    up; 0 outside one.  A function of the example's choices alone: a replay draws the same."""
    from hypothesis.control import current_build_context
    from hypothesis.errors import InvalidArgument

    try:
        ctx = current_build_context()
    except InvalidArgument:
        return 0
    n = _SEEDED_DRAWS.get(ctx, 0)
    _SEEDED_DRAWS[ctx] = n + 1
    return n


@reused
def away_from_zero(margin: float = KINK_MARGIN, bound: float = VALUE_BOUND):
    """Scalar floats with margin < |v| <= bound."""
    return floats(-bound, bound).filter(lambda v: abs(v) > margin)


@reused
def sizes(lo: int = 1, hi: int = 4) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@reused
@st.composite
def batch_seq(draw, max_B: int = MAX_B, max_T: int = MAX_T) -> tuple[int, int]:
    """(B, T) with B >= 1, T >= 1."""
    return draw(sizes(1, max_B)), draw(sizes(1, max_T))


@reused
@st.composite
def head_dims(draw, max_heads: int = MAX_HEADS, max_d_k: int = MAX_D_K) -> tuple[int, int]:
    """(A, d_k) with d_k = 1 allowed; H = A * d_k."""
    return draw(sizes(1, max_heads)), draw(sizes(1, max_d_k))


@reused
@st.composite
def upstream(draw, shape) -> np.ndarray:
    """A random upstream gradient: never all ones, never constant (a rescaled all-ones)."""
    d = draw(arrays(shape, -DOUT_BOUND, DOUT_BOUND))
    if d.size > 1:
        assume(np.ptp(d) > 0.1)
    else:
        assume(abs(float(d.flat[0])) > 0.1 and float(d.flat[0]) != 1.0)
    return d


def scalar_upstream() -> st.SearchStrategy[float]:
    """dloss for a scalar loss: not 1, not ~0."""
    return floats(-2.0, 2.0).filter(lambda v: abs(v) > 0.1 and v != 1.0)


@reused
@st.composite
def gammas(draw, n: int, margin: float = 0.0) -> np.ndarray:
    """LayerNorm gamma: random, not all ones, varying across features when n > 1 (a backward
    that pulls gamma out of the feature means is only wrong when gamma varies).  ``margin`` > 0
    keeps every |gamma| above it, per element (for tests that divide by gamma): a whole-array
    assume() would reject a large share of draws and trip Hypothesis's filter health check."""
    g = draw(arrays((n,), -2.0, 2.0, margin=margin))
    assume(not np.all(g == 1.0))
    if n > 1:
        assume(np.ptp(g) > 0.1)
    return g


@reused
@st.composite
def betas(draw, n: int) -> np.ndarray:
    b = draw(arrays((n,), -1.0, 1.0))
    assume(np.any(b != 0.0))
    return b


@reused
@st.composite
def layernorm_inputs(draw, shape) -> np.ndarray:
    """Rows (last axis, length >= 2) with variance >= LN_MIN_VAR: LayerNorm is smooth there."""
    x = draw(arrays(shape))
    assume(np.min(x.var(axis=-1)) >= LN_MIN_VAR)
    return x


def relu_inputs(shape) -> st.SearchStrategy[np.ndarray]:
    """Pre-activations at least KINK_MARGIN away from ReLU's kink at 0."""
    return arrays(shape, margin=KINK_MARGIN)


@reused
@st.composite
def token_ids(draw, shape, vocab: int) -> np.ndarray:
    """int64 ids in [0, vocab) with at least one repeated id whenever there are two positions
    (a scatter-add that keeps only one of repeated ids is caught)."""
    ids = draw(np_arrays(np.int64, tuple(shape), st.integers(0, vocab - 1), st.nothing()))
    if ids.size >= 2:
        i, j = draw(st.lists(st.integers(0, ids.size - 1), min_size=2, max_size=2,
                             unique=True))
        ids.flat[j] = ids.flat[i]
    return ids


@reused
@st.composite
def row_masks(draw, shape) -> np.ndarray:
    """bool mask over the last axis, each row with one to all entries True."""
    m = draw(np_arrays(np.bool_, tuple(shape), st.booleans(), st.nothing()))
    rows = m.reshape(-1, shape[-1])
    for r in range(rows.shape[0]):
        if not rows[r].any():
            rows[r, draw(st.integers(0, shape[-1] - 1))] = True
    return rows.reshape(shape)


def key_masks(B: int, T: int) -> st.SearchStrategy[np.ndarray]:
    """Attention key-padding mask [B, T]: True = may be attended; >= 1 per sequence."""
    return row_masks((B, T))


@reused
@st.composite
def ce_labels(draw, shape, vocab: int, ignore_index: int = IGNORE_INDEX) -> np.ndarray:
    """Labels in [0, vocab) at one to all positions, ``ignore_index`` elsewhere."""
    predicted = draw(np_arrays(np.bool_, tuple(shape), st.booleans(), st.nothing()))
    if not predicted.any():
        predicted.flat[draw(st.integers(0, predicted.size - 1))] = True
    labels = draw(np_arrays(np.int64, tuple(shape), st.integers(0, vocab - 1), st.nothing()))
    return np.where(predicted, labels, ignore_index)


# --------------------------------------------------------------------------- op cases
@dataclass
class OpCase:
    """One input of an op pair.

    inputs: differentiable inputs by forward argument name (None = optional input left out),
            in the order the backward returns their gradients.
    fixed:  everything else the forward takes (ids, masks, labels, n_heads, reduction, ...).
    dout:   the upstream gradient (an array shaped like the output, or a float for a scalar).
    seed:   for the random directions of directional checks.
    """

    inputs: dict
    fixed: dict = field(default_factory=dict)
    dout: object = None
    seed: int = 0


# --------------------------------------------------------------------------- case families
# Tensors up to this many elements are checked element by element (localises a failure to an
# index); larger ones along random directions (two evaluations per direction).
ELEMENTWISE_MAX_SIZE = 32
N_DIRECTIONS = 3


@dataclass(frozen=True)
class CaseFamily:
    """One family of op cases: the strategy with its arguments, its fixed-seed examples, its
    torch twin, and what the FD, invariant and oracle checks need beyond the op's row of
    minibert_spec.protocol.OPS."""

    op: str  # the row of minibert_spec.protocol.OPS
    name: str  # the check name: the op, or the op and its variant (linear_nobias)
    cases: Callable[[], st.SearchStrategy[OpCase]]
    function: Callable = None  # the decorated strategy function
    # last components of the op's equation IDs this family does not exercise ("db" without a
    # bias, "sum" for the mean reduction), and further rows realised inside it (attention
    # splits and merges heads, the FFN runs ReLU)
    omit: tuple[str, ...] = ()
    also: tuple[str, ...] = ()
    adapter: Callable | None = None  # impl -> (forward, backward) for non-standard signatures
    smooth: Callable | None = None  # (case) -> bool: the case is away from non-smooth points
    f32_ok: Callable | None = None  # (case) -> bool: well-conditioned enough to compare f32/f64
    elementwise_max: int = ELEMENTWISE_MAX_SIZE  # largest tensor checked element by element
    n_dirs: int = N_DIRECTIONS  # random directions per larger tensor
    # what the implementation must declare (CAPABILITIES), decided before any draw:
    # "op.option" -> value (passed to the strategy as ``option``), "attention_bias" /
    # "key_mask" -> True; and the "op.option"s (or "attention_bias", "key_mask") whose value
    # follows the implementation (passed as ``option``, ``bias``, ``masked``)
    needs: tuple = ()
    resolve: tuple[str, ...] = ()
    fd: bool = True  # the backward is the gradient of the forward (not a composed one)
    # the torch twin, taking the forward's keywords (inputs and fixed): the name of a function
    # of minibert_spec.suite.torch_oracle, or ``to -> function`` given that module; resolved when an
    # oracle check runs (torch is imported then)
    torch: str | Callable | None = None
    # modules the twin imports beyond torch (transformers' LLaMA rotary embedding)
    torch_requires: tuple[str, ...] = ()
    # the oracle's rules beyond torch_oracle.allowed_error (a declared guard is the guard
    # table's, spec/protocol/guards.adjustment, by the family's row):
    # ``backward_scale(case)``: the magnitude of the terms the backward sums when it exceeds
    # the inputs' (its rounding floor); ``torch_float64``: torch runs in float64 on the
    # float32-rounded inputs, its result cast back (torch's own float32 is the inaccurate side)
    backward_scale: Callable | None = None
    torch_float64: bool = False

    @property
    def equations(self) -> tuple[str, ...]:
        """The equation IDs of the op (and of ``also``) this family exercises: ``omit`` holds
        last components ("db") or whole IDs."""
        ids = (e for row in (self.op, *self.also) for e in OPS[row].equations)
        return tuple(e for e in ids if e.rsplit(".", 1)[-1] not in self.omit
                     and e not in self.omit)

    def bind(self, impl):
        """(forward, backward) of the implementation for this family."""
        if self.adapter is not None:
            return self.adapter(impl)
        forward, backward = OPS[self.op].pair
        return getattr(impl, forward), getattr(impl, backward)

    def _kwargs(self, caps: dict, takes) -> dict:
        kw = {**self.cases.keywords,
              **variant_kwargs(self.op, dict(self.needs), self.resolve, caps)}
        takes_names = _parameters(takes)
        return {k: v for k, v in kw.items() if k in takes_names}

    def strategy_for(self, caps: dict) -> st.SearchStrategy[OpCase]:
        """The family's strategy with its variant parameters: the fixed ones (``needs``) and
        those that follow the implementation's declarations (``resolve``); smooth cases
        only."""
        strategy = self.function(**self._kwargs(caps, self.function))
        if with_pinned_eps(self.op, caps, {}):  # a LayerNorm eps fixed in the code: passed
            strategy = strategy.map(lambda case: self._pinned(case, caps))
        return strategy if self.smooth is None else strategy.filter(self.smooth)

    def _pinned(self, case: OpCase, caps: dict) -> OpCase:
        return dataclasses.replace(case, fixed=with_pinned_eps(self.op, caps, case.fixed))

    def examples(self, caps: dict) -> list[OpCase]:
        """The family's fixed-seed cases (its strategy's ``@fixed_examples`` builder, called
        with the same variant parameters and ``numpy.random.default_rng(EXAMPLE_SEED)``):
        every check of the family runs them first, and the quick run runs them alone."""
        build = getattr(self.function, "fixed_examples", None)
        if build is None:
            return []
        built = build(np.random.default_rng(EXAMPLE_SEED), **self._kwargs(caps, build))
        return [self._pinned(c, caps)
                for c in (built if isinstance(built, (list, tuple)) else [built])]

    def given(self, caps: dict) -> dict:
        return {"case": self.strategy_for(caps)}

    def explicit(self, caps: dict) -> list[dict]:
        return [{"case": c} for c in self.examples(caps)]

    def twin(self) -> Callable:
        """The torch twin (imports torch): ``torch`` names a function of
        minibert_spec.suite.torch_oracle,
        or is ``to -> function`` given that module (``to.F`` is torch.nn.functional)."""
        import importlib

        to = importlib.import_module("minibert_spec.suite.torch_oracle")
        return self.torch(to) if callable(self.torch) else getattr(to, self.torch)


EXAMPLE_SEED = 0


@functools.cache
def _parameters(fn: Callable) -> frozenset:
    """The parameter names of a strategy or example builder, read once: inspect.signature per
    keyword of each check was ~10,000 reads per judging run."""
    return frozenset(inspect.signature(fn).parameters)


def fixed_examples(build: Callable):
    """Attach ``build(rng, **variant parameters) -> OpCase or [OpCase]`` to a case strategy
    (written between its ``@cases`` and ``@st.composite``): its fixed-seed cases, built with
    NumPy alone from the same variant parameters the strategy takes (small, designed inputs:
    repeated ids, unused rows, ignored positions, masks)."""

    def attach(fn):
        fn.fixed_examples = build
        return fn

    return attach


def fixed_cases(strategy: Callable, **kw) -> list:
    """The fixed-seed cases ``@fixed_examples`` attached to a strategy, built with ``kw``."""
    built = strategy.fixed_examples(np.random.default_rng(EXAMPLE_SEED), **kw)
    return list(built) if isinstance(built, list) else [built]


def upstream_like(rng, shape) -> np.ndarray | float:
    """A fixed example's upstream gradient: Gaussian (mixed signs, never all ones); a float for
    a scalar output."""
    return float(rng.standard_normal()) if shape == () else rng.standard_normal(shape)


def variant_kwargs(op: str, needs: dict, resolve: tuple, caps: dict) -> dict:
    """Strategy keywords of one check (each claim's and option's own,
    minibert_spec.protocol.variants): the ``needs`` of ``op``'s own options, then each ``resolve``
    key at the value the implementation declares (its standard form when it has it).  Called after
    the needs were
    met (minibert_spec.suite.run checks them first)."""
    kw = {strategy_keyword(k): v for k, v in needs.items() if k.split(".")[0] in VARIANTS
          and reaches(k, op)}
    for key in resolve:
        if key in CLAIMS:
            kw[strategy_keyword(key)] = bool(caps[key])
            continue
        row, option = key.split(".")
        fixed = {k.split(".", 1)[1]: v for k, v in needs.items() if k.startswith(row + ".")}
        kw[strategy_keyword(key)] = resolve_variant(caps, row, fixed)[option]
    return kw


FAMILIES: list[CaseFamily] = []


def cases(op: str, variant: str | None = None, *, omit=(), also=(), adapter=None, smooth=None,
          f32_ok=None, elementwise_max=None, n_dirs=None, needs=None, resolve=(), fd=True,
          torch=None, torch_requires=(), backward_scale=None,
          torch_float64=False, **strategy_kwargs):
    """Register the decorated case strategy, called with ``strategy_kwargs``, as a case family
    of ``op`` (check name ``op_variant``, or ``op`` without a variant); ``torch`` names its
    twin in minibert_spec.suite.torch_oracle (the oracle checks run every family that has one), and
    ``torch_requires`` the modules it imports beyond torch.
    Stacked decorators register in the order they are written."""

    def register(fn):
        if op not in OPS:
            raise ValueError(f"cases: {op!r} is not a row of minibert_spec.protocol.OPS")
        sizes_ = {k: v for k, v in (("elementwise_max", elementwise_max), ("n_dirs", n_dirs))
                  if v is not None}
        family = CaseFamily(op, op if variant is None else f"{op}_{variant}",
                            functools.partial(fn, **strategy_kwargs), fn, tuple(omit),
                            tuple(also), adapter, smooth, f32_ok, **sizes_,
                            needs=tuple((needs or {}).items()), resolve=tuple(resolve), fd=fd,
                            torch=torch, torch_requires=tuple(torch_requires),
                            backward_scale=backward_scale,
                            torch_float64=torch_float64)
        if any(f.name == family.name for f in FAMILIES):
            raise ValueError(f"cases: case family {family.name!r} is registered twice")
        # decorators apply bottom-up: go before the families the ones below registered
        at = next((i for i, f in enumerate(FAMILIES) if f.function is fn), len(FAMILIES))
        FAMILIES.insert(at, family)
        return fn

    return register


@reused
def _seed():
    return st.integers(0, 2**31 - 1)


def _lead_shapes(max_rank: int = 3):
    """Leading shapes (B,), (B, T), ... for ops that act on the last axis."""
    return st.integers(0, max_rank - 1).flatmap(
        lambda r: st.tuples(*[sizes(1, 3)] * r))


def _away_from_zero(rng, shape, low=0.1, high=2.0):
    """A fixed example's entries with low <= |v| <= high, mixed signs."""
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(low, high, size=shape)


def _gamma_beta(rng, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed example's LayerNorm gamma (around 1, never all 1) and beta (never 0)."""
    return 1 + 0.5 * rng.standard_normal(n), 0.3 * rng.standard_normal(n)


# the rows of a softmax: attention's probability rows and the losses' probability forms
def _softmax_rows(z: np.ndarray) -> np.ndarray:
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def families() -> list[CaseFamily]:
    """Every registered case family, in the order of the op table (minibert_spec.protocol.OPS), then
    of registration."""
    return [f for op in OPS for f in FAMILIES if f.op == op]


def family(name: str) -> CaseFamily:
    """The registered case family of that name."""
    found = [f for f in FAMILIES if f.name == name]
    if not found:
        raise KeyError(f"no case family {name!r}")
    return found[0]


def ops_without_cases() -> list[str]:
    """Op pairs of minibert_spec.protocol.OPS with no registered case family (forgotten
    strategies)."""
    covered = {f.op for f in FAMILIES}
    return [name for name, row in OPS.items() if row.pair and name not in covered]
