"""What :mod:`minibert_spec.suite.infer` recognises and records: the names it reads a
forward, a backward and their parameters by, its tolerances, the ops' probes
(:data:`PROBES`, :data:`VARIANT_PROBES`), and the records of a run (:class:`Trial`) and of a
mapping found (:class:`Mapping_`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from minibert_reference.ops import ATTENTION_PARAMS
from minibert_spec.builtin import declarations

FORWARDS = ("forward", "__call__", "call", "fprop", "forward_pass")
BACKWARDS = ("backward", "backprop", "bprop", "backward_pass")
# module-level functions: a forward's name with one of these suffixes or none (``softmax``,
# ``relu_forward``), its backward's the same base with one of these (prefix, suffix)
FORWARD_SUFFIXES = ("_forward", "_fwd", "_fprop", "_forward_pass")
BACKWARD_AFFIXES = (("", "_backward"), ("", "_bwd"), ("", "_bprop"), ("", "_backprop"),
                    ("", "_backward_pass"), ("", "_grad"), ("", "_gradient"),
                    ("", "_derivative"), ("", "_deriv"), ("", "_prime"), ("d_", ""),
                    ("grad_", ""), ("backward_", ""))
# a forward function found without a backward is reported when its name says an op
OP_NAMES = {"linear": ("linear", "dense", "affine"), "layernorm": ("layernorm", "layer_norm"),
            "relu": ("relu",), "gelu": ("gelu",),
            "tanh": ("tanh",), "softmax": ("softmax",),
            "ffn": ("ffn", "feed_forward", "feedforward", "mlp"),
            "embedding": ("embedding", "embed"),
            "sinusoidal_position": ("positional_encoding", "sinusoidal"),
            "position_embedding": ("position_embedding", "pos_embed", "positional_embedding"),
            "cross_entropy": ("cross_entropy", "crossentropy", "xent", "ce_loss", "nll"),
            "linear_cross_entropy": ("linear_cross_entropy", "lm_loss", "lm_head_loss")}
# a backward's parameter names: its cache, the forward's output, the upstream gradient
CACHE_NAMES = re.compile(r"cache\w*|ctx|saved\w*")
OUT_NAMES = re.compile(r"(\w+_)?(out|output|y|p|probs?|a|s|result)")
UPSTREAM_NAMES = re.compile(r"d_?[A-Za-z]\w*|grad\w*|delta\w*|upstream\w*|err\w*")
INPUT_NAMES = ("x", "X", "input", "inputs", "z", "logits")
EPS_NAMES = ("eps", "epsilon")
# the protocol's LayerNorm eps (minibert_reference.layernorm_forward's default)
PROTOCOL_EPS = 1e-12
# the ops with an eps argument, and the protocol's eps of each (the reference's defaults): an
# ``eps``/``epsilon`` argument of a subject is given this one on the probe
NORM_EPS = {"layernorm": PROTOCOL_EPS, "rmsnorm": 1e-6}
# the eps values a norm may fix in its code (0: none), each tried where a forward has no eps
# argument (a LayerNorm: match._declare_eps; a decoder's norms: decoder.py)
FIXED_EPS = (0.0, 1e-12, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3)
# the forward output must equal the reference's to this (float64; a LayerNorm eps of 1e-5
# against the protocol's 1e-12 changes it by ~1e-5 on rows of unit variance)
FORWARD_RTOL = 1e-3
# how deep gradients are looked for: one level below a sub-layer (an FFN's
# linear1.gradients.dLdW), where parameters are found two levels down (linear1.weights)
GRAD_DEPTH = 3


@dataclass(frozen=True, eq=False)
class Probe:
    """An op's probe: the input and parameters (float64, distinct sizes) in the protocol's
    layout, and the sizes a constructor may be given."""

    op: str
    params: tuple[str, ...]  # the protocol's parameters the class may hold
    shapes: Mapping[str, tuple]  # x and each parameter
    sizes: tuple[int, ...]  # the sizes an integer constructor argument may take
    declares: dict = field(default_factory=dict)  # the CAPABILITIES of this form of the op
    # the forward's inputs after x that are not parameters (a loss's labels), in the protocol's
    # order: a class's forward takes them next, positionally; a function right after x or after
    # its parameters (Trial.extra_args)
    extra: tuple[str, ...] = ()
    # the inputs drawn as integers in [0, bound): an embedding's ids (x), a loss's labels
    ints: Mapping[str, int] = field(default_factory=dict)
    # the parameters a subject may lack (biases): its calls with them are then n/a
    optional: tuple[str, ...] = ()
    # the forward's keyword values (attention's n_heads): a constructor argument of that value
    # is that keyword
    scalars: Mapping[str, int] = field(default_factory=dict)
    # the parameters whose gradient must be found for the mapping to stand: a table added to x
    # with no gradient is a fixed buffer (a sinusoidal table), not a learned one
    learned: tuple[str, ...] = ()
    # False: the op is defined on [B, T, H] alone (positions), never tried one rank up
    lift: bool = True

    @property
    def scalar(self) -> bool:
        """A loss: its forward gives one number, its backward may start from dloss = 1."""
        return self.op in SCALAR_OPS


# the ops whose output is one number (the backward may take no upstream gradient)
SCALAR_OPS = ("cross_entropy", "linear_cross_entropy")
# B = 2, T = 3: distinct from every size, so a size found on an axis names that axis alone
PROBES = {
    "linear": Probe("linear", ("W", "b"), {"x": (2, 3, 4), "W": (4, 5), "b": (5,)}, (4, 5),
                    optional=("b",)),
    "layernorm": Probe("layernorm", ("gamma", "beta"),
                       {"x": (2, 3, 6), "gamma": (6,), "beta": (6,)}, (6,)),
    "relu": Probe("relu", (), {"x": (2, 3, 4)}, ()),
    "gelu": Probe("gelu", (), {"x": (2, 3, 4)}, ()),
    "softmax": Probe("softmax", (), {"x": (2, 3, 5)}, ()),
    # H = 4, I = 7: W_1 [H, I] and W_2 [I, H] told apart by shape, each bias by its length
    "ffn": Probe("ffn", ("W_1", "b_1", "W_2", "b_2"),
                 {"x": (2, 3, 4), "W_1": (4, 7), "b_1": (7,), "W_2": (7, 4), "b_2": (4,)},
                 (4, 7)),
    "tanh": Probe("tanh", (), {"x": (2, 3, 4)}, ()),
    # ids [2, 3] of a vocabulary of V = 5 (6 ids: some repeat), W [V, H = 4]
    "embedding": Probe("embedding", ("W",), {"x": (2, 3), "W": (5, 4)}, (5, 4),
                       ints={"x": 5}),
    # x [B, T, H = 8], four heads (d_k = 2): the projections [H, H] told apart by the forward
    # (scores q k^T are not k q^T; W_v and W_o act on different sides of the softmax), the
    # biases [H] each optional
    "attention": Probe("attention", ATTENTION_PARAMS,
                       {"x": (2, 3, 8), **dict.fromkeys(ATTENTION_PARAMS[:4], (8, 8)),
                        **dict.fromkeys(ATTENTION_PARAMS[4:], (8,))}, (8, 4),
                       optional=ATTENTION_PARAMS[4:], scalars={"n_heads": 4}),
    # logits [2, 3, V = 5], labels [2, 3] in [0, V): the mean over every position
    "cross_entropy": Probe("cross_entropy", (), {"x": (2, 3, 5), "labels": (2, 3)}, (),
                           extra=("labels",), ints={"labels": 5}),
    # the LM head fused with its loss: x [2, 3, H = 4], W [H, V = 5] (a class built from (4, 5)
    # is (n_in, V)), b [V] optional, labels [2, 3] in [0, V) -- the shapes in the protocol's
    # order (x, W, b, labels), the labels after the parameters
    "linear_cross_entropy": Probe("linear_cross_entropy", ("W", "b"),
                                  {"x": (2, 3, 4), "W": (4, 5), "b": (5,), "labels": (2, 3)},
                                  (4, 5), extra=("labels",), ints={"labels": 5},
                                  optional=("b",)),
    # x [2, T = 3, H = 4]: a class built from (T, d) is given 3 and 4, each naming its axis of
    # x; before position_embedding, which a fixed table of [T_max, H] would match too
    "sinusoidal_position": Probe("sinusoidal_position", (), {"x": (2, 3, 4)}, (3, 4),
                                 lift=False),
    # W_pos [T_max = 5, H = 4]: more rows than T = 3, so that the unused rows' zero gradient
    # and the slice W_pos[:T] are both exercised
    "position_embedding": Probe("position_embedding", ("W_pos",),
                                {"x": (2, 3, 4), "W_pos": (5, 4)}, (5, 4),
                                learned=("W_pos",), lift=False),
}
# the built-in ops' declared probes and names (spec/builtin/), after the hand-written ones
PROBES.update({d.name: Probe(d.name, **d.probe) for d in declarations() if d.probe is not None})
OP_NAMES.update({d.name: d.aliases for d in declarations() if d.aliases})
# the declared forms tried where a class matches no standard probe of its op
VARIANT_PROBES = {
    "layernorm": Probe("layernorm", (), {"x": (2, 3, 6)}, (6,),
                       {"layernorm": {"affine": False}}),
}
VARIANT_PROBES.update({d.name: Probe(d.name, **d.variant_probe) for d in declarations()
                       if d.variant_probe is not None})


@dataclass
class Mapping_:
    """What was inferred for one op: the class, its construction, layer()'s arguments."""

    op: str
    cls: type | None  # None: module-level functions (``forward``, ``backward``)
    ctor: dict  # constructor argument -> expression of the protocol's arguments
    params: dict = field(default_factory=dict)  # protocol name -> attribute path
    grads: dict = field(default_factory=dict)
    transposed: tuple = ()
    forward: str | Callable = "forward"
    backward: str | Callable = "backward"
    output: int | None = None
    again: tuple = ()
    accumulate: bool = False
    upstream: bool = True  # False: a loss's backward taking no dloss (layer(upstream=False))
    unusable: bool = False  # its backward's call could not be decided: no row
    single_use: bool = False
    ranks: tuple = ()  # the input ranks its forward and backward run on, where not all do
    declares: dict = field(default_factory=dict)  # the op's declared form (CAPABILITIES)
    fixed: dict = field(default_factory=dict)  # the one value of an argument it computes
    evidence: list = field(default_factory=list)
    inputs: tuple = ()  # a forward function's protocol arguments in its own order
    trial: Trial | None = None  # how the probe ran it
    # sinusoidal_position: how the adapter's sinusoidal_encoding gets its table (positions.py)
    encoding: object = None


def _probe_values(probe: Probe, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    vals = {k: rng.integers(0, probe.ints[k], s) if k in probe.ints else rng.standard_normal(s)
            for k, s in probe.shapes.items()}
    if "gamma" in vals:  # gamma away from 1, so gamma and beta cannot be confused
        vals["gamma"] = 1 + 0.5 * vals["gamma"]
    if probe.op == "relu":  # no pre-activation near the kink
        vals["x"] = np.where(np.abs(vals["x"]) < 0.1, 0.5, vals["x"])
    return vals


def deviation(got, want) -> float:
    """max |got - want| / max |want| (the one measure of infer's numeric evidence: a forward
    against the reference's, an optimizer's update, a clipped tensor); inf where the shapes
    differ or ``got`` is not finite."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-300))


def one_line(e: BaseException) -> str:
    """An exception in one line, for an evidence comment or a reason."""
    return f"{type(e).__name__}: {str(e).strip().partition(chr(10))[0]}"


def _reference_forward(op: str, vals: dict, **kwargs):
    """The reference's output on the probe (a parameter it lacks: None, the op's form without
    it), ``kwargs`` to its forward (an eps); all after x by its protocol name."""
    import minibert_reference

    fwd = getattr(minibert_reference, f"{op}_forward")
    probe = PROBES[op]
    return fwd(vals["x"], **{e: vals[e] for e in probe.extra},
               **{p: vals.get(p) for p in probe.params}, **probe.scalars, **kwargs)[0]


@dataclass(frozen=True)
class Trial:
    """One way to run a subject on a probe: arguments ``fixed`` (sizes, the protocol's eps),
    the parameters ``placed`` (param -> attribute path or argument name), some ``transposed``."""

    fixed: dict
    placed: dict
    transposed: tuple
    extra: tuple = ()  # the probe's extra inputs (labels), taken after x
    # a function's arguments taking ``extra`` by keyword, where they follow its parameters
    # (``lm_loss(x, W, b, targets)``); (): positionally, right after x
    extra_args: tuple = ()

    def layout(self, p: str, vals: dict):
        """The probe's parameter ``p`` in the subject's own layout."""
        return vals[p].T.copy() if p in self.transposed else vals[p].copy()
