"""Training code in the shapes real code has -- an Adam class with its own state, a schedule and
a clipping function with their own argument names and orders, a transformer block class -- whose
maths is the reference's, called through ``minibert_reference.optim`` / ``minibert_reference.ops``
at call time (never a name bound at import), so that a catalog mutant applied to the reference is
a bug of this code too: what tests/suite/test_infer_mutants.py runs ``minibert adapter infer``'s
adam, schedule, clip and block rows on, under every mutant that reaches them.

Adam keeps m, v (dicts keyed like the parameters) and t as attributes, its hyperparameters under
names of its own, and updates the parameters dict in place; ``lr_at(step, warmup, peak, total)``
takes the schedule's numbers in an order of its own; ``clip_gradients`` returns ``(norm,
clipped)``, ``grad_norm`` the global norm; ``Block`` keeps GPT-2-style names (``ln_1_g``,
``attn_wq``, ``mlp_w_fc``) and its gradients as ``d`` + name.  ``BLOCK`` is the block's form
(its LayerNorms' place and its FFN), read at call time: the tests switch it to reach each
block kernel's mutants."""

from __future__ import annotations

import numpy as np

from minibert_reference import ops
from minibert_reference import optim as O

# the block's form: norm "post" (BERT) / "pre" (GPT-2) / "inner"; ffn "mlp" (GELU) or "swiglu"
BLOCK = {"norm": "post", "ffn": "mlp"}


class Adam:
    def __init__(self, params, learning_rate=1e-3, b1=0.9, b2=0.999, epsilon=1e-8, wd=0.0):
        self.learning_rate, self.b1, self.b2, self.epsilon, self.wd = (learning_rate, b1, b2,
                                                                       epsilon, wd)
        self.m = {k: np.zeros_like(p) for k, p in params.items()}
        self.v = {k: np.zeros_like(p) for k, p in params.items()}
        self.t = 0

    def step(self, params, grads, no_decay=()):
        new, state = O.adam_step(dict(params), grads, {"step": self.t, "m": self.m, "v": self.v},
                                 lr=self.learning_rate, beta1=self.b1, beta2=self.b2,
                                 eps=self.epsilon, weight_decay=self.wd, no_decay=tuple(no_decay))
        for k in params:  # in place: the caller's dict holds the new parameters
            params[k] = new[k]
        self.m, self.v, self.t = state["m"], state["v"], state["step"]


def lr_at(step, warmup, peak, total):
    return O.warmup_linear_lr(step, peak_lr=peak, warmup_steps=warmup, total_steps=total)


def grad_norm(grads):
    return O.global_grad_norm(grads)


def clip_gradients(grads, max_norm):
    clipped, norm = O.clip_by_global_norm(grads, max_norm)
    return norm, clipped


# the block's parameters (the reference's names) -> its attributes
_FFN = {"mlp": {"ffn.W_1": "mlp_w_fc", "ffn.b_1": "mlp_b_fc", "ffn.W_2": "mlp_w_proj",
                "ffn.b_2": "mlp_b_proj"},
        "swiglu": {"swiglu.W_1": "mlp_w1", "swiglu.W_3": "mlp_w3", "swiglu.W_2": "mlp_w2"}}
_NAMES = {**{f"ln{i}.{k}": f"ln_{i}_{k[0]}" for i in (1, 2) for k in ("gamma", "beta")},
          **{f"attn.{w}_{n}": f"attn_{w.lower()}{n}" for w in "Wb" for n in "qkvo"}}


class Block:
    def __init__(self, n_embd, n_head, eps=1e-12):
        C, self.n_head, self.eps, self.ffn = n_embd, n_head, eps, BLOCK["ffn"]
        self.names = {**_NAMES, **_FFN[self.ffn]}
        rng = np.random.default_rng(0)
        shapes = ops.block_param_shapes(tuple(self.names), C, 4 * C)
        for k, path in self.names.items():
            setattr(self, path, 0.02 * rng.standard_normal(shapes[k]))

    def forward(self, x):
        p = {k: getattr(self, path) for k, path in self.names.items()}
        out, self.cache = ops._block_forward(x, p, n_heads=self.n_head, eps=self.eps,
                                             activation="gelu", norm=BLOCK["norm"], ffn=self.ffn)
        return out

    def backward(self, dout):
        dx, grads = ops._block_backward(dout, self.cache)
        for k, path in self.names.items():
            setattr(self, f"d{path}", grads[k])
        return dx
