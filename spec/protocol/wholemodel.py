"""A whole model under test, whatever its architecture: the function the user already has,
``loss_and_grads(params, batch...) -> (loss, grads)`` (or a ``forward`` / ``backward`` pair),
and the parameters to check it at.  The suite's ``whole_model`` row
(minibert_spec.suite.checks.wholemodel) judges it by finite differences of the loss in each
parameter tensor; nothing here knows an architecture -- the batch is drawn from the shapes the
parameters imply (the vocabulary from the token table, the longest sequence from a position
table) and the names of the function's arguments, or from a one-line declaration.

Declared::

    MODEL = whole_model(loss_and_grads, init_params(seed=0))        # (params, ids, targets)
    MODEL = whole_model(step, params, batch={"batch": {"x": "ids", "y": "labels"}})

or, for ``minibert check mymodel:loss_and_grads``, a bare function: the parameters are its
module's ``params`` (a dict of arrays) or ``init_params()`` (called without arguments).
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Mapping

import numpy as np

from minibert_spec.protocol.table import OPS

# What a batch entry holds, by kind: token ids [B, T] in [0, V); labels [B, T] in [0, V) (the
# targets of a language-model loss); a key padding mask [B, T] of 0/1 (int64, 1 = a real
# token, the first row unpadded).
KINDS = ("ids", "labels", "mask")
# The argument names each kind is told by (lower case), when the batch is not declared.
KIND_NAMES = {
    "ids": ("ids", "input_ids", "idx", "tokens", "token_ids", "x", "inputs", "input", "xb"),
    "labels": ("labels", "targets", "target", "y", "target_ids", "yb", "next_ids"),
    "mask": ("mask", "attention_mask", "key_mask", "padding_mask", "attn_mask", "pad_mask"),
}
# The token table (its rows are the vocabulary) and the position table (its rows the longest
# sequence), told by their parameter names: 2-D tensors only.
VOCAB_TABLE = re.compile(r"wte|tok|word|vocab|emb", re.I)
NOT_VOCAB = re.compile(r"pos|wpe|type|seg", re.I)
POSITION_TABLE = re.compile(r"pos|wpe", re.I)
# The longest sequence drawn when no position table bounds it (RoPE, sinusoids, none).
DEFAULT_MAX_LEN = 8

# Which op rows a disagreeing parameter points at, by its name (first match wins): the
# whole-model verdict's "look next at" (a backward bug upstream of a tensor makes its gradient
# wrong too: the verdict names the rows of the *last* tensor in params order that disagrees).
LOOK_NEXT = (
    (re.compile(r"rope|rotary|freq", re.I), ("rope",)),
    (re.compile(r"attn|attention|q_proj|k_proj|v_proj|o_proj|qkv|\bw_?[qkvo]\b|(^|\W)w[qkvo]"
                r"($|\W)", re.I), ("attention", "rope", "softmax")),
    (re.compile(r"ln|norm|rms", re.I), ("layernorm", "rmsnorm")),
    (re.compile(r"wpe|pos", re.I), ("position_embedding", "embedding")),
    (re.compile(r"wte|emb|tok|word", re.I), ("embedding", "tied_embedding")),
    (re.compile(r"mlp|ffn|fc|w_?[123]\b|up|down|gate", re.I),
     ("linear", "gelu", "relu", "swiglu", "ffn")),
    (re.compile(r"head|lm|out|logit|cls|dec", re.I),
     ("linear", "cross_entropy", "next_token_cross_entropy")),
)
_unknown = sorted({op for _, ops in LOOK_NEXT for op in ops} - set(OPS))
if _unknown:
    raise ValueError(f"LOOK_NEXT names ops that are not rows of the op table: {_unknown}")


def look_next(tensor: str) -> tuple[str, ...]:
    """The op rows a disagreeing parameter named ``tensor`` points at (empty: no hint)."""
    for pattern, ops in LOOK_NEXT:
        if pattern.search(tensor):
            return ops
    return ()


def _kind_of(name: str) -> str | None:
    low = name.lower()
    return next((k for k, names in KIND_NAMES.items() if low in names), None)


def _check_kinds(where: str, value) -> None:
    """A declared batch entry: a kind, or a dict / tuple of kinds (an argument holding a dict
    or a tuple of arrays)."""
    if isinstance(value, str):
        if value not in KINDS:
            raise ValueError(f"batch: {where}: expected one of {list(KINDS)}, got {value!r}")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_kinds(f"{where}[{k!r}]", v)
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            _check_kinds(f"{where}[{i}]", v)
    else:
        raise ValueError(f"batch: {where}: expected a kind ({', '.join(KINDS)}), a dict or a "
                         f"tuple of kinds, got {type(value).__name__}")


def batch_of(fn: Callable, declared: Mapping | None, what: str) -> dict:
    """The batch arguments of ``fn`` (after its first, the params): ``declared`` checked
    against its signature, else told by their names (:data:`KIND_NAMES`); a required argument
    neither tells is a ValueError naming it and the line that declares it."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    params = list(sig.parameters.values())[1:] if sig is not None else []
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if declared is not None:
        if not isinstance(declared, Mapping) or not declared:
            raise ValueError(f"batch: expected a dict of {what}'s batch arguments -> kinds, got "
                             f"{declared!r}")
        takes_any = sig is None or any(p.kind == p.VAR_KEYWORD for p in params)
        for arg, value in declared.items():
            if not takes_any and arg not in names:
                raise ValueError(f"batch: {what} has no argument {arg!r} (its arguments after "
                                 f"the params: {names})")
            _check_kinds(repr(arg), value)
        return dict(declared)
    out = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kind = _kind_of(p.name)
        if kind is not None:
            out[p.name] = kind
        elif p.default is p.empty:
            raise ValueError(
                f"batch: cannot tell what {what}'s argument {p.name!r} holds: declare it in a "
                f"line, whole_model({what}, params, batch={{{p.name!r}: 'ids'}}) (kinds "
                f"{', '.join(KINDS)}; a dict or tuple of them for an argument holding several)")
    if not any(_leaves(v) for v in out.values()):
        raise ValueError(f"batch: {what} takes no token ids (an argument named one of "
                         f"{list(KIND_NAMES['ids'][:4])}...): declare its batch, "
                         f"whole_model({what}, params, batch={{'ids': 'ids'}})")
    return out


def _leaves(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    values = value.values() if isinstance(value, Mapping) else value
    return [k for v in values for k in _leaves(v)]


class WholeModel:
    """A whole model under test: a function of (params, batch) giving (loss, grads), the
    params to check it at, and the batch its arguments take.

    loss_and_grads: ``f(params, **batch) -> (loss, grads)``, grads keyed like params
    forward / backward: instead, ``forward(params, **batch) -> (loss, cache)`` and
                    ``backward(cache)`` or ``backward(dloss, cache) -> grads``
    params:         a dict of NumPy arrays (float64, or float32 for float32-only code)
    batch:          {argument: kind} (kinds: "ids", "labels", "mask"; a dict or tuple of kinds
                    for an argument holding several); default: told by the argument names
    vocab, max_len: the vocabulary and longest sequence, where the params do not tell them
    """

    def __init__(self, loss_and_grads: Callable | None = None, params: Mapping | None = None,
                 *, forward: Callable | None = None, backward: Callable | None = None,
                 batch: Mapping | None = None, vocab: int | None = None,
                 max_len: int | None = None, name: str | None = None):
        if (loss_and_grads is None) == (forward is None):
            raise ValueError("whole_model: expected loss_and_grads, or forward and backward "
                             f"(got loss_and_grads={_name(loss_and_grads)}, "
                             f"forward={_name(forward)})")
        if forward is not None and backward is None:
            raise ValueError("backward: expected the backward of forward, got None")
        for arg, fn in (("loss_and_grads", loss_and_grads), ("forward", forward),
                        ("backward", backward)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{arg}: expected a function, got {type(fn).__name__}")
        if not isinstance(params, Mapping) or not params:
            got = "{}" if isinstance(params, Mapping) else type(params).__name__
            raise ValueError(f"params: expected a non-empty dict of NumPy arrays, got {got}")
        bad = [k for k, v in params.items() if not isinstance(v, np.ndarray)
               or v.dtype not in (np.float32, np.float64)]
        if bad:
            v = params[bad[0]]
            raise ValueError(f"params[{bad[0]!r}]: expected a float32 or float64 NumPy array, "
                             f"got {getattr(v, 'dtype', type(v).__name__)}")
        self._fn, self._forward, self._backward = loss_and_grads, forward, backward
        main = loss_and_grads or forward
        self.name = name or _name(main)
        self.params = {k: np.array(v) for k, v in params.items()}  # the caller's stay theirs
        self.batch_args = batch_of(main, batch, self.name)
        self.vocab = _positive("vocab", vocab) or self._implied_vocab()
        self.max_len = _positive("max_len", max_len) or self._implied_max_len()

    def __repr__(self) -> str:
        return f"whole_model({self.name}, {len(self.params)} tensors)"

    @property
    def __name__(self) -> str:  # the label of the implementation (minibert_spec.protocol)
        return self.name

    def _implied_vocab(self) -> int:
        for name, v in self.params.items():
            if v.ndim == 2 and VOCAB_TABLE.search(name) and not NOT_VOCAB.search(name):
                return int(v.shape[0])
        raise ValueError(f"vocab: no token table among the params of {self.name} (a 2-D tensor "
                         "named like wte, tok, word or emb): declare it, whole_model(..., "
                         "vocab=V)")

    def _implied_max_len(self) -> int:
        for name, v in self.params.items():
            if v.ndim == 2 and POSITION_TABLE.search(name):
                return int(v.shape[0])
        return DEFAULT_MAX_LEN

    # ------------------------------------------------------------------ the protocol names
    def whole_model_loss_and_grads(self, params, batch: Mapping, dloss: float = 1.0):
        """(loss, grads) of the model at ``params`` on ``batch`` (the keyword arguments of the
        user's function).  A forward / backward pair gets the upstream gradient ``dloss`` and
        its gradients are divided by it (a backward that ignores its upstream is then wrong)."""
        if self._fn is not None:
            return self._fn(params, **batch)
        loss, cache = self._forward(params, **batch)
        if _required_positional(self._backward) >= 2:
            grads = self._backward(dloss, cache)
            if isinstance(grads, Mapping):
                grads = {k: g / dloss if isinstance(g, np.ndarray) else g
                         for k, g in grads.items()}
            return loss, grads
        return loss, self._backward(cache)

    def whole_model_loss(self, params, batch: Mapping) -> float:
        """The loss alone (the forward alone where there is one: finite differences need
        nothing else)."""
        out = self._forward(params, **batch) if self._forward is not None \
            else self._fn(params, **batch)
        return out[0]

    # ------------------------------------------------------------------ batches
    def draw_batch(self, B: int, T: int, rng: np.random.Generator) -> dict:
        """A batch of B sequences of T tokens (T capped at the longest the params allow) in
        the form the function's arguments take."""
        T = max(1, min(T, self.max_len))
        lengths = np.concatenate([[T], rng.integers(1, T + 1, size=B - 1)])
        mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.int64)

        def make(kind):
            if isinstance(kind, str):
                if kind == "mask":
                    return mask.copy()
                return rng.integers(0, self.vocab, size=(B, T)).astype(np.int64)
            if isinstance(kind, Mapping):
                return {k: make(v) for k, v in kind.items()}
            return tuple(make(v) for v in kind)

        return {arg: make(kind) for arg, kind in self.batch_args.items()}


def _positive(arg: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{arg}: expected a positive integer, got {value!r}")
    return int(value)


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or repr(fn) if fn is not None else "None"


def _required_positional(fn) -> int:
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
               for p in ps)


def whole_model(loss_and_grads: Callable | None = None, params: Mapping | None = None,
                **kwargs) -> WholeModel:
    """Declare a whole model under test (:class:`WholeModel`): ``minibert check mod:MODEL``,
    ``parametrize_with_checks(MODEL)`` and ``check_implementation(MODEL)`` judge it."""
    return WholeModel(loss_and_grads, params, **kwargs)


def declaration(obj) -> WholeModel | None:
    """The whole model ``obj`` declares: itself, or its ``WHOLE_MODEL`` (a module or object that
    also provides op pairs: the ``whole_model`` row beside its op rows); else None."""
    if isinstance(obj, WholeModel):
        return obj
    found = getattr(obj, "WHOLE_MODEL", None)
    return found if isinstance(found, WholeModel) else None


def implementation(obj):
    """``obj`` as an implementation: a bare function (``minibert check mymodel:loss_and_grads``)
    becomes a :class:`WholeModel` at its module's ``params`` or ``init_params()``; anything
    else is returned as it is.  A ValueError in one line when the function's params or batch
    cannot be told."""
    if not inspect.isfunction(obj):
        return obj
    what = obj.__name__
    module = sys.modules.get(obj.__module__)
    params = getattr(module, "params", None)
    if not isinstance(params, Mapping):
        init = getattr(module, "init_params", None)
        if callable(init) and _required_positional(init) == 0:
            params = init()
    if not isinstance(params, Mapping):
        raise ValueError(f"{obj.__module__} has no params to check {what} at: define params "
                         "(a dict of arrays) or init_params() there, or check a declaration "
                         f"MODEL = whole_model({what}, params)")
    return WholeModel(obj, params)
