"""Train-step time of the NumPy reference vs PyTorch eager on the same model and batch.

Mini-BERT preset, float32, B=8, T=64, ~15% of positions predicted, forward + backward + Adam
update.  Two variants, each the same computation on both sides:

* ``all``: the MLM head over every position (logits [B, T, V]), as the model's loss_and_grads;
* ``masked``: the head only at the predicted positions (what ``minibert train`` runs:
  reference ``masked_lm_loss_and_grads``; torch gathers the same rows before the head).

Both sides run in the same process with the same thread count, alternating step by step, and
the medians are compared (the machine is noisy).

    python tests/benchmarks/bench_train_step.py [--threads 2] [--steps 30] [--batch 8] [--seq 64]

Not collected by pytest (``bench_*.py``).  Thread counts must be fixed before NumPy loads, so
this script sets the BLAS environment variables and re-executes itself when needed.
"""

from __future__ import annotations

import argparse
import os
import sys

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per side")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", "-B", type=int, default=8)
    ap.add_argument("--seq", "-T", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--head", choices=["all", "masked", "both"], default="both")
    return ap.parse_args()


def torch_model(params, config):
    """The reference architecture in torch (post-LN, unbiased attention, final LN, MLM head)."""
    import torch

    tp = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}

    def forward(ids, mask, predicted=None):
        B, T = ids.shape
        A, H = config.n_heads, config.hidden
        d_k = H // A
        x = tp["embeddings.token.W"][ids] + tp["embeddings.position.W"][:T]
        key_mask = mask[:, None, None, :] == 0
        for i in range(config.n_layers):
            p = {k.split(".", 2)[2]: v for k, v in tp.items() if k.startswith(f"layers.{i}.")}

            def heads(t):
                return t.view(B, T, A, d_k).transpose(1, 2)

            q, k, v = heads(x @ p["attn.W_q"]), heads(x @ p["attn.W_k"]), heads(x @ p["attn.W_v"])
            s = (q @ k.transpose(-1, -2)) / d_k ** 0.5
            s = s.masked_fill(key_mask, float("-inf"))
            ctx = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H)
            x = torch.nn.functional.layer_norm(x + ctx @ p["attn.W_o"], (H,), p["ln1.gamma"],
                                               p["ln1.beta"], config.ln_eps)
            f = torch.relu(x @ p["ffn.W_1"] + p["ffn.b_1"]) @ p["ffn.W_2"] + p["ffn.b_2"]
            x = torch.nn.functional.layer_norm(x + f, (H,), p["ln2.gamma"], p["ln2.beta"],
                                               config.ln_eps)
        x = torch.nn.functional.layer_norm(x, (H,), tp["final_ln.gamma"], tp["final_ln.beta"],
                                           config.ln_eps)
        if predicted is not None:  # gather the predicted positions: [N, H]
            x = x[predicted]
        return x @ tp["mlm.W"] + tp["mlm.b"]

    return tp, forward


def main() -> int:
    args = _parse()
    if os.environ.get("_BENCH_THREADS") != str(args.threads):
        env = {**os.environ, "_BENCH_THREADS": str(args.threads),
               **{v: str(args.threads) for v in THREAD_VARS}}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    import time

    import numpy as np
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    import reference
    from reference.config import mini_bert
    from reference.optim import adam_init, adam_step

    torch.set_num_threads(args.threads)
    config = mini_bert()
    B, T = args.batch, args.seq
    rng = np.random.default_rng(args.seed)
    params = reference.init_params(config, seed=args.seed, dtype=np.float32)
    ids = rng.integers(5, config.vocab_size, size=(B, T))
    labels = np.where(rng.random((B, T)) < 0.15, ids, -100)
    labels[:, 0] = ids[:, 0]  # at least one predicted position per row
    mask = np.ones((B, T), dtype=np.int64)
    state = adam_init(params)

    tp, tforward = torch_model(params, config)
    opt = torch.optim.Adam(list(tp.values()), lr=1e-4)
    t_ids, t_labels, t_mask = (torch.from_numpy(a) for a in (ids, labels, mask))

    t_pred = t_labels != -100

    def make_steps(head):
        def ref_step():
            nonlocal params, state
            if head == "all":
                loss, grads, _ = reference.loss_and_grads(params, config, ids, labels=labels,
                                                          attention_mask=mask)
            else:
                loss, grads, _ = reference.masked_lm_loss_and_grads(params, config, ids,
                                                                 labels=labels,
                                                                 attention_mask=mask)
            params, state = adam_step(params, grads, state, lr=1e-4)
            return float(loss)

        def torch_step():
            opt.zero_grad(set_to_none=True)
            if head == "all":
                logits = tforward(t_ids, t_mask)
                loss = torch.nn.functional.cross_entropy(logits.view(-1, config.vocab_size),
                                                         t_labels.view(-1), ignore_index=-100)
            else:
                logits = tforward(t_ids, t_mask, t_pred)
                loss = torch.nn.functional.cross_entropy(logits, t_labels[t_pred])
            loss.backward()
            opt.step()
            return loss.item()

        return ref_step, torch_step

    for head in (["all", "masked"] if args.head == "both" else [args.head]):
        ref_step, torch_step = make_steps(head)
        l_ref, l_torch = ref_step(), torch_step()
        print(f"[head={head}] first-step loss: reference {l_ref:.6f}, torch {l_torch:.6f}")
        for _ in range(args.warmup):
            ref_step()
            torch_step()
        t_ref, t_torch = [], []
        for _ in range(args.steps):  # alternate so both see the same machine load
            t0 = time.perf_counter()
            ref_step()
            t1 = time.perf_counter()
            torch_step()
            t2 = time.perf_counter()
            t_ref.append(t1 - t0)
            t_torch.append(t2 - t1)
        m_ref, m_torch = np.median(t_ref) * 1e3, np.median(t_torch) * 1e3
        print(f"[head={head}] train step B={B} T={T} float32, {args.threads} thread(s), "
              f"{args.steps} steps each, alternating: reference median {m_ref:.1f} ms "
              f"(p10 {np.percentile(t_ref, 10) * 1e3:.1f}, p90 "
              f"{np.percentile(t_ref, 90) * 1e3:.1f}); torch eager median {m_torch:.1f} ms "
              f"(p10 {np.percentile(t_torch, 10) * 1e3:.1f}, p90 "
              f"{np.percentile(t_torch, 90) * 1e3:.1f}); ratio reference/torch = "
              f"{m_ref / m_torch:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
