"""Central finite differences in float64: element-wise and directional.

Design follows torch.autograd.gradcheck (fast mode) and JAX's check_grads: a directional check
compares <grad, u> with (f(x + eps u) - f(x - eps u)) / 2 eps for a random mixed-sign u, two
evaluations per direction whatever the tensor's size; the element-wise check localises a failure
to an index on tiny shapes.  The error of a comparison is |a - b| / max(|a|, |b|, floor), so an
entry where both sides are ~0 is judged in absolute terms instead of passing or failing by luck.

NumPy only: usable by the tests, the CLI and third-party implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from minibert_spec.protocol import IGNORE_INDEX
from minibert_spec.tolerances import (
    FD_EPS,
    FD_F32_EPS,
    FD_F32_NOISE_SIGMAS,
    FD_F32_RTOL,
    FD_FLOOR,
    FD_RTOL,
)


@dataclass
class CheckResult:
    """One comparison of an analytic gradient with finite differences."""

    op: str
    tensor: str
    mode: str  # "directional" or "elementwise"
    error: float  # worst |a - b| / max(|a|, |b|, floor)
    rtol: float
    analytic: float  # values at the worst direction / index
    numeric: float
    index: tuple | None = None  # worst element (elementwise) or direction number
    n_checked: int = 0
    note: str = ""  # how the result was reached (localised from a directional failure)
    passed: bool = field(init=False)

    def __post_init__(self):
        self.passed = bool(self.error <= self.rtol)

    def __str__(self) -> str:
        where = f" at index {self.index}" if self.mode == "elementwise" else (
            f" (direction {self.index})" if self.index is not None else "")
        verdict = "ok" if self.passed else "FAIL"
        return (f"{verdict}: {self.op} d/d{self.tensor} [{self.mode}] error {self.error:.2e} "
                f"(rtol {self.rtol:.0e}){where}: analytic {self.analytic:.10e}, "
                f"finite difference {self.numeric:.10e}" + (f" {self.note}" if self.note else ""))


def relative_error(a, b, floor: float = FD_FLOOR):
    """|a - b| / max(|a|, |b|, floor), element-wise."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), floor)


def truncation_slack(f: Callable[[np.ndarray], float], x: np.ndarray, step: np.ndarray,
                     eps: float, numeric: float) -> float:
    """The central difference's own truncation error at this case, estimated from a second
    step: D(eps) - D(2 eps) = -3 c eps^2 + O(eps^4), so |D(eps) - D(2 eps)| is 3x the error of
    D(eps).  Used as an absolute allowance only when a comparison fails: where the true
    gradient is ~0 but the function curves sharply (a LayerNorm row [0, 0, 0, a]: gradients
    ~1e-10, truncation ~3e-9) the fixed floor FD_RTOL * FD_FLOOR = 1e-9 is below FD's own
    error, and the reference failed its own check; a wrong backward (an error of the size of
    the gradient) stays far outside it."""
    wide = (float(f(x + 2 * eps * step)) - float(f(x - 2 * eps * step))) / (4 * eps)
    return abs(numeric - wide)


def _judged(analytic: float, numeric: float, floor: float, slack: float) -> float:
    """|a - b| less the truncation allowance, relative to max(|a|, |b|, floor)."""
    return max(0.0, abs(analytic - numeric) - slack) / max(abs(analytic), abs(numeric), floor)


def _require_f64(name: str, x: np.ndarray) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.float64:
        got = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise ValueError(f"{name}: finite differences need a float64 array, got {got} "
                         "(float32 FD error is ~100% at any step)")


def directional_check(f: Callable[[np.ndarray], float], x: np.ndarray, grad: np.ndarray, *,
                      rng: np.random.Generator, n_dirs: int = 2, eps: float = FD_EPS,
                      rtol: float = FD_RTOL, floor: float = FD_FLOOR, op: str = "",
                      tensor: str = "", noise: float = 0.0) -> CheckResult:
    """<grad, u> vs (f(x + eps u) - f(x - eps u)) / (2 eps) for ``n_dirs`` random unit vectors u.

    u is Gaussian (mixed signs, never all-ones) normalised to ||u|| = 1, so the step moves x by
    exactly eps whatever its size: each entry moves by ~eps / sqrt(x.size), which keeps a large
    tensor's perturbation from crossing ReLU kinks downstream.  ``f`` maps an array shaped like
    ``x`` to a scalar; ``x`` is not modified.  ``noise``: an absolute allowance on |a - b| for
    rounding in ``f`` itself (float32 code: :func:`rounding_noise`), 0 for float64 code.
    """
    _require_f64(tensor or "x", x)
    if grad.shape != x.shape:
        raise ValueError(f"grad: expected shape {x.shape} (the shape of {tensor or 'x'}), "
                         f"got {grad.shape}")
    worst = None
    for k in range(n_dirs):
        u = rng.standard_normal(x.shape)
        u /= np.linalg.norm(u)
        analytic = float(np.vdot(np.asarray(grad, dtype=np.float64), u))
        numeric = (float(f(x + eps * u)) - float(f(x - eps * u))) / (2 * eps)
        err = float(relative_error(analytic, numeric, floor))
        if err > rtol:  # FD's own truncation error at this case, not the backward's
            err = _judged(analytic, numeric, floor,
                          truncation_slack(f, x, u, eps, numeric) + noise)
        if worst is None or err > worst[0]:
            worst = (err, analytic, numeric, k)
    err, a, n, k = worst
    return CheckResult(op, tensor, "directional", err, rtol, a, n, k, n_dirs)


def elementwise_check(f: Callable[[np.ndarray], float], x: np.ndarray, grad: np.ndarray, *,
                      eps: float = FD_EPS, rtol: float = FD_RTOL, floor: float = FD_FLOOR,
                      indices: Iterable[tuple] | None = None, op: str = "",
                      tensor: str = "", noise: float = 0.0) -> CheckResult:
    """Central difference of every element (or of ``indices``) against ``grad``; reports the
    worst index.  ``noise``: as in :func:`directional_check`."""
    _require_f64(tensor or "x", x)
    if grad.shape != x.shape:
        raise ValueError(f"grad: expected shape {x.shape}, got {grad.shape}")
    xp = x.copy()
    worst = (0.0, 0.0, 0.0, None)
    count = 0
    for idx in (np.ndindex(*x.shape) if indices is None else indices):
        idx = tuple(int(i) for i in idx)
        orig = xp[idx]
        xp[idx] = orig + eps
        f_plus = float(f(xp))
        xp[idx] = orig - eps
        f_minus = float(f(xp))
        xp[idx] = orig
        numeric = (f_plus - f_minus) / (2 * eps)
        analytic = float(grad[idx])
        err = float(relative_error(analytic, numeric, floor))
        if err > rtol:  # FD's own truncation error at this case, not the backward's
            e = np.zeros_like(xp)
            e[idx] = 1.0
            err = _judged(analytic, numeric, floor,
                          truncation_slack(f, xp, e, eps, numeric) + noise)
        count += 1
        if worst[3] is None or err > worst[0]:
            worst = (err, analytic, numeric, idx)
    err, a, n, idx = worst
    return CheckResult(op, tensor, "elementwise", err, rtol, a, n, idx, count)


# A failed directional check is localised to an element by central differences of at most this
# many entries (2 evaluations each): all of a small tensor, a random sample of a larger one.
LOCALISE_MAX = 64


def localise(f: Callable[[np.ndarray], float], x: np.ndarray, grad: np.ndarray,
             failed: CheckResult, rng: np.random.Generator, *, eps: float = FD_EPS,
             noise: float = 0.0) -> CheckResult:
    """The element-wise check behind a failed directional one: the worst index and both values
    (over every entry, or LOCALISE_MAX sampled ones); the directional result if no sampled
    entry disagrees.  ``eps``, ``noise``: the directional check's."""
    if failed.passed or failed.mode != "directional":
        return failed
    if x.size <= LOCALISE_MAX:
        indices, how = None, f"every one of the {x.size} entries"
    else:
        flat = rng.choice(x.size, size=LOCALISE_MAX, replace=False)
        indices = [np.unravel_index(int(i), x.shape) for i in flat]
        how = f"{LOCALISE_MAX} sampled entries of {x.size}"
    el = elementwise_check(f, x, grad, indices=indices, op=failed.op, tensor=failed.tensor,
                           rtol=failed.rtol, eps=eps, noise=noise)
    if el.passed:
        failed.note = f"(no single entry among {how} disagrees: a spread-out error)"
        return failed
    el.note = (f"(localised over {how}; directional error {failed.error:.2e}: analytic "
               f"{failed.analytic:.6e}, FD {failed.numeric:.6e})")
    return el


def check_gradients(f: Callable[..., float], inputs: Mapping[str, np.ndarray],
                    grads: Mapping[str, np.ndarray], *, mode: str = "directional",
                    rng: np.random.Generator | None = None, op: str = "",
                    **kwargs) -> list[CheckResult]:
    """Check the gradient of scalar ``f(**inputs)`` w.r.t. every input named in ``grads``.

    Each tensor is perturbed alone, the others held at their values.
    """
    if mode not in ("directional", "elementwise"):
        raise ValueError(f"mode: expected 'directional' or 'elementwise', got {mode!r}")
    missing = sorted(set(grads) - set(inputs))
    if missing:
        raise ValueError(f"grads: names {missing} are not inputs of f ({sorted(inputs)})")
    rng = rng if rng is not None else np.random.default_rng(0)
    results = []
    for name, g in grads.items():
        def f_of(value, _name=name):
            return f(**{**inputs, _name: value})

        if mode == "directional":
            r = directional_check(f_of, inputs[name], g, rng=rng, op=op, tensor=name, **kwargs)
            r = localise(f_of, inputs[name], g, r, rng)  # a red names the worst element
        else:
            r = elementwise_check(f_of, inputs[name], g, op=op, tensor=name, **kwargs)
        results.append(r)
    return results


def assert_all_passed(results: Iterable[CheckResult]) -> None:
    """Raise AssertionError listing every failed comparison (op, tensor, worst index, values)."""
    results = list(results)
    failed = [r for r in results if not r.passed]
    if failed:
        worst = max(failed, key=lambda r: r.error)
        raise AssertionError(
            f"gradient check failed for {len(failed)} of {len(results)} tensors ("
            + ", ".join(f"d/d{r.tensor}" for r in failed) + f"); worst {worst}"
            + ("\n" + "\n".join(str(r) for r in failed) if len(failed) > 1 else ""))


# --------------------------------------------------------------------------- a dict of arrays
# FD of a scalar function of a dict of named arrays (a whole model's loss of its params, a
# user-declared op's objective): each tensor along random directions, the worst failing one
# localised to an element.  No architecture assumed: names are only names.
@dataclass
class DictGradcheck:
    """The comparisons of :func:`gradcheck_dict`: one per tensor, in the dict's order (the
    worst failing one localised to an element when it could be), the dtype the function ran
    in, its FD step and the absolute rounding floor each comparison was allowed (0 in
    float64)."""

    results: list[CheckResult]
    dtype: str
    eps: float
    noise: float
    worst: CheckResult | None = None  # the worst failing tensor's, localised; None: all agree

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    def floor_note(self) -> str:
        """How the comparisons were made, in words (the verdict states a float32 floor)."""
        if self.dtype != "float32":
            return f"float64, step {self.eps:g}, rtol {self.results[0].rtol:g}" if \
                self.results else "float64"
        return (f"float32 code run as it is: step {self.eps:g}, rtol {FD_F32_RTOL:g} above a "
                f"rounding floor of {self.noise:.1e} on each directional derivative (the "
                "loss's own float32 noise, measured): a gradient error below it is not seen")


def moved(params: Mapping[str, np.ndarray], rng: np.random.Generator, *, scale: float = 0.5,
          least: float = 0.1) -> dict[str, np.ndarray]:
    """Every float tensor moved off its value whatever its name: ``+ N(0, s^2)`` with ``s =
    max(scale * rms, least)`` -- a gain of ones, a bias of zeros, a small-init weight all become
    random, so a backward right only at initialisation (gamma = 1, beta = 0) is caught.  Dtypes
    kept."""
    out = {}
    for name, value in params.items():
        v = np.asarray(value)
        if not np.issubdtype(v.dtype, np.floating):
            out[name] = v.copy()
            continue
        s = max(scale * float(np.sqrt(np.mean(np.square(v, dtype=np.float64)))), least)
        out[name] = (v + s * rng.standard_normal(v.shape)).astype(v.dtype)
    return out


def rounding_noise(f_of: Mapping[str, Callable[[np.ndarray], float]],
                   points: Mapping[str, np.ndarray], eps: float, rng: np.random.Generator,
                   *, samples: int = 8) -> float:
    """The allowance on a central difference of step ``eps`` for rounding inside the function:
    ``FD_F32_NOISE_SIGMAS * sigma / eps``, sigma the spread of one evaluation estimated from
    fourth differences f(2h) - 4 f(h) + 6 f(0) - 4 f(-h) + f(-2h) along random unit directions
    (variance 70 sigma^2; their smooth part ~ h^4 f'''' is ~1e-8 at h = 1e-2), at least
    ``samples`` of them spread over the tensors, and never below one float32 ulp of f.  The
    gradient under test takes no part: a wrong backward cannot widen its own allowance."""
    names = list(points)
    f0 = None
    d4 = []
    for k in range(max(samples, len(names))):
        name = names[k % len(names)]
        f, x = f_of[name], points[name]
        f0 = float(f(x)) if f0 is None else f0
        u = rng.standard_normal(x.shape)
        u /= np.linalg.norm(u)
        v = [float(f(x + j * eps * u)) for j in (2, 1, -1, -2)]
        d4.append(v[0] - 4 * v[1] + 6 * f0 - 4 * v[2] + v[3])
    sigma = max(float(np.sqrt(np.mean(np.square(d4)) / 70.0)),
                float(np.finfo(np.float32).eps) * abs(f0))
    return FD_F32_NOISE_SIGMAS * sigma / eps


def gradcheck_dict(f: Callable[[dict], float], params: Mapping[str, np.ndarray],
                   grads: Mapping[str, np.ndarray], *, rng: np.random.Generator,
                   n_dirs: int = 1, op: str = "") -> DictGradcheck:
    """Directional central differences of scalar ``f(params)`` w.r.t. every tensor of
    ``params`` (torch gradcheck's fast mode: two evaluations per random mixed-sign unit
    direction, whatever the tensor's size), each perturbed alone; the worst failing tensor is
    then localised element-wise (:func:`localise`: the index and both values).

    float64 params: the step and rtol of the float64 checks.  float32 params (code that
    computes in float32 whatever it is given) are run as they are: the function gets float32
    arrays, the step is FD_F32_EPS and each comparison is allowed the function's own rounding
    noise (:func:`rounding_noise`), reported in the result.  ``grads`` must hold an array of
    each tensor's shape (check that first: :func:`gradient_bookkeeping`)."""
    f32 = any(np.asarray(v).dtype == np.float32 for v in params.values())
    eps, rtol = (FD_F32_EPS, FD_F32_RTOL) if f32 else (FD_EPS, FD_RTOL)
    points = {n: np.asarray(v, dtype=np.float64) for n, v in params.items()}

    def f_of(name):
        dtype = np.asarray(params[name]).dtype

        def g(v):  # FD works in float64; the function gets its own dtype back
            return f({**params, name: v.astype(dtype, copy=False)})
        return g

    fs = {n: f_of(n) for n in params}
    noise = rounding_noise(fs, points, eps, rng) if f32 else 0.0
    g64 = {n: np.asarray(grads[n], dtype=np.float64) for n in params}
    results = [directional_check(fs[n], points[n], g64[n], rng=rng, n_dirs=n_dirs, eps=eps,
                                 rtol=rtol, op=op, tensor=n, noise=noise) for n in params]
    failed = [r for r in results if not r.passed]
    worst = None
    if failed:  # the element-wise check on the worst tensor: its index and both values
        worst = max(failed, key=lambda r: r.error)
        i = results.index(worst)
        worst = results[i] = localise(fs[worst.tensor], points[worst.tensor], g64[worst.tensor],
                                      worst, rng, eps=eps, noise=noise)
    return DictGradcheck(results, "float32" if f32 else "float64", eps, noise, worst)


def gradient_bookkeeping(params: Mapping[str, np.ndarray], grads) -> list[str]:
    """What is wrong with ``grads`` as the gradient of ``params``, one line each: not a dict, a
    missing or an extra key (named), a shape or dtype that is not the parameter's, a
    non-finite entry (its index and value).  Empty when it is well formed."""
    if not isinstance(grads, Mapping):
        return [f"grads: expected a dict keyed like params, got {type(grads).__name__}"]
    out = [f"grads lacks {k!r} (a parameter: its gradient is missing)"
           for k in params if k not in grads]
    out += [f"grads has {k!r}, which is not a parameter" for k in grads if k not in params]
    for k in params:
        if k not in grads:
            continue
        g, p = grads[k], np.asarray(params[k])
        if not isinstance(g, np.ndarray):
            out.append(f"grads[{k!r}]: expected a NumPy array, got {type(g).__name__}")
        elif g.shape != p.shape:
            out.append(f"grads[{k!r}]: shape {g.shape}, expected {p.shape} (the parameter's)")
        elif g.dtype != p.dtype:
            out.append(f"grads[{k!r}]: dtype {g.dtype}, expected {p.dtype} (the parameter's)")
        elif not np.all(np.isfinite(g)):
            idx = tuple(int(i) for i in np.argwhere(~np.isfinite(g))[0])
            out.append(f"grads[{k!r}]: not finite at index {idx}: {g[idx]}")
    return out


# --------------------------------------------------------------------------- whole-model check
def random_params(impl, config, seed: int = 0) -> dict[str, np.ndarray]:
    """float64 parameters away from their initial values: random gamma (not 1), beta and biases
    (not 0), so that a backward that only works at initialisation is caught."""
    return randomized(impl.init_params(config, seed=seed, dtype=np.float64), seed)


def randomized(params: Mapping[str, np.ndarray], seed: int = 0,
               weight_scale: float = 5.0) -> dict[str, np.ndarray]:
    """``params`` (an initialisation, float64) moved away from it: gamma ~ 1 + 0.5 N(0, 1),
    beta and biases (last component ``b`` or ``b_*``) ~ 0.1 N(0, 1), weights scaled by
    ``weight_scale`` (larger than init_std, so attention is not uniform and ReLUs are not all
    ~0)."""
    rng = np.random.default_rng(seed + 1)
    out = {}
    for name, value in params.items():
        leaf = name.rsplit(".", 1)[1]
        if leaf == "gamma":
            out[name] = 1.0 + 0.5 * rng.standard_normal(value.shape)
        elif leaf == "beta" or leaf.startswith("b"):
            out[name] = 0.1 * rng.standard_normal(value.shape)
        else:
            out[name] = value * weight_scale
    return out


def random_batch(config, B: int, T: int, seed: int = 0, *,
                 ignore_index: int = IGNORE_INDEX) -> dict:
    """ids with repeated tokens, a padding mask (later sequences shorter), ~30% predicted
    positions (at least one per sequence, never a padded one), and reconstruction targets."""
    rng = np.random.default_rng(seed + 2)
    vocab = min(config.vocab_size, max(2, T // 2))  # few distinct ids -> repeats guaranteed
    input_ids = rng.integers(0, vocab, size=(B, T))
    lengths = np.array([T - (b * T) // (2 * B) for b in range(B)])  # first row unpadded
    attention_mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)
    predicted = (rng.random((B, T)) < 0.3) & attention_mask.astype(bool)
    predicted[np.arange(B), rng.integers(0, lengths)] = True
    labels = np.where(predicted, rng.integers(0, config.vocab_size, size=(B, T)), ignore_index)
    targets = rng.standard_normal((B, T, config.hidden))
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                 targets=targets)
    if getattr(config, "type_vocab_size", 0):  # sentence pairs: segment 1 from mid-sequence
        batch["token_type_ids"] = ((np.arange(T)[None, :] >= lengths[:, None] // 2)
                                   .astype(np.int64) % config.type_vocab_size)
    if getattr(config, "head", "") == "classifier":
        batch["class_labels"] = rng.integers(0, config.num_labels, size=B)
    return batch


def uneven_mlm_batch(config, B: int = 5, T: int = 6, seed: int = 0, *,
                     ignore_index: int = IGNORE_INDEX) -> dict:
    """A batch whose rows predict very different numbers of tokens -- 1, all T, none, 3, 2 --
    with repeated ids and one padded row: split into micro-batches, the correct accumulation
    (weight by tokens) and the derivation's §8.2 recipe (average the micro-batch means) differ,
    and a micro-batch can have nothing to predict."""
    if not 1 <= B <= 5 or T < 5:
        raise ValueError(f"B, T: expected 1 <= B <= 5 and T >= 5, got B={B}, T={T}")
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 5, size=(B, T))  # few ids -> repeats
    mask = np.ones((B, T), dtype=np.int64)
    if B > 3:
        mask[3, 4:] = 0
    labels = np.full((B, T), ignore_index)
    for b, n in enumerate([1, T, 0, 3, 2][:B]):
        pos = rng.choice(int(mask[b].sum()), size=n, replace=False)
        labels[b, pos] = rng.integers(0, config.vocab_size, size=n)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def loss_kwargs(config, batch: Mapping[str, np.ndarray]) -> dict:
    """The keywords of ``loss`` / ``loss_and_grads`` for a ``random_batch``: its attention mask
    and what the head's loss compares with (token labels, class labels or targets)."""
    kw = dict(attention_mask=batch["attention_mask"])
    if config.head == "mlm":
        kw["labels"] = batch["labels"]
    elif config.head == "classifier":
        kw["labels"] = batch["class_labels"]
    else:
        kw["targets"] = batch["targets"]
    return kw


def split_batch(batch: Mapping[str, np.ndarray], bounds) -> list[dict]:
    """Micro-batches: rows bounds[i]:bounds[i+1] of every array of ``batch``."""
    return [{k: v[a:b] for k, v in batch.items()} for a, b in zip(bounds[:-1], bounds[1:])]


def model_gradcheck(impl, config, *, B: int = 2, T: int = 8, seed: int = 0, n_dirs: int = 2,
                    reduction: str = "mean") -> list[CheckResult]:
    """Directional FD check of every parameter tensor and of the input embeddings of the whole
    model (embeddings -> blocks -> head -> loss), float64, random params and batch."""
    params = random_params(impl, config, seed)
    batch = random_batch(config, B, T, seed)
    kw = dict(loss_kwargs(config, batch), reduction=reduction)
    types = {"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}
    _, grads, d_emb = impl.loss_and_grads(params, config, batch["input_ids"], **kw, **types)
    # FD needs the loss alone: a forward-only path halves the cost of every evaluation
    rng = np.random.default_rng(seed + 3)
    op = f"model[{config.n_layers}L H{config.hidden} A{config.n_heads}]"

    def loss(**p):
        return impl.loss(p, config, batch["input_ids"], **kw, **types)

    results = check_gradients(loss, params, grads, rng=rng, n_dirs=n_dirs, op=op)
    # the input embeddings: feed x directly, bypassing the tables
    x = impl.embed(params, config, batch["input_ids"], **types)

    def loss_x(x):
        return impl.loss(params, config, inputs_embeds=x, **kw)

    results.append(directional_check(loss_x, x, d_emb, rng=rng, n_dirs=n_dirs, op=op,
                                     tensor="input_embeddings"))
    return results

