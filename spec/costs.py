"""The Mini-BERT architecture's sizes as SymPy closed forms: parameter counts, activation counts
and matmul multiply-adds in L, H, A, I, T, V, B.

Two readers: the claims ledger checks the documents' counts against them (``minibert_spec.claims``,
cross-checked there against the arrays the implementation allocates), and the bench turns them
into the GFLOP of a step and its FLOP floor (``minibert_spec.bench.step_gflop``).  Here, below both,
so neither has to import the other for a formula.
"""

from __future__ import annotations


def closed_forms():
    """SymPy closed forms in L, H, A, I, T, V, B for the Mini-BERT architecture as the
    derivation describes it (§2: unbiased Q/K/V/O, biased FFN, two LayerNorms per layer, a
    final LayerNorm, a biased MLM head).  MACs count multiply-adds of the matmuls per sequence;
    FLOPs = 2 MACs."""
    import sympy as sp
    L, H, A, I, T, V, B = sp.symbols("L H A I T V B", positive=True, integer=True)
    per_layer = 4 * H ** 2 + (H * I + I) + (I * H + H) + 2 * (2 * H)
    f = dict(
        token=V * H, position=T * H, per_layer=per_layer, layers=L * per_layer,
        final_ln=2 * H, head=H * V + V,
        attn_macs=4 * T * H ** 2 + 2 * T ** 2 * H,  # Q, K, V, O projections; QK^T and PV
        ffn_macs=2 * T * H * I, head_macs=T * H * V,
        emb_values=B * T * H, score_values=B * A * T ** 2 * L, ffn_values=B * T * I * L,
    )
    f["total"] = f["token"] + f["position"] + f["layers"] + f["final_ln"] + f["head"]
    f["layer_macs"] = f["attn_macs"] + f["ffn_macs"]
    f["model_macs"] = L * f["layer_macs"] + f["head_macs"]
    return f, dict(L=L, H=H, A=A, I=I, T=T, V=V, B=B)
