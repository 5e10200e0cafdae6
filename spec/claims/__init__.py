"""The claims ledger: every numeric claim of the five documents, with the value the project
obtains and a verdict.  One module per document (``minibert``, ``guide``, ``seed001``,
``slides``, ``blog``) registers its claims with :func:`claim`; this module holds the ledger's
machinery (the shared :class:`Context`, the verdict rules, evaluation) and imports them in
that order.  The closed forms the counts come from are ``minibert_spec.costs``'s; the timing claims
measure with ``minibert_spec.claims.timing.claim_timings``.

Each :class:`Claim` restates the claim in our words, cites its source, gives the stated value,
and an ``obtain(ctx)`` that computes the project's value -- from SymPy closed forms in
L, H, A, I, T, V, B evaluated at the preset, cross-checked against the arrays the
implementation actually allocates (``init_params``, the forward cache, the gradients), or from
a measurement -- and derives the verdict from stated vs obtained:

* confirmed: the obtained value, rounded to the precision the document states, equals it;
* refuted: it does not (the correct value is reported);
* convention: the statement is right under one stated reading/convention and not another;
* not reproducible: nothing in the project can produce the value (what was tried is recorded).

``verdict`` is the recorded verdict: a different computed verdict is a regression (timings are
machine-dependent and exempt).  ``pending`` outcomes (code from another part of the project not
present yet) are gaps.

The NumPy-Transformer document's training result is read from ``TRAINING_RESULT`` -- a JSON
file the training code writes (keys: ``final_mse``, ``per_token_error``, ``epochs``,
``command``); absent, the entry is not reproducible and pending.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from minibert_spec.costs import closed_forms
from minibert_spec.paths import RESULTS
from minibert_spec.protocol import IGNORE_INDEX

VERDICTS = ("confirmed", "refuted", "convention", "not reproducible")
TRAINING_RESULT = (RESULTS
                   / "seed001_reconstruction.json")


MB = 1e6  # the documents' MB/KB are decimal (18 MB = 4.5M x 4 bytes)
KB = 1e3


# --------------------------------------------------------------------------- context
class Context:
    """Lazily computed facts about the implementation, shared by the claims."""

    B, T = 8, 64  # the documents' batch for activations and timings

    def __init__(self, impl, *, measure: bool = True, repeats: int = 5, smoke: bool = False,
                 impl_spec: str | None = None):
        """``smoke``: time a tiny model instead (tests check the measuring, not the speed);
        ``repeats``: the timings' rounds (processes per side); ``impl_spec``: the
        ``package.module[:object]`` the timings' child processes import the implementation
        by (found from ``impl`` when it is a module or a module-level object)."""
        self.impl = impl
        self.measure = measure
        self.repeats = repeats
        self.smoke = smoke
        self.impl_spec = impl_spec

    @cached_property
    def config(self):
        return self.impl.mini_bert()

    def value(self, name: str, **overrides) -> int:
        """A closed form evaluated at the Mini-BERT preset (B = 8)."""
        f, s = closed_forms()
        c = self.config
        subs = {s["L"]: c.n_layers, s["H"]: c.hidden, s["A"]: c.n_heads, s["I"]: c.intermediate,
                s["T"]: c.max_len, s["V"]: c.vocab_size, s["B"]: self.B}
        subs.update({s[k]: v for k, v in overrides.items()})
        return int(f[name].subs(subs))

    @cached_property
    def bert_base_sizes(self):
        """The Mini-BERT architecture at BERT-base's sizes (the blog's: 12 layers, H=768, 12
        heads, I=3072, 512 positions; the slides' V=30,522)."""
        return self.impl.mini_bert(n_layers=12, hidden=768, n_heads=12, intermediate=3072,
                                   max_len=512, vocab_size=30522)

    @cached_property
    def params(self) -> dict:
        return self.impl.init_params(self.config, seed=0, dtype=np.float32)

    def count(self, prefix: str = "", *, contains: str = "") -> int:
        return sum(v.size for k, v in self.params.items()
                   if k.startswith(prefix) and contains in k)

    @cached_property
    def batch(self):
        rng = np.random.default_rng(0)
        ids = rng.integers(0, self.config.vocab_size, (self.B, self.T))
        labels = np.where(rng.random((self.B, self.T)) < 0.15, ids, IGNORE_INDEX)
        labels[:, 0] = ids[:, 0]
        return ids, labels

    @cached_property
    def forward(self):
        """(output, cache) of one unsharded forward: the claims read the cache's arrays."""
        from minibert_reference import parallel

        ids, _ = self.batch
        with parallel.workers(1):
            return self.impl.forward(self.params, self.config, ids)

    @cached_property
    def cache_arrays(self) -> list[np.ndarray]:
        """Every distinct buffer the forward cache holds for the backward (parameters and
        their views excluded), counted once even if several views share it."""
        param_ids = {id(_root(p)) for p in self.params.values()}
        seen, out = set(), []

        def walk(obj):
            if isinstance(obj, np.ndarray):
                root = _root(obj)
                if id(root) not in seen and id(root) not in param_ids:
                    seen.add(id(root))
                    out.append(root)
            elif isinstance(obj, (tuple, list)):
                for o in obj:
                    walk(o)
            elif isinstance(obj, dict):
                for o in obj.values():
                    walk(o)

        walk(self.forward[1])
        return out

    @cached_property
    def grads(self) -> dict:
        """Gradients of a small batch (their arrays do not depend on the batch size)."""
        ids, labels = self.batch
        _, grads, _ = self.impl.loss_and_grads(self.params, self.config, ids[:1, :4],
                                               labels=labels[:1, :4])
        return grads

    @cached_property
    def timings(self) -> dict:
        """The timing claims' medians (ms), measured by minibert_spec.claims.timing.claim_timings
        (the
        bench's harness: each side alone in its own process); sets ``repeats_done``."""
        from minibert_spec.claims.timing import claim_timings

        return claim_timings(self)


def claim_sides(job: dict, side: str):
    """What a child process of the timing claims times
    (``minibert_spec.claims.timing.CLAIMS_TASK``):
    (fns, before) of ``side`` on a fresh :class:`Context` of the implementation the job names."""
    from minibert_spec.claims.timing import claim_side_fns
    from minibert_spec.protocol import load_impl

    ctx = Context(load_impl(job["impl"]), smoke=bool(job.get("smoke")))
    return claim_side_fns(ctx, side)


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


# --------------------------------------------------------------------------- verdict rules
def rounds_to(obtained: float, stated: float, unit: float = 1.0) -> bool:
    """obtained / unit, rounded to as many decimals as ``stated`` shows, equals ``stated``."""
    text = repr(float(stated))
    decimals = 0 if float(stated).is_integer() else len(text.split(".")[1])
    return round(obtained / unit, decimals) == round(float(stated), decimals)


def by_rounding(obtained: float, stated: float, unit: float = 1.0) -> str:
    return "confirmed" if rounds_to(obtained, stated, unit) else "refuted"


# timing claims ("~20 ms"): machine-dependent; confirmed within this factor either way
TIMING_FACTOR = 1.5


# --------------------------------------------------------------------------- ledger
@dataclass
class Result:
    obtained: str
    verdict: str
    detail: str = ""
    pending: str = ""  # non-empty: the value needs code not present yet (a gap)


@dataclass
class Claim:
    id: str
    claim: str
    source: str
    stated: str
    obtain: Callable[[Context], Result]
    verdict: str  # recorded
    machine_dependent: bool = False
    needs_measure: bool = False

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict: expected one of {VERDICTS}, got {self.verdict!r}")


@dataclass
class Outcome:
    id: str
    claim: str
    source: str
    stated: str
    obtained: str
    verdict: str
    recorded: str
    detail: str
    pending: str
    machine_dependent: bool

    @property
    def regression(self) -> str:
        if self.machine_dependent or self.pending or self.verdict == self.recorded:
            return ""
        return f"verdict {self.verdict}, recorded {self.recorded}"

    @property
    def gap(self) -> str:
        return f"pending: {self.pending}" if self.pending else ""

    @property
    def status(self) -> str:
        """One word for the entry's colour: regression, gap (pending), or the verdict."""
        return "regression" if self.regression else "gap" if self.gap else self.verdict

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("id", "claim", "source", "stated", "obtained",
                                              "verdict", "recorded", "detail", "pending",
                                              "machine_dependent", "status")}


CLAIMS: dict[str, Claim] = {}


def claim(id, text, source, stated, verdict, **kw):
    def register(fn):
        if id in CLAIMS:
            raise ValueError(f"id: claim {id!r} registered twice")
        CLAIMS[id] = Claim(id, text, source, stated, fn, verdict, **kw)
        return fn
    return register


def exact_correspondence(document: str) -> Result:
    """A document's claim that all its equations are implemented exactly: how many of the
    equation entries citing it hold (their recorded SymPy verdicts)."""
    from minibert_spec.equations import load
    eqs = [e for e in load().values() if any(s.startswith(document) for s in e.sources)]
    wrong = [e.id for e in eqs if e.expected == "refuted"]
    return Result(f"{len(eqs) - len(wrong)}/{len(eqs)} entries hold",
                  "refuted" if wrong else "confirmed", f"refuted: {', '.join(wrong)} (the "
                  "equations' recorded verdicts, each verified by its SymPy check)")


def fmt_int(n) -> str:
    return f"{n:,}"


# --------------------------------------------------------------------------- evaluation
def evaluate(c: Claim, ctx: Context) -> Outcome:
    try:
        r = c.obtain(ctx)
    except Exception as e:  # noqa: BLE001 -- reported as a refutation with the error
        r = Result("error", "refuted", f"{type(e).__name__}: {e}")
    if r.verdict not in VERDICTS:
        r = Result(r.obtained, "refuted", f"invalid verdict {r.verdict!r}")
    return Outcome(c.id, c.claim, c.source, c.stated, r.obtained, r.verdict, c.verdict, r.detail,
                   r.pending, c.machine_dependent)


def evaluate_all(impl, *, measure: bool = True, repeats: int = 5,
                 impl_spec: str | None = None) -> list[Outcome]:
    ctx = Context(impl, measure=measure, repeats=repeats, impl_spec=impl_spec)
    return [evaluate(c, ctx) for c in CLAIMS.values()]


# the claims of each document, registered in this order (the ledger's order)
DOCUMENT_MODULES = ("minibert", "guide", "seed001", "slides", "blog")
for _name in DOCUMENT_MODULES:
    importlib.import_module(f"{__name__}.{_name}")
