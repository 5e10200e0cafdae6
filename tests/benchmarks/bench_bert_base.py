"""bert_base forward (B=1, T=128, float32) of the NumPy reference vs transformers' BertModel on
the same weights, in the same process, alternating call by call; medians and their ratio, the
parameter count of both, and the largest difference of the last hidden states.

The weights: a random transformers BertModel(BertConfig()) (no download), saved to a temporary
directory and read back with ``minibert_reference.load_pretrained``.

    python tests/benchmarks/bench_bert_base.py [--threads 1] [--reps 7] [--seq 128]

Not collected by pytest (``bench_*.py``).  Thread counts are fixed before NumPy loads (the
script re-executes itself with the BLAS variables set).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seq", "-T", type=int, default=128)
    args = ap.parse_args()
    if os.environ.get("_BENCH_THREADS") != str(args.threads):
        env = {**os.environ, "_BENCH_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
               **{v: str(args.threads) for v in THREAD_VARS}}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    import time

    import numpy as np
    import torch
    import transformers

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    import minibert_reference

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(attn_implementation="eager")).eval()
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        config, params = minibert_reference.load_pretrained(d, dtype=np.float32)
    n_ours = sum(v.size for v in params.values())
    print(f"parameters: reference {n_ours:,}, transformers {model.num_parameters():,}")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab_size, size=(1, args.seq))
    mask = np.ones_like(ids)
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)

    def ours():
        return minibert_reference.forward(params, config, ids, mask)[0]

    def theirs():
        with torch.no_grad():
            return model(input_ids=t_ids, attention_mask=t_mask).last_hidden_state.numpy()

    h_ours, h_theirs = ours(), theirs()
    diff = float(np.abs(h_ours - h_theirs).max())
    print(f"last hidden states: max |ours - transformers| = {diff:.2e} "
          f"(max |h| {float(np.abs(h_theirs).max()):.2f})")
    t_o, t_t = [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        ours()
        t_o.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        theirs()
        t_t.append(time.perf_counter() - t0)
    mo, mt = float(np.median(t_o)), float(np.median(t_t))
    print(f"forward B=1 T={args.seq} float32, {args.threads} thread(s), median of {args.reps}: "
          f"reference {mo * 1e3:.0f} ms, transformers {mt * 1e3:.0f} ms, ratio {mo / mt:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
