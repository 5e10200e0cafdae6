"""Bad input gets a ValueError that names the offending argument (never an IndexError from deep
inside NumPy, a silent broadcast or a silent cast).  Kind ``bad_input``: ``minibert check``
runs these with ``--bad-input`` (the protocol asks for named errors, but a research
implementation may not validate; the column says whether it does)."""

from __future__ import annotations

import functools
import re
import sys

import numpy as np

from minibert_reference.config import mini_bert, seed001
from minibert_spec.builtin import declarations
from minibert_spec.numerics.asserts import raises as _raises
from minibert_spec.protocol import IGNORE_INDEX, OPS, NotApplicable, capabilities
from minibert_spec.protocol.variants import unmet
from minibert_spec.suite import strategies as S
from minibert_spec.suite.registry import check

rng = np.random.default_rng(0)
B, T, H, A, I, V = 2, 3, 4, 2, 5, 6
X = rng.standard_normal((B, T, H))
W = rng.standard_normal((H, H))
VEC = rng.standard_normal(H)
IDS = np.array([[0, 1, 1], [5, 0, 2]])
# softmax rows with a 0 (at label 2 of the first row)
P_ZERO = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])


def f32(a):
    return a.astype(np.float32)


def with_nan(a):
    a = a.copy()
    a.flat[-1] = np.nan
    return a


def with_inf(a):
    a = a.copy()
    a.flat[0] = -np.inf
    return a


def raises(arg):
    """The block raises ValueError whose message starts with the argument's name."""
    return _raises(ValueError, match=rf"^{arg}(?!\w)")


def ffn_args():
    return (X, rng.standard_normal((H, I)), rng.standard_normal(I), rng.standard_normal((I, H)),
            rng.standard_normal(H))


def block_params(bias=True):
    p = {f"attn.{n}": W.copy() for n in ("W_q", "W_k", "W_v", "W_o")}
    if bias:
        p.update({f"attn.{n}": VEC.copy() for n in ("b_q", "b_k", "b_v", "b_o")})
    x, W_1, b_1, W_2, b_2 = ffn_args()
    p.update({"ffn.W_1": W_1, "ffn.b_1": b_1, "ffn.W_2": W_2, "ffn.b_2": b_2})
    p.update({"ln1.gamma": VEC + 1, "ln1.beta": VEC, "ln2.gamma": VEC - 1, "ln2.beta": VEC})
    return p


# --------------------------------------------------------------------------- op forwards
# (label, arg named in the message, call(impl))
FORWARD_CASES = [
    # embedding
    ("embedding ids >= V", "ids", lambda m: m.embedding_forward(IDS, rng.standard_normal((5, H)))),
    ("embedding ids < 0", "ids", lambda m: m.embedding_forward(-IDS, rng.standard_normal((V, H)))),
    ("embedding float ids", "ids", lambda m: m.embedding_forward(IDS * 1.0, W)),
    ("embedding list ids", "ids", lambda m: m.embedding_forward(IDS.tolist(), W)),
    ("embedding W rank 1", "W", lambda m: m.embedding_forward(IDS, VEC)),
    ("embedding W int", "W", lambda m: m.embedding_forward(IDS, np.ones((V, H), int))),
    ("embedding W nan", "W", lambda m: m.embedding_forward(IDS, with_nan(np.ones((V, H))))),
    # position embeddings
    ("position T > rows", "x", lambda m: m.position_embedding_forward(X, np.ones((T - 1, H)))),
    ("position H mismatch", "W_pos", lambda m: m.position_embedding_forward(X, np.ones((T, 3)))),
    ("position x rank 2", "x", lambda m: m.position_embedding_forward(X[0], np.ones((T, H)))),
    ("position dtypes", "W_pos", lambda m: m.position_embedding_forward(X, f32(np.ones((T, H))))),
    ("position inf", "W_pos", lambda m: m.position_embedding_forward(X, with_inf(np.ones((T, H))))),
    ("sinusoidal x rank 2", "x", lambda m: m.sinusoidal_position_forward(X[0])),
    ("sinusoidal nan", "x", lambda m: m.sinusoidal_position_forward(with_nan(X))),
    ("sinusoidal T=0", "T", lambda m: m.sinusoidal_encoding(0, H)),
    # linear
    ("linear W shape", "W", lambda m: m.linear_forward(X, np.ones((H + 1, 2)))),
    ("linear b shape", "b", lambda m: m.linear_forward(X, W, np.ones(H + 1))),
    ("linear x int", "x", lambda m: m.linear_forward(np.ones((B, H), int), W)),
    ("linear W float32", "W", lambda m: m.linear_forward(X, f32(W))),
    ("linear b float32", "b", lambda m: m.linear_forward(X, W, f32(VEC))),
    ("linear x nan", "x", lambda m: m.linear_forward(with_nan(X), W)),
    ("linear W inf", "W", lambda m: m.linear_forward(X, with_inf(W))),
    ("linear x scalar", "x", lambda m: m.linear_forward(np.float64(1.0) * np.ones(()), W)),
    # layernorm
    ("layernorm gamma shape", "gamma", lambda m: m.layernorm_forward(X, np.ones(H + 1), VEC)),
    ("layernorm beta shape", "beta", lambda m: m.layernorm_forward(X, VEC, np.ones((1, H)))),
    ("layernorm gamma f32", "gamma", lambda m: m.layernorm_forward(X, f32(VEC), VEC)),
    ("layernorm x f32", "gamma", lambda m: m.layernorm_forward(f32(X), VEC, f32(VEC))),
    ("layernorm x nan", "x", lambda m: m.layernorm_forward(with_nan(X), VEC, VEC)),
    ("layernorm eps < 0", "eps", lambda m: m.layernorm_forward(X, VEC, VEC, -1e-5)),
    ("layernorm eps nan", "eps", lambda m: m.layernorm_forward(X, VEC, VEC, float("nan"))),
    ("layernorm empty", "x", lambda m: m.layernorm_forward(np.ones((B, 0)), np.ones(0),
                                                            np.ones(0))),
    # softmax
    ("softmax mask shape", "mask", lambda m: m.softmax_forward(X, np.ones((B, T), bool))),
    ("softmax mask float", "mask", lambda m: m.softmax_forward(X, np.ones(X.shape))),
    ("softmax mask 0/1/2", "mask", lambda m: m.softmax_forward(X, np.full(X.shape, 2))),
    ("softmax all-masked row", "mask",
     lambda m: m.softmax_forward(X, np.arange(H) < np.array([[1, 0, 2]]).T[None])),
    ("softmax x int", "x", lambda m: m.softmax_forward(np.ones((2, 3), int))),
    ("softmax x inf", "x", lambda m: m.softmax_forward(with_inf(X))),
    ("softmax empty row", "x", lambda m: m.softmax_forward(np.ones((2, 0)))),
    # relu / tanh
    ("relu int", "x", lambda m: m.relu_forward(np.ones(3, int))),
    ("relu nan", "x", lambda m: m.relu_forward(with_nan(X))),
    ("tanh list", "x", lambda m: m.tanh_forward([1.0, 2.0])),
    ("tanh inf", "x", lambda m: m.tanh_forward(with_inf(X))),
    # split / merge heads
    ("split_heads H % A", "n_heads", lambda m: m.split_heads(X, 3)),
    ("split_heads rank", "x", lambda m: m.split_heads(X[0], 2)),
    ("merge_heads rank", "x", lambda m: m.merge_heads(X)),
    # attention
    ("attention H % A", "n_heads", lambda m: m.attention_forward(X, W, W, W, W, n_heads=3)),
    ("attention n_heads 0", "n_heads", lambda m: m.attention_forward(X, W, W, W, W, n_heads=0)),
    ("attention x rank 2", "x", lambda m: m.attention_forward(X[0], W, W, W, W, n_heads=A)),
    ("attention W_k shape", "W_k",
     lambda m: m.attention_forward(X, W, W[:, :2], W, W, n_heads=A)),
    ("attention W_o f32", "W_o", lambda m: m.attention_forward(X, W, W, W, f32(W), n_heads=A)),
    ("attention W_v nan", "W_v",
     lambda m: m.attention_forward(X, W, W, with_nan(W), W, n_heads=A)),
    ("attention b_q shape", "b_q",
     lambda m: m.attention_forward(X, W, W, W, W, VEC[:3], n_heads=A)),
    ("attention b_k f32", "b_k",
     lambda m: m.attention_forward(X, W, W, W, W, VEC, f32(VEC), n_heads=A)),
    ("attention b_o inf", "b_o",
     lambda m: m.attention_forward(X, W, W, W, W, b_o=with_inf(VEC), n_heads=A)),
    # an output bias with no output projection to add it to (n/a without attention.W_o False)
    ("attention b_o without W_o", "b_o",
     lambda m: m.attention_forward(X, W, W, W, None, b_o=VEC, n_heads=A)),
    ("attention mask shape", "mask",
     lambda m: m.attention_forward(X, W, W, W, W, n_heads=A, mask=np.ones((B, T + 1), bool))),
    ("attention mask [B,T,T]", "mask",
     lambda m: m.attention_forward(X, W, W, W, W, n_heads=A, mask=np.ones((B, T, T), bool))),
    ("attention mask float", "mask",
     lambda m: m.attention_forward(X, W, W, W, W, n_heads=A, mask=np.ones((B, T)))),
    ("attention all-masked row", "mask",
     lambda m: m.attention_forward(X, W, W, W, W, n_heads=A, mask=np.array([[1, 0, 1],
                                                                           [0, 0, 0]]))),
    # ffn
    ("ffn W_1 shape", "W_1",
     lambda m: m.ffn_forward(X, *((np.ones((H + 1, I)),) + ffn_args()[2:]))),
    ("ffn b_1 shape", "b_1",
     lambda m: m.ffn_forward(X, ffn_args()[1], np.ones(I + 1), *ffn_args()[3:])),
    ("ffn W_2 shape", "W_2",
     lambda m: m.ffn_forward(X, *ffn_args()[1:3], np.ones((I, H + 1)), ffn_args()[4])),
    ("ffn b_2 f32", "b_2", lambda m: m.ffn_forward(*ffn_args()[:4], f32(ffn_args()[4]))),
    ("ffn x nan", "x", lambda m: m.ffn_forward(with_nan(X), *ffn_args()[1:])),
    # block
    ("block missing key", "p", lambda m: m.block_forward(
        X, {k: v for k, v in block_params().items() if k != "ln1.gamma"}, n_heads=A)),
    ("block extra key", "p", lambda m: m.block_forward(
        X, {**block_params(), "ln3.gamma": VEC}, n_heads=A)),
    ("block partial biases", "p", lambda m: m.block_forward(
        X, {k: v for k, v in block_params().items() if k != "attn.b_v"}, n_heads=A)),
    ("block not a dict", "p", lambda m: m.block_forward(X, list(block_params().values()),
                                                        n_heads=A)),
    ("block H % A", "n_heads", lambda m: m.block_forward(X, block_params(), n_heads=3)),
    ("block all-masked row", "mask", lambda m: m.block_forward(
        X, block_params(), n_heads=A, mask=np.array([[0, 0, 0], [1, 1, 1]]))),
    ("block gamma nan", r"gamma", lambda m: m.block_forward(
        X, {**block_params(), "ln2.gamma": with_nan(VEC)}, n_heads=A)),
    # pooler
    ("pooler T = 0", "h", lambda m: m.pooler_forward(np.ones((B, 0, H)), W, VEC)),
    ("pooler h rank 2", "h", lambda m: m.pooler_forward(X[:, 0], W, VEC)),
    ("pooler W shape", "W", lambda m: m.pooler_forward(X, W[:2], VEC)),
    ("pooler b f32", "b", lambda m: m.pooler_forward(X, W, f32(VEC))),
    # losses
    ("ce bad reduction", "reduction",
     lambda m: m.cross_entropy_forward(X, np.zeros((B, T), int), reduction="max")),
    ("ce mean, nothing predicted", "labels",
     lambda m: m.cross_entropy_forward(X, np.full((B, T), -100))),
    ("ce label >= V", "labels", lambda m: m.cross_entropy_forward(X, np.full((B, T), H))),
    ("ce label < 0 (not ignore)", "labels",
     lambda m: m.cross_entropy_forward(X, np.full((B, T), -1))),
    ("ce labels shape", "labels", lambda m: m.cross_entropy_forward(X, np.zeros((B, T + 1), int))),
    ("ce float labels", "labels", lambda m: m.cross_entropy_forward(X, np.zeros((B, T)))),
    ("ce logits nan", "logits",
     lambda m: m.cross_entropy_forward(with_nan(X), np.zeros((B, T), int))),
    # a probability of 0 at a label: -log 0 (n/a without the cross_entropy.input form)
    *[(f"ce {form} zero", "logits", lambda m, form=form: m.cross_entropy_forward(
        P_ZERO, np.array([2, 0]), input=form))
      for form in ("probabilities", "probabilities_dlogits")],
    ("mse shape", "y", lambda m: m.mse_forward(X, X[:, :2])),
    ("mse broadcast", "y", lambda m: m.mse_forward(X, X[:1])),
    ("mse dtypes", "y", lambda m: m.mse_forward(X, f32(X))),
    ("mse inf", "y_hat", lambda m: m.mse_forward(with_inf(X), X)),
]


# the op of a forward case: its label's first word
_PREFIX_OPS = {"position": "position_embedding", "sinusoidal": "sinusoidal_position",
               "split_heads": "heads", "merge_heads": "heads", "ce": "cross_entropy"}


def _slug(label: str) -> str:
    """The label as the property of an id: comparisons in words, other marks dropped."""
    for mark, word in ((">=", " ge "), (">", " gt "), ("<", " lt "), ("=", " eq "),
                       ("%", " mod ")):
        label = label.replace(mark, word)
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_")


def _declared_forward_cases():
    """(op, label, arg, call(impl)) of each built-in op's declared bad inputs (spec/builtin/),
    their calls handed this module's arrays."""
    this = sys.modules[__name__]
    return [(d.name, label, arg, functools.partial(call, b=this))
            for d in declarations() for label, arg, call in d.bad_inputs]


def _forward_cases():
    """``<op>.<what>`` for the label "<op word> <what>" (split_heads / merge_heads keep their
    function's name: both are the heads op); a declared case names its op."""
    out = []
    for op, label, arg, call in ([(None, *case) for case in FORWARD_CASES]
                                 + _declared_forward_cases()):
        first, rest = label.split(maxsplit=1)
        op = op or _PREFIX_OPS.get(first, first)
        what = _slug(label if first in ("split_heads", "merge_heads") else rest)
        out.append((f"{op}.{what}", {"arg": arg, "call": call, "op": op}))
    return out


@check("bad_input", "", cases=_forward_cases(), ops=lambda kw: (kw["op"],))
def forward_rejects_bad_input(impl, arg, call, op):
    """A ValueError whose message starts with the offending argument's name."""
    with raises(arg):
        call(impl)


@check("invariant", "cross_entropy.sum_of_nothing_is_zero", ops=("cross_entropy",),
       equations=("loss.ce.sum",))
def sum_cross_entropy_with_nothing_predicted_is_zero(impl):
    """Not an error: a sum over no predicted position is 0 (only the mean is undefined)."""
    loss, cache = impl.cross_entropy_forward(X, np.full((B, T), IGNORE_INDEX), reduction="sum")
    assert loss == 0, f"summed loss over no predicted position: {loss!r}, expected 0"
    (d,) = impl.cross_entropy_backward(0.5, cache)
    assert np.all(d == 0), "gradient of a sum over no predicted position is not 0"


# --------------------------------------------------------------------------- every op pair
# Drawn from the op's case families: the first whose variant the implementation declares, on its
# fixed-seed case -- so an op added with its case family gets these checks with no code here.
def _pair_ops() -> list[str]:
    return [op for op, row in OPS.items() if row.pair and any(f.op == op for f in S.families())]


def _fixed_case(impl, op):
    """(forward, backward, case) of the op's first case family the implementation declares."""
    caps = capabilities(impl)
    for family in S.families():
        if family.op == op and not unmet(caps, dict(family.needs)):
            for case in family.examples(caps):
                return (*family.bind(impl), case)
    raise NotApplicable(f"not applicable: {impl._impl_label} declares no form of {op} with a "
                        "fixed-seed case")


def _scalar_output(op: str) -> bool:
    """The op's output is a scalar (a loss): its backward takes dloss."""
    default = capabilities(type("Defaults", (), {})())
    family = next(f for f in S.families() if f.op == op)
    return not isinstance(family.examples(default)[0].dout, np.ndarray)


BAD_UPSTREAM = {
    "wrong shape": lambda d: d[..., :-1] if d.shape[-1] > 1 else d[:1, None],
    "extra axis": lambda d: d[None],
    "broadcastable": lambda d: d[:1],
    "float32": f32,
    "int": lambda d: d.astype(int),
    "nan": with_nan,
    "inf": with_inf,
    "list": lambda d: d.tolist(),
}
_BAD_DLOSS = [("vector", np.ones(2)), ("nan", np.nan), ("inf", np.inf), ("str", "1.0"),
              ("none", None)]


def _upstream_cases():
    out = []
    for op in _pair_ops():
        if _scalar_output(op):  # a loss: dloss, a finite real scalar
            out += [(f"{op}.dloss_{name}", {"op": op, "bad": lambda d, b=bad: b,
                                            "named": "dloss"}) for name, bad in _BAD_DLOSS]
        else:
            out += [(f"{op}.dout_{_slug(name)}", {"op": op, "bad": BAD_UPSTREAM[name],
                                                  "named": r"d\w*"})
                    for name in sorted(BAD_UPSTREAM)]
    return out


@check("bad_input", "", cases=_upstream_cases(), ops=lambda kw: (kw["op"],))
def backward_rejects_bad_upstream(impl, op, bad, named):
    """The backward refuses a malformed upstream gradient naming it (d..., dloss for a loss),
    after accepting the good one."""
    forward, backward, case = _fixed_case(impl, op)
    _, cache = forward(**case.inputs, **case.fixed)
    backward(case.dout, cache)  # the good upstream is accepted
    _, cache = forward(**case.inputs, **case.fixed)
    with raises(named):
        backward(bad(case.dout), cache)


def _input_cases():
    default = capabilities(type("Defaults", (), {})())
    out = []
    for op in _pair_ops():
        family = next(f for f in S.families() if f.op == op)
        names = [n for n, v in family.examples(default)[0].inputs.items()
                 if isinstance(v, np.ndarray) and "." not in n]
        out += [(f"{op}.{n}_not_finite", {"op": op, "arg": n}) for n in names]
    return out


@check("bad_input", "", cases=_input_cases(), ops=lambda kw: (kw["op"],))
def forward_rejects_a_non_finite_input(impl, op, arg):
    """Each differentiable input holding a NaN is refused, naming it."""
    forward, _, case = _fixed_case(impl, op)
    with raises(arg):
        forward(**{**case.inputs, arg: with_nan(case.inputs[arg])}, **case.fixed)


# --------------------------------------------------------------------------- model
def _model(impl, preset):
    config = {"mini_bert": mini_bert, "seed001": seed001}[preset](
        n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=4, vocab_size=11)
    return config, impl.init_params(config, seed=0, dtype=np.float64)


def _model_kw(config):
    return ({"labels": np.array([[1, IGNORE_INDEX, 3], [IGNORE_INDEX, 2, IGNORE_INDEX]])}
            if config.head == "mlm"
            else {"targets": np.zeros((B, T, config.hidden))})


MODEL_CASES = [
    ("ids >= V", "input_ids", lambda c, p: dict(input_ids=np.full((B, T), c.vocab_size))),
    ("ids < 0", "input_ids", lambda c, p: dict(input_ids=np.full((B, T), -1))),
    ("ids float", "input_ids", lambda c, p: dict(input_ids=np.zeros((B, T)))),
    ("ids rank 1", "input_ids", lambda c, p: dict(input_ids=np.zeros(T, int))),
    ("ids rank 3", "input_ids", lambda c, p: dict(input_ids=np.zeros((B, T, 1), int))),
    ("T > max_len", "input_ids",
     lambda c, p: dict(input_ids=np.zeros((B, c.max_len + 1), int))),
    ("T = 0", "input_ids", lambda c, p: dict(input_ids=np.zeros((B, 0), int))),
    ("embeds T > max_len", "inputs_embeds",
     lambda c, p: dict(input_ids=None, inputs_embeds=np.zeros((B, c.max_len + 1, c.hidden)))),
    ("embeds wrong H", "inputs_embeds",
     lambda c, p: dict(input_ids=None, inputs_embeds=np.zeros((B, T, c.hidden + 1)))),
    ("embeds float32", "inputs_embeds",
     lambda c, p: dict(input_ids=None, inputs_embeds=np.zeros((B, T, c.hidden), np.float32))),
    ("embeds nan", "inputs_embeds",
     lambda c, p: dict(input_ids=None, inputs_embeds=with_nan(np.zeros((B, T, c.hidden))))),
    ("both ids and embeds", "input_ids",
     lambda c, p: dict(inputs_embeds=np.zeros((B, T, c.hidden)))),
    ("neither ids nor embeds", "input_ids", lambda c, p: dict(input_ids=None)),
    ("mask shape", "attention_mask", lambda c, p: dict(attention_mask=np.ones((B, T + 1), int))),
    ("mask float", "attention_mask", lambda c, p: dict(attention_mask=np.ones((B, T)))),
    ("mask values", "attention_mask", lambda c, p: dict(attention_mask=np.full((B, T), 3))),
    ("all-masked sequence", "attention_mask",
     lambda c, p: dict(attention_mask=np.array([[1, 1, 0], [0, 0, 0]]))),
    ("params missing key", "params",
     lambda c, p: dict(params={k: v for k, v in p.items() if k != "layers.0.ln1.beta"})),
    ("params extra key", "params", lambda c, p: dict(params={**p, "layers.1.ln1.beta": VEC})),
    ("params not a dict", "params", lambda c, p: dict(params=list(p.values()))),
    ("params wrong shape", r"params\['layers.0.ffn.W_1'\]",
     lambda c, p: dict(params={**p, "layers.0.ffn.W_1": p["layers.0.ffn.W_1"].T.copy()})),
    ("params mixed dtypes", r"params\['layers.0.ln2.gamma'\]",
     lambda c, p: dict(params={**p, "layers.0.ln2.gamma": f32(p["layers.0.ln2.gamma"])})),
    ("params int", r"params\['embeddings.token.W'\]",
     lambda c, p: dict(params={**p, "embeddings.token.W": p["embeddings.token.W"].astype(int)})),
    ("params nan", r"params\['layers.0.attn.W_v'\]",
     lambda c, p: dict(params={**p, "layers.0.attn.W_v": with_nan(p["layers.0.attn.W_v"])})),
    ("params inf", r"params\['layers.0.ln1.gamma'\]",
     lambda c, p: dict(params={**p, "layers.0.ln1.gamma": with_inf(p["layers.0.ln1.gamma"])})),
    ("bad reduction", "reduction", lambda c, p: dict(reduction="avg")),
]
MLM_CASES = [
    ("mean CE, nothing predicted", "labels", lambda c, p: dict(labels=np.full((B, T), -100))),
    ("labels >= V", "labels", lambda c, p: dict(labels=np.full((B, T), c.vocab_size))),
    ("labels shape", "labels", lambda c, p: dict(labels=np.zeros((B, T + 1), int))),
    ("labels missing", "labels", lambda c, p: dict(labels=None)),
]
NONE_HEAD_CASES = [
    ("targets shape", "targets", lambda c, p: dict(targets=np.zeros((B, T, c.hidden - 1)))),
    ("targets float32", "targets", lambda c, p: dict(targets=np.zeros((B, T, c.hidden),
                                                                      np.float32))),
    ("targets nan", "targets", lambda c, p: dict(targets=with_nan(np.zeros((B, T, c.hidden))))),
    ("targets missing", "targets", lambda c, p: dict(targets=None)),
]


def _model_cases():
    out = []
    for preset in ("mini_bert", "seed001"):
        extra = MLM_CASES if preset == "mini_bert" else NONE_HEAD_CASES
        for label, arg, make in MODEL_CASES + extra:
            out.append((f"model.{_slug(label)}-{preset}",
                        {"preset": preset, "arg": arg, "make": make}))
    return out


@check("bad_input", "", cases=_model_cases(), ops=("model",))
def model_rejects_bad_input(impl, preset, arg, make):
    """loss_and_grads (and forward, for its own arguments) refuse bad input naming it."""
    config, params = _model(impl, preset)
    kw = dict(params=params, input_ids=IDS % config.vocab_size,
              attention_mask=np.array([[1, 1, 1], [1, 1, 0]]), **_model_kw(config))
    impl.loss_and_grads(kw.pop("params"), config, **kw)  # the unmodified call is fine
    kw = {**dict(params=params, input_ids=IDS % config.vocab_size,
                 attention_mask=np.array([[1, 1, 1], [1, 1, 0]]), **_model_kw(config)),
          **make(config, params)}
    params_arg = kw.pop("params")
    with raises(arg):
        impl.loss_and_grads(params_arg, config, **kw)
    if arg not in ("labels", "targets", "reduction"):  # the forward alone rejects it too
        fwd = {k: kw[k] for k in ("input_ids", "attention_mask", "inputs_embeds") if k in kw}
        with raises(arg):
            impl.forward(params_arg, config, fwd.pop("input_ids", None),
                         fwd.pop("attention_mask", None), **fwd)


@check("bad_input", "model.dout", ops=("model",))
def model_backward_rejects_bad_upstream(impl):
    """The model's backward refuses a malformed upstream gradient naming dout."""
    config, params = _model(impl, "mini_bert")
    out, cache = impl.forward(params, config, IDS % config.vocab_size)
    for bad in (out[:, :1], f32(out), with_nan(out), out[..., None]):
        with raises("dout"):
            impl.backward(bad, cache)


@check("bad_input", "", cases=[(f"model.init_params_dtype_{np.dtype(d).name}", {"dtype": d})
                               for d in (np.int32, np.float16, "complex128")], ops=("model",))
def init_params_rejects_non_float_dtypes(impl, dtype):
    """init_params takes float32 or float64 only, naming dtype."""
    with raises("dtype"):
        impl.init_params(mini_bert(n_layers=1, hidden=8, intermediate=8, vocab_size=5),
                         dtype=dtype)


# --------------------------------------------------------------------------- optimizer
@check("bad_input", "adam.mismatched_grads", ops=("adam",))
def adam_rejects_mismatched_grads(impl):
    """adam_step names a missing gradient, a gradient of another dtype, a negative lr."""
    from minibert_spec.suite.checks.optim import _grads, _params

    params = _params()
    g = _grads(0)
    del g["mlm.b"]
    with _raises(ValueError, match="grads.*missing.*mlm.b"):
        impl.adam_step(params, g, impl.adam_init(params), lr=0.1)
    g = _grads(0)
    g["mlm.b"] = g["mlm.b"].astype(np.float32)
    with _raises(ValueError, match=r"grads\['mlm.b'\].*dtype"):
        impl.adam_step(params, g, impl.adam_init(params), lr=0.1)
    with _raises(ValueError, match="lr"):
        impl.adam_step(params, _grads(0), impl.adam_init(params), lr=-1.0)


@check("bad_input", "schedule.total_not_after_warmup", ops=("schedule",))
def schedule_rejects_total_steps_within_warmup(impl):
    """total_steps <= warmup_steps leaves no decay phase: refused, naming total_steps."""
    with _raises(ValueError, match="total_steps"):
        impl.warmup_linear_lr(0, peak_lr=1e-3, warmup_steps=5, total_steps=5)


@check("bad_input", "clip.zero_max_norm", ops=("clip",))
def clip_rejects_a_zero_max_norm(impl):
    """max_norm <= 0 is refused, naming it."""
    from minibert_spec.suite.checks.optim import _grads

    with _raises(ValueError, match="max_norm"):
        impl.clip_by_global_norm(_grads(0), 0.0)


@check("bad_input", "accumulation.nothing_predicted", ops=("accumulation",))
def accumulation_rejects_a_batch_without_masked_tokens(impl):
    """A logical batch that predicts nothing (mean undefined) and an empty list are refused,
    naming micro_batches."""
    from minibert_spec.numerics.finite_differences import (
        random_params,
        split_batch,
        uneven_mlm_batch,
    )
    from minibert_spec.suite.checks.model import TINY

    params = random_params(impl, TINY, seed=0)
    b = uneven_mlm_batch(TINY, seed=0)
    with _raises(ValueError, match="micro_batches.*ignore_index"):
        impl.accumulate_gradients(impl, params, TINY, split_batch(b, [2, 3]))
    with _raises(ValueError, match="micro_batches"):
        impl.accumulate_gradients(impl, params, TINY, [])
