"""A training script's Adam in the style of small NumPy GPT trainers: the learning rate of the
schedule is handed to each step (``opt.step(params, grads, lr=lr_t, t=step)``) rather than set as
an attribute, and the step counter is the training loop's own (``for step in range(1, n + 1)``:
1 at the first step); the moments live on the optimizer.  Adapted with ``optimizer(...,
hyper={"lr": "lr=", ...}, t="t=", first_t=1)`` (issue 39).

``BUGS``: "adam" computes the bias correction with ``t - 1`` (an off-by-one between a 1-based
loop and a 0-based formula).
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import optimizer

BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
CAPABILITIES = {"weight_decay": False}


class Adam:
    def __init__(self, params, betas=(0.9, 0.999), eps=1e-8):
        self.betas, self.eps = betas, eps
        self.m = {k: np.zeros_like(p) for k, p in params.items()}
        self.v = {k: np.zeros_like(p) for k, p in params.items()}

    def step(self, params, grads, lr, t):
        b1, b2 = self.betas
        n = t - 1 if "adam" in BUGS else t
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            m_hat = self.m[k] / (1 - b1 ** n)
            v_hat = self.v[k] / (1 - b2 ** n)
            params[k] -= lr * m_hat / (np.sqrt(v_hat) + self.eps)


# ----------------------------------------------------------------------------- the adapter
adam_init, adam_step = optimizer(Adam, hyper={"lr": "lr=", ("beta1", "beta2"): "betas",
                                              "eps": "eps"}, m="m", v="v", t="t=", first_t=1)
