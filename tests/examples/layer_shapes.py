"""Small class-style layers and optimizers in every shape real code has, each put under test by
``minibert_spec.suite.adapters.layer`` / ``optimizer`` declared in a word or two -- in a correct and
a buggy version (``build(shape, buggy)``; tests/suite/test_layer_shapes.py).

Layers:

* ``dict_grads``: ``backward`` returns ``(dx, {"weight": dW, "bias": db})``;
* ``sequential``: an FFN as ``Sequential([Linear, ReLU, Linear])``: paths ``layers[0].W``;
* ``heads_list``: attention over a list of heads: paths ``heads[*].W_q`` (one slice per head);
* ``again``: ``ReLU.backward(x, dy)`` needs the forward's input again;
* ``again_loss``: ``CrossEntropyLoss.backward(p, labels)``: its inputs again, no upstream;
* ``tuple_output``: ``forward`` returns ``(y, cache)``, a function ``backward(dy, cache)``;
* ``transposed``: an embedding stored ``[d, V]``;
* ``per_position``: a loss returning per-position losses (declared ``reduction: none``);
* ``optional_bias``: a bias reached through a sub-object that is ``None`` without a bias;
* ``single_use``: a layer that frees its activations after backward (declared: the
  accumulation check is n/a, saying why);
* ``functions``: no class, a notebook's module functions ``softmax(x)`` /
  ``softmax_backward(dp, p)`` (``layer(op, None, forward=..., backward=...)``, the output
  needed again);
* ``transposed_returned``: a torch-style Linear ``[out, in]`` whose backward *returns* ``(dx,
  dW, db)``, dW in its own layout (read back transposed, as an attribute would be);
* ``block_entries``: a post-LN block class holding its sub-layers, its ``p`` mapped entry by
  entry (``"attn.W_q": "attn.W_q"``, ``"ffn.W_1": "ffn.layers[0].W"``) and the call's eps set
  on both LayerNorms (``"eps": ("ln1.eps", "ln2.eps")``);
* ``block_parts``: the same block mapped by its sub-layers' own declarations (``parts={"attn":
  ("attn", attention_forward), ...}``).

Optimizers (the ``adam`` row):

* ``owns_params``: an Adam owning its parameters, ``step(grads)``;
* ``parameter_grad``: ``step()`` reading each ``Parameter.grad``;
* ``bound_model``: an Adam bound to a model (and a loss), ``step()``;
* ``per_name``: a trainer's per-name update method ``update(param, grad, name)``.

Each buggy version has one realistic bug in code its op alone uses.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from minibert_spec.suite.adapters import layer, optimizer
from tests.examples import realstyle_tutorial as rt


# ============================================================================ layers
class _XW:
    """y = x W + b with the input kept for the backward."""

    def __init__(self, W, b, buggy=False):
        self.W, self.b, self.buggy = W, b, buggy

    def forward(self, x):
        self.x = x
        return x @ self.W + (0 if self.b is None else self.b)


class DictLinear(_XW):
    """y = x W + b; backward returns (dx, {"weight": dW, "bias": db})."""

    def backward(self, dy):
        n, m = self.W.shape
        x2, dy2 = self.x.reshape(-1, n), dy.reshape(-1, m)
        grads = {"weight": x2.T @ dy2}
        if self.b is not None:  # bug: the bias gradient averaged over the rows
            grads["bias"] = dy2.mean(0) if self.buggy else dy2.sum(0)
        return dy @ self.W.T, grads


class Linear:
    def __init__(self, n_in, n_out):
        self.W, self.b = np.zeros((n_in, n_out)), np.zeros(n_out)

    def forward(self, x):
        self.x = x
        return x @ self.W + self.b

    def backward(self, dy):
        n, m = self.W.shape
        self.dW = self.x.reshape(-1, n).T @ dy.reshape(-1, m)
        self.db = dy.reshape(-1, m).sum(0)
        return dy @ self.W.T


class ReLU:
    def __init__(self, buggy=False):
        self.buggy = buggy

    def forward(self, x):
        self.x = x
        return np.maximum(x, 0)

    def backward(self, dy):  # bug: the mask taken from dy instead of the input
        return dy * ((dy if self.buggy else self.x) > 0)


class Sequential:
    def __init__(self, layers):
        self.layers = layers

    def forward(self, x):
        for lay in self.layers:
            x = lay.forward(x)
        return x

    def backward(self, d):
        for lay in reversed(self.layers):
            d = lay.backward(d)
        return d


class Head:
    """One attention head: W_q, W_k, W_v [H, d], no biases."""

    def __init__(self, buggy=False):
        self.buggy = buggy

    def forward(self, x):
        self.x = x
        self.q, self.k, self.v = x @ self.W_q, x @ self.W_k, x @ self.W_v
        self.scale = x.dtype.type(1.0 / np.sqrt(self.W_q.shape[1]))
        s = self.q @ self.k.transpose(0, 2, 1) * self.scale
        e = np.exp(s - s.max(-1, keepdims=True))
        self.p = e / e.sum(-1, keepdims=True)
        return self.p @ self.v

    def backward(self, dc):
        dv = self.p.transpose(0, 2, 1) @ dc
        dp = dc @ self.v.transpose(0, 2, 1)
        ds = self.p * (dp - (self.p * dp).sum(-1, keepdims=True)) * self.scale
        dq, dk = ds @ self.k, ds.transpose(0, 2, 1) @ self.q
        H = self.x.shape[-1]
        x2 = self.x.reshape(-1, H)
        # bug: the key gradient takes the query's projection
        self.dW_q, self.dW_k, self.dW_v = (x2.T @ d.reshape(x2.shape[0], -1) for d in (dq, dk, dv))
        W_k = self.W_q if self.buggy else self.W_k
        return dq @ self.W_q.T + dk @ W_k.T + dv @ self.W_v.T


class MultiHead:
    """Heads in a list, their outputs concatenated; no output projection."""

    def __init__(self, n_heads, buggy=False):
        self.heads = [Head(buggy) for _ in range(n_heads)]

    def forward(self, x):
        return np.concatenate([h.forward(x) for h in self.heads], -1)

    def backward(self, dy):
        d = dy.shape[-1] // len(self.heads)
        return sum(h.backward(dy[..., a * d:(a + 1) * d]) for a, h in enumerate(self.heads))


class ReLUAgain:
    """ReLU whose backward takes the input again: backward(x, dy)."""

    def __init__(self, buggy=False):
        self.buggy = buggy

    def forward(self, x):
        return np.maximum(x, 0)

    def backward(self, x, dy):  # bug: the gradient of |x| instead of relu
        return dy * np.sign(x) if self.buggy else dy * (x > 0)


class CrossEntropyLoss:
    """Mean -log p[label] of softmax output p; backward(p, labels) -> the logit gradient of
    softmax + CE (p - onehot) / N, for a loss of 1."""

    def __init__(self, buggy=False):
        self.buggy = buggy

    def forward(self, p, labels):
        picked = np.take_along_axis(p, labels[..., None], -1)[..., 0]
        return -np.log(picked).sum() / p.dtype.type(labels.size)

    def backward(self, p, labels):
        d = p.copy()
        np.put_along_axis(d, labels[..., None], np.take_along_axis(d, labels[..., None], -1) - 1,
                          -1)
        n = labels.shape[0] if self.buggy else labels.size  # bug: the rows of the first axis
        return d / d.dtype.type(n)


class TupleLayerNorm:
    """forward returns (y, cache); the backward is a free function (backward(dy, cache))."""

    def __init__(self, gamma, beta, eps):
        self.gamma, self.beta, self.eps = gamma, beta, eps

    def forward(self, x):
        mu = x.mean(-1, keepdims=True)
        rstd = 1.0 / np.sqrt(x.var(-1, keepdims=True) + x.dtype.type(self.eps))
        x_hat = (x - mu) * rstd
        return self.gamma * x_hat + self.beta, (x_hat, rstd, self.gamma)


def layernorm_backward(dy, cache, buggy=False):
    x_hat, rstd, gamma = cache
    H = dy.shape[-1]
    g = dy if buggy else dy * gamma  # bug: gamma pulled outside the means
    dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
    return (gamma * dx if buggy else dx, (dy * x_hat).reshape(-1, H).sum(0),
            dy.reshape(-1, H).sum(0))


class EmbeddingDV:
    """An embedding stored [d, V] (column v is token v's vector)."""

    def __init__(self, W, buggy=False):
        self.W, self.buggy = W, buggy

    def forward(self, ids):
        self.ids = ids
        return self.W[:, ids].transpose(*range(1, ids.ndim + 1), 0)

    def backward(self, dout):
        d = dout.reshape(-1, self.W.shape[0])
        self.dW = np.zeros_like(self.W)
        if self.buggy:  # bug: assignment, so a repeated id keeps only its last position
            self.dW[:, self.ids.reshape(-1)] = d.T
        else:
            np.add.at(self.dW.T, self.ids.reshape(-1), d)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def softmax_backward(dp, p, buggy=False):  # bug: the row sum of dp, not of dp * p
    return p * (dp - (dp if buggy else dp * p).sum(-1, keepdims=True))


class ReturningTorchLinear:
    """y = x W^T + b with W [out, in]; backward returns (dx, dW [out, in], db)."""

    def __init__(self, n_in, n_out, buggy=False):
        self.weight, self.bias, self.buggy = np.zeros((n_out, n_in)), np.zeros(n_out), buggy

    def forward(self, x):
        self.x = x
        return x @ self.weight.T + self.bias

    def backward(self, dy):
        n_out, n_in = self.weight.shape
        x2, dy2 = self.x.reshape(-1, n_in), dy.reshape(-1, n_out)
        dW = dy2.T @ x2  # [out, in]
        if self.buggy:  # bug: only the first row's outer product
            dW = np.outer(dy2[0], x2[0]) * x2.shape[0]
        return dy @ self.weight, dW, dy2.sum(0)


class PerPositionCE:
    """Cross-entropy of logits returning one loss per position (no reduction); ignored
    positions (ignore_index) get 0.  backward(dloss [positions]) -> dlogits."""

    def __init__(self, ignore_index=-100, buggy=False):
        self.ignore_index, self.buggy = ignore_index, buggy

    def forward(self, logits, labels):
        z = logits - logits.max(-1, keepdims=True)
        self.logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        self.keep = labels != self.ignore_index
        self.safe = np.where(self.keep, labels, 0)
        picked = np.take_along_axis(self.logp, self.safe[..., None], -1)[..., 0]
        return -picked * self.keep

    def backward(self, dloss):
        d = np.exp(self.logp)
        np.put_along_axis(d, self.safe[..., None],
                          np.take_along_axis(d, self.safe[..., None], -1) - 1, -1)
        if self.buggy:  # bug: the upstream weights ignored (as if each position's were 1)
            dloss = np.ones_like(dloss)
        return d * (dloss * self.keep)[..., None].astype(d.dtype)


class Param:
    def __init__(self, value):
        self.value, self.grad = value, np.zeros_like(value)


class ParamLinear:
    """Parameters are objects with .value and .grad; no bias object at all without a bias."""

    def __init__(self, n_in, n_out, bias=True, buggy=False):
        self.W = Param(np.zeros((n_in, n_out)))
        self.b = Param(np.zeros(n_out)) if bias else None
        self.buggy = buggy

    def forward(self, x):
        self.x = x
        return x @ self.W.value + (0 if self.b is None else self.b.value)

    def backward(self, dy):
        n, m = self.W.value.shape
        x2 = self.x.reshape(-1, n)
        self.W.grad = x2.T @ dy.reshape(-1, m)
        if self.b is not None:
            self.b.grad = dy.reshape(-1, m).sum(0)
        W = self.W.value
        return dy @ (W.T * 0.5 if self.buggy else W.T)  # bug: a stray factor on dx


class FreeingLinear(_XW):
    """y = x W + b that frees its input after the backward (one backward per forward)."""

    def backward(self, dy):
        n, m = self.W.shape
        x, d = (self.x[:1], dy[:1]) if self.buggy else (self.x, dy)  # bug: the first row only
        self.dW = x.reshape(-1, n).T @ d.reshape(-1, m)
        self.db = None if self.b is None else dy.reshape(-1, m).sum(0)
        del self.x  # the activation is freed: a second backward fails
        return dy @ self.W.T


class PostLNBlock:
    """LN2(h + FFN(h)), h = LN1(x + MHA(x)), its sub-layers built empty (the adapter sets their
    parameters): the tutorial's attention (no biases) and LayerNorm, an FFN as a Sequential."""

    def __init__(self, n_heads, buggy=False):
        self.attn = rt.MultiHeadAttention(None, None, None, None, n_heads)
        self.ln1, self.ln2 = rt.LayerNorm(None, None), rt.LayerNorm(None, None)
        self.ffn = Sequential([Linear(0, 0), ReLU(), Linear(0, 0)])
        self.buggy = buggy

    def forward(self, x):
        h = self.ln1.forward(x + self.attn.forward(x))
        return self.ln2.forward(h + self.ffn.forward(h))

    def backward(self, dy):
        dh = self.ln2.backward(dy)
        dh = dh + self.ffn.backward(dh)
        dr = self.ln1.backward(dh)  # bug: the residual's gradient dropped around the attention
        return self.attn.backward(dr) + (0 if self.buggy else dr)


# ============================================================================ optimizers
def _adam_update(p, g, m, v, t, lr, b1, b2, eps):
    """One bias-corrected Adam update, in place; returns the new moments."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p -= (lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)).astype(p.dtype)
    return m, v


class OwningAdam:
    """Owns its parameters (a dict); step(grads) updates them in place."""

    def __init__(self, params, buggy=False):
        self.params, self.buggy = params, buggy
        self.lr, self.b1, self.b2, self.eps, self.t = 1e-3, 0.9, 0.999, 1e-8, 0
        self.m = {k: np.zeros_like(p) for k, p in params.items()}
        self.v = {k: np.zeros_like(p) for k, p in params.items()}

    def step(self, grads):
        self.t += 1
        eps = self.eps ** 2 if self.buggy else self.eps  # bug: eps inside the square root
        for k, g in grads.items():
            if self.buggy:
                self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
                self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
                m_hat, v_hat = self.m[k] / (1 - self.b1 ** self.t), \
                    self.v[k] / (1 - self.b2 ** self.t)
                self.params[k] -= self.lr * m_hat / np.sqrt(v_hat + eps)
            else:
                self.m[k], self.v[k] = _adam_update(self.params[k], g, self.m[k], self.v[k],
                                                    self.t, self.lr, self.b1, self.b2, eps)


class ParamAdam:
    """Over Parameter objects (``.data``, ``.grad``); step() reads each one's gradient."""

    class Parameter:
        def __init__(self, data):
            self.data, self.grad = data, np.zeros_like(data)

    def __init__(self, parameters, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, buggy=False):
        self.parameters, self.lr, self.b1, self.b2, self.eps = parameters, lr, b1, b2, eps
        self.mom1 = [np.zeros_like(p.data) for p in parameters]
        self.mom2 = [np.zeros_like(p.data) for p in parameters]
        self.t, self.buggy = 0, buggy

    def step(self):
        self.t += 1
        b2 = self.b1 if self.buggy else self.b2  # bug: beta1 in the second moment's decay
        for i, p in enumerate(self.parameters):
            self.mom1[i], self.mom2[i] = _adam_update(p.data, p.grad, self.mom1[i],
                                                      self.mom2[i], self.t, self.lr, self.b1,
                                                      b2, self.eps)


class BoundAdam:
    """Bound to a model (and a loss it never reads here): step() updates model.params from
    model.grads."""

    def __init__(self, model, loss=None, buggy=False):
        self.model, self.loss, self.buggy = model, loss, buggy
        self.lr, self.beta1, self.beta2, self.eps, self.t = 1e-3, 0.9, 0.999, 1e-8, 0
        self.m = {k: np.zeros_like(p) for k, p in model.params.items()}
        self.v = {k: np.zeros_like(p) for k, p in model.params.items()}

    def step(self):
        self.t += 1
        for k, p in self.model.params.items():
            g = self.model.grads[k]
            self.m[k] = self.beta1 * self.m[k] + (1 - self.beta1) * g
            self.v[k] = self.beta2 * self.v[k] + (1 - self.beta2) * g * g
            m_hat = self.m[k] if self.buggy else self.m[k] / (1 - self.beta1 ** self.t)
            v_hat = self.v[k] / (1 - self.beta2 ** self.t)  # bug above: m not bias-corrected
            p -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


class Trainer:
    """A trainer's per-name Adam update (the step counter advanced by its own step loop)."""

    def __init__(self, params, buggy=False):
        self.lr, self.beta1, self.beta2, self.eps, self.t = 1e-3, 0.9, 0.999, 1e-8, 0
        self.m, self.v, self.buggy = {}, {}, buggy

    def update(self, param, grad, name):
        if self.buggy:  # bug: the counter advanced per tensor, not per step
            self.t += 1
        m, v = self.m.get(name, np.zeros_like(param)), self.v.get(name, np.zeros_like(param))
        self.m[name], self.v[name] = _adam_update(param, grad, m, v, self.t, self.lr,
                                                  self.beta1, self.beta2, self.eps)


# ============================================================================ the adapters
HYPER = {"lr": "lr", "beta1": "b1", "beta2": "b2", "eps": "eps"}


def _ops(op, fwd, bwd, caps=None):
    names = {"cross_entropy": "cross_entropy", "attention": "attention"}.get(op, op)
    out = {f"{names}_forward": fwd, f"{names}_backward": bwd}
    if caps:
        out["CAPABILITIES"] = caps
    return out


ATTN = ("W_q", "W_k", "W_v", "W_o")
FFN = {"W_1": "layers[0].W", "b_1": "layers[0].b", "W_2": "layers[2].W", "b_2": "layers[2].b"}
BLOCK_CAPS = {"attention_bias": False, "key_mask": False}


def _block_parts(bug):
    """The block's sub-layers declared as ops of their own, then the block from them."""
    attention, _ = layer("attention", lambda n_heads: rt.MultiHeadAttention(
        None, None, None, None, n_heads), params={w: w for w in ATTN},
        grads={w: f"d{w}" for w in ATTN})
    norm, _ = layer("layernorm", lambda eps: rt.LayerNorm(None, None, eps),
                    params={"gamma": "gamma", "beta": "beta"},
                    grads={"gamma": "dgamma", "beta": "dbeta"})
    ffn, _ = layer("ffn", lambda: Sequential([Linear(0, 0), ReLU(), Linear(0, 0)]), params=FFN,
                   grads={k: v[:-1] + "d" + v[-1] for k, v in FFN.items()})
    return layer("block", lambda n_heads: PostLNBlock(n_heads, bug),
                 params={"eps": ("ln1.eps", "ln2.eps")},
                 parts={"attn": ("attn", attention), "ffn": ("ffn", ffn), "ln1": ("ln1", norm),
                        "ln2": ("ln2", norm)})


def _block_entries(bug, accumulate=False):
    """The block's p mapped entry by entry (``accumulate``: as declared, whatever the class
    does; its sub-layers replace their gradients)."""
    lns = {f"ln{i}.{g}": f"ln{i}.{g}" for i in (1, 2) for g in ("gamma", "beta")}
    return layer("block", lambda n_heads: PostLNBlock(n_heads, bug), accumulate=accumulate,
                 params={**{f"attn.{w}": f"attn.{w}" for w in ATTN}, **lns,
                         **{f"ffn.{k}": f"ffn.{v}" for k, v in FFN.items()},
                         "eps": ("ln1.eps", "ln2.eps")},
                 grads={**{f"attn.{w}": f"attn.d{w}" for w in ATTN},
                        **{k: f"{v[:4]}d{v[4:]}" for k, v in lns.items()},
                        **{f"ffn.{k}": f"ffn.{v[:-1]}d{v[-1]}" for k, v in FFN.items()}})


def _layers(bug):
    return {
        "block_entries": lambda: _ops("block", *_block_entries(bug), BLOCK_CAPS),
        "block_parts": lambda: _ops("block", *_block_parts(bug), BLOCK_CAPS),
        "dict_grads": lambda: _ops("linear", *layer(
            "linear", lambda W, b: DictLinear(W, b, bug),
            grads={"W": "return[1].weight", "b": "return[1].bias"})),
        "sequential": lambda: _ops("ffn", *layer(
            "ffn", lambda W_1, W_2: Sequential([Linear(*W_1.shape), ReLU(bug), Linear(*W_2.shape)]),
            params={"W_1": "layers[0].W", "b_1": "layers[0].b", "W_2": "layers[2].W",
                    "b_2": "layers[2].b"},
            grads={"W_1": "layers[0].dW", "b_1": "layers[0].db", "W_2": "layers[2].dW",
                   "b_2": "layers[2].db"})),
        "heads_list": lambda: _ops("attention", *layer(
            "attention", lambda n_heads: MultiHead(n_heads, bug),
            params={w: f"heads[*].{w}" for w in ("W_q", "W_k", "W_v")},
            grads={w: f"heads[*].d{w}" for w in ("W_q", "W_k", "W_v")}),
            {"attention_bias": False, "key_mask": False,
             "attention": {"W_o": False, "heads": "per_head"}}),
        "again": lambda: _ops("relu", *layer("relu", lambda: ReLUAgain(bug), again=("x",))),
        "again_loss": lambda: _ops("cross_entropy", *layer(
            "cross_entropy", lambda: CrossEntropyLoss(bug), inputs=("logits", "labels"),
            again=("logits", "labels"), upstream=False),
            {"cross_entropy": {"input": "probabilities_dlogits", "ignore_index": False,
                               "reduction": "mean"}}),
        "tuple_output": lambda: _ops("layernorm", *layer(
            "layernorm", TupleLayerNorm, output=0, again=("dout", "forward[1]"),
            backward=lambda dy, cache: layernorm_backward(dy, cache, bug))),
        "transposed": lambda: _ops("embedding", *layer(
            "embedding", lambda W: EmbeddingDV(W, bug), inputs=("ids",), transposed=("W",),
            grads={"W": "dW"})),
        "per_position": lambda: _ops("cross_entropy", *layer(
            "cross_entropy", lambda ignore_index: PerPositionCE(ignore_index, bug),
            inputs=("logits", "labels")), {"cross_entropy": {"reduction": "none"}}),
        "optional_bias": lambda: _ops("linear", *layer(
            "linear", lambda W, b: ParamLinear(*W.shape, bias=b is not None, buggy=bug),
            params={"W": "W.value", "b": "b.value"}, grads={"W": "W.grad", "b": "b.grad"})),
        "single_use": lambda: _ops("linear", *layer(
            "linear", lambda W, b: FreeingLinear(W, b, bug), grads={"W": "dW", "b": "db"},
            single_use=True)),
        "functions": lambda: _ops("softmax", *layer(
            "softmax", None, forward=softmax, again=("dout", "out"),
            backward=lambda dp, p: softmax_backward(dp, p, bug))),
        "transposed_returned": lambda: _ops("linear", *layer(
            "linear", lambda W: ReturningTorchLinear(W.shape[0], W.shape[1], bug),
            params={"W": "weight", "b": "bias"}, grads={"W": "return[1]", "b": "return[2]"},
            transposed=("W",))),
    }


def _optimizers(bug):
    return {
        "owns_params": lambda: dict(zip(("adam_init", "adam_step"), optimizer(
            lambda ps: OwningAdam(ps, bug), hyper=HYPER, m="m", v="v", params="params"))),
        "parameter_grad": lambda: dict(zip(("adam_init", "adam_step"), optimizer(
            lambda ps: ParamAdam([ParamAdam.Parameter(p) for p in ps.values()], buggy=bug),
            hyper=HYPER, m="mom1", v="mom2", params="parameters", value="data", grad="grad"))),
        "bound_model": lambda: dict(zip(("adam_init", "adam_step"), optimizer(
            lambda model: BoundAdam(model, loss=None, buggy=bug),
            hyper={"lr": "lr", "beta1": "beta1", "beta2": "beta2", "eps": "eps"}, m="m", v="v",
            bound=True))),
        "per_name": lambda: dict(zip(("adam_init", "adam_step"), optimizer(
            lambda ps: Trainer(ps, bug), hyper={"lr": "lr", "beta1": "beta1", "beta2": "beta2",
                                                "eps": "eps"},
            m="m", v="v", each="update"))),
    }


OPS = {"dict_grads": "linear", "sequential": "ffn", "heads_list": "attention", "again": "relu",
       "again_loss": "cross_entropy", "tuple_output": "layernorm", "transposed": "embedding",
       "per_position": "cross_entropy", "optional_bias": "linear", "single_use": "linear",
       "functions": "softmax", "transposed_returned": "linear", "owns_params": "adam",
       "parameter_grad": "adam", "bound_model": "adam",
       "per_name": "adam", "block_entries": "block", "block_parts": "block"}
OPTIMIZERS = ("owns_params", "parameter_grad", "bound_model", "per_name")


def build(shape: str, buggy: bool = False) -> SimpleNamespace:
    """The implementation of ``shape`` (correct, or with its one bug): its protocol names and
    its CAPABILITIES (optimizers declare no weight decay: none of them has one)."""
    made = {**_layers(buggy), **_optimizers(buggy)}[shape]()
    if shape in OPTIMIZERS:
        made["CAPABILITIES"] = {"weight_decay": False}
    ns = SimpleNamespace(**made)
    ns.__name__ = f"{shape}{'_buggy' if buggy else ''}"
    return ns
