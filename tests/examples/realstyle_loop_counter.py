"""A trainer's per-parameter Adam update with the step counter kept by the training loop, 0-based
(``for t in range(steps): trainer.adam_update(name, p, g, t, lr=lr)``, the update adding 1
itself) and the learning rate passed to each call; the moments live on the trainer.  Adapted with
``optimizer(..., each="adam_update", each_args=("name", "param", "grad", "t"), first_t=0,
hyper={"lr": "lr=", ...})`` (issue 39).

``BUGS``: "adam" corrects the second moment with ``beta2 ** t`` (the 0-based counter taken as
1-based, in one of the two corrections).
"""

from __future__ import annotations

import os

import numpy as np

from minibert_spec.suite.adapters import optimizer

BUGS: set = set(filter(None, os.environ.get("MINIBERT_EXAMPLE_BUGS", "").split(",")))
CAPABILITIES = {"weight_decay": False}


class Trainer:
    def __init__(self, params, beta1=0.9, beta2=0.999, eps=1e-8):
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m = {k: np.zeros_like(p) for k, p in params.items()}
        self.v = {k: np.zeros_like(p) for k, p in params.items()}

    def adam_update(self, name, p, g, t, lr=1e-3):
        self.m[name] = self.beta1 * self.m[name] + (1 - self.beta1) * g
        self.v[name] = self.beta2 * self.v[name] + (1 - self.beta2) * g ** 2
        m_hat = self.m[name] / (1 - self.beta1 ** (t + 1))
        v_hat = self.v[name] / (1 - self.beta2 ** (t if "adam" in BUGS else t + 1))
        p -= lr * m_hat / (np.sqrt(v_hat) + self.eps)


# ----------------------------------------------------------------------------- the adapter
adam_init, adam_step = optimizer(
    Trainer, hyper={"lr": "lr=", "beta1": "beta1", "beta2": "beta2", "eps": "eps"}, m="m", v="v",
    each="adam_update", each_args=("name", "param", "grad", "t"), first_t=0)
