"""A tiny float64 training run for the interruption tests (run as a subprocess, so it can be
sent SIGINT / SIGTERM / SIGKILL at a random moment).

``python -m tests.train.interrupt_worker CKPT [DELAY]``: resume from CKPT when it exists, else start
fresh; train to the end, checkpointing every CKPT_EVERY steps.  DELAY seconds of sleep inside
every step, *after* the step's batches were drawn (the moment where a Ctrl-C used to leave an
RNG that had already drawn the step's data), so a random signal lands mid-step most of the time.
Exit 0 when finished, 130 when interrupted (state checkpointed at a step boundary).
Trains with WORKERS workers (minibert_reference.parallel: batch shards and the optimizer's tensor
groups, double-buffered updates), so a signal also lands while worker threads run.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import minibert_reference
from minibert_reference.config import mini_bert
from minibert_reference.train import data as D

WORKERS = 2
TINY = mini_bert(n_layers=2, hidden=8, n_heads=2, intermediate=16, max_len=8, vocab_size=23)
STEPS, CKPT_EVERY = 40, 7


def tiny_setup():
    from minibert_reference.train.loop import TrainConfig

    rng = np.random.default_rng(123)
    lists = [list(rng.integers(D.N_SPECIAL, TINY.vocab_size, size=rng.integers(2, 9)))
             for _ in range(40)]
    data = D.build_sequences(lists, TINY.max_len)
    tcfg = TrainConfig(steps=STEPS, batch_size=4, accum_steps=2, peak_lr=1e-2, warmup_steps=3,
                       weight_decay=0.01, max_grad_norm=1.0, eval_every=5, eval_rows=8,
                       ckpt_every=CKPT_EVERY, seed=0, dtype="float64")
    return TINY, tcfg, data


class SlowImpl:
    """The reference implementation with a pause inside each step's gradient computation."""

    def __init__(self, delay: float):
        self.delay = delay

    def __getattr__(self, name):
        return getattr(minibert_reference, name)

    def accumulate_gradients(self, *args, **kwargs):
        time.sleep(self.delay)
        return minibert_reference.accumulate_gradients(*args, **kwargs)


def run(ckpt: str, delay: float = 0.0, log=print) -> int:
    from minibert_reference.train.loop import Interrupted, heldout_set, load_state, train

    config, tcfg, data = tiny_setup()
    held = heldout_set(*data, rows=tcfg.eval_rows, seed=tcfg.seed, vocab_size=config.vocab_size)
    state = load_state(ckpt)[0] if os.path.exists(ckpt) else None
    from minibert_reference import parallel

    try:
        with parallel.workers(WORKERS):
            train(SlowImpl(delay) if delay else minibert_reference, config, tcfg, data, held,
                  state=state, checkpoint_path=ckpt, log=log)
    except Interrupted:
        return 130
    return 0


if __name__ == "__main__":
    sys.stdout.write("started\n")
    sys.stdout.flush()
    sys.exit(run(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0,
                 log=lambda *a, **k: None))
