"""The reference's own whole model under the ``whole_model`` row: its ``loss_and_grads(params,
config, input_ids, *, labels, attention_mask)`` adapted in one line (the suite's function of
(params, batch) fixes the config and drops the input-embedding gradient).  GELU, so that no
ReLU kink sits under a finite difference (tests/suite/test_whole_model.py)."""

import numpy as np

import minibert_reference as R
from minibert_reference.config import mini_bert
from minibert_spec.suite import whole_model

CFG = mini_bert(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=13,
                activation="gelu")
MODEL = whole_model(lambda params, input_ids, attention_mask, labels: R.loss_and_grads(
    params, CFG, input_ids, attention_mask=attention_mask, labels=labels)[:2],
    R.init_params(CFG, seed=0, dtype=np.float64))
