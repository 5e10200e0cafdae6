"""The Mini-BERT architecture in PyTorch eager, for ``minibert bench`` (the torch side of the
timings).  Written the way a PyTorch user writes it (tensor ops, ``F.layer_norm``,
``torch.optim.Adam`` with ``foreach``), from the same flat parameter dict as the reference.
Lives in tests/ because neither ``minibert_reference`` nor ``minibert_spec`` may import torch."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from minibert_reference.ops import IGNORE_INDEX


def build(params: dict[str, np.ndarray], config):
    """(tensors, forward, optimizer): forward(ids, mask, predicted=None) -> logits [B, T, V], or
    [N, V] at the ``predicted`` positions (the trainer's masked head)."""
    tp = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in params.items()}
    A, H = config.n_heads, config.hidden
    d_k = H // A

    def forward(ids, mask, predicted=None):
        B, T = ids.shape
        x = tp["embeddings.token.W"][ids] + tp["embeddings.position.W"][:T]
        key_mask = mask[:, None, None, :] == 0

        def heads(t):  # [B, T, H] -> [B, A, T, d_k]
            return t.view(B, T, A, d_k).transpose(1, 2)

        for i in range(config.n_layers):
            p = {k.split(".", 2)[2]: v for k, v in tp.items() if k.startswith(f"layers.{i}.")}
            q, k, v = heads(x @ p["attn.W_q"]), heads(x @ p["attn.W_k"]), heads(x @ p["attn.W_v"])
            s = (q @ k.transpose(-1, -2)) / d_k ** 0.5
            s = s.masked_fill(key_mask, float("-inf"))
            ctx = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, H)
            x = F.layer_norm(x + ctx @ p["attn.W_o"], (H,), p["ln1.gamma"], p["ln1.beta"],
                             config.ln_eps)
            f = torch.relu(x @ p["ffn.W_1"] + p["ffn.b_1"]) @ p["ffn.W_2"] + p["ffn.b_2"]
            x = F.layer_norm(x + f, (H,), p["ln2.gamma"], p["ln2.beta"], config.ln_eps)
        x = F.layer_norm(x, (H,), tp["final_ln.gamma"], tp["final_ln.beta"], config.ln_eps)
        if predicted is not None:
            x = x[predicted]  # [N, H]
        return x @ tp["mlm.W"] + tp["mlm.b"]

    optimizer = torch.optim.Adam(list(tp.values()), lr=1e-4, foreach=True)
    return tp, forward, optimizer


def loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def sgemm_gflops(threads: int, *, n: int = 512, k: int = 768, repeats: int = 7,
                 per_round: int = 4) -> tuple[float, float]:
    """torch's float32 matmul rate now (GFLOP/s) at ``threads`` intra-op threads: (the best
    round, the median round) of ``per_round`` [n, k] @ [k, k] products, after a warm-up round
    -- the same shapes as ``minibert_spec.bench.sgemm_gflops`` probes with NumPy's BLAS.  Leaves
    torch's thread count as it found it."""
    import time

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(n, k, generator=g)
        b = torch.randn(k, k, generator=g)
        out = torch.empty(n, k)
        times = []
        for r in range(repeats + 1):
            t0 = time.perf_counter()
            for _ in range(per_round):
                torch.mm(a, b, out=out)
            if r:  # round 0 warms the pool up
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    work = per_round * 2 * n * k * k / 1e9
    return work / min(times), work / float(np.median(times))
