"""Claims of the BERT-base blog: BERT-base's shapes and parameter count (as transformers builds
it), and its forward algorithm as written -- refuted: ``blog_literal_forward`` composes it from
the public ops and compares it with BERT's forward on the same weights."""

from __future__ import annotations

import numpy as np

from minibert_spec.claims import Result, claim, fmt_int
from minibert_spec.sources import BLOG, SLIDES


@claim("blog.shapes", "BERT-base: W_P 512x768, 12 layers of 12 heads with 768x64 projections "
       "(12 x 64 = 768), FFN 768x3072 and 3072x768, W_final 768x768",
       f"{BLOG} (initialize)", "as listed", "confirmed")
def _blog_shapes(ctx):
    c = ctx.bert_base_sizes
    s = ctx.impl.param_shapes(c)
    d_k = c.hidden // c.n_heads
    got = dict(W_P=s["embeddings.position.W"], layers=sum(1 for k in s if k.endswith("attn.W_q")),
               head_W=(s["layers.0.attn.W_q"][0], d_k), heads=c.n_heads,
               W_ffnn=s["layers.0.ffn.W_1"], b_ffnn=s["layers.0.ffn.b_1"],
               W_out=s["layers.0.ffn.W_2"], b_out=s["layers.0.ffn.b_2"])
    want = dict(W_P=(512, 768), layers=12, head_W=(768, 64), heads=12, W_ffnn=(768, 3072),
                b_ffnn=(3072,), W_out=(3072, 768), b_out=(768,))
    h = np.zeros((1, 2, 768), np.float32)
    pooled, _ = ctx.impl.pooler_forward(h, np.zeros((768, 768), np.float32))
    ok = got == want and pooled.shape == (1, 768)
    return Result(f"{got}; pooler [768,768] -> {list(pooled.shape)}",
                  "confirmed" if ok else "refuted", "param_shapes of a BERT-base config; "
                  "per-head projections are d_k-column slices of the fused [768, 768]")


@claim("blog.attention_shapes", "In BERT-base each head's attention matrix is 512x512 and "
       "its output 512x64; concatenated 512x768", f"{BLOG} (forward)", "512x512; 512x64; 512x768",
       "confirmed")
def _blog_attention(ctx):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 512, 768)).astype(np.float32)
    W = [(0.02 * rng.standard_normal((768, 768))).astype(np.float32) for _ in range(4)]
    y, cache = ctx.impl.attention_forward(x, *W, n_heads=12)
    p, v_h = cache.p, cache.v_h
    ok = p.shape == (1, 12, 512, 512) and v_h.shape == (1, 12, 512, 64) and y.shape == (1, 512,
                                                                                          768)
    return Result(f"P {list(p.shape)}, V_h {list(v_h.shape)}, out {list(y.shape)}",
                  "confirmed" if ok else "refuted", "attention_forward at T=512, H=768, A=12")


# ---- real BERT (issue 12): the blog's system as Hugging Face builds it
# transformers' own count, BertModel(BertConfig()).num_parameters() (pooler included); spec never
# imports torch, so tests/hf/test_transformers.py asserts that transformers gives this number too
TRANSFORMERS_BERT_BASE_PARAMS = 109_482_240


@claim("bert_base.params", "BERT-base at the blog's sizes (12 layers, H=768, 12 heads, I=3072, "
       "512 positions) with the slides' V=30,522 and 2 token types has as many parameters as "
       "transformers' BertModel", f"{BLOG} (initialize); {SLIDES} (tokens)",
       fmt_int(TRANSFORMERS_BERT_BASE_PARAMS), "confirmed")
def _bert_base_params(ctx):
    from minibert_reference.config import bert_base

    shapes = ctx.impl.param_shapes(bert_base())
    total = sum(int(np.prod(s)) for s in shapes.values())
    emb = sum(int(np.prod(s)) for k, s in shapes.items() if k.startswith("embeddings."))
    layer = sum(int(np.prod(s)) for k, s in shapes.items() if k.startswith("layers.0."))
    pool = sum(int(np.prod(s)) for k, s in shapes.items() if k.startswith("pooler."))
    return Result(fmt_int(total), "confirmed" if total == TRANSFORMERS_BERT_BASE_PARAMS
                  else "refuted", f"embeddings {fmt_int(emb)} + 12 x {fmt_int(layer)} per layer + "
                  f"pooler {fmt_int(pool)} (param_shapes of the bert_base preset; transformers' "
                  "count checked by tests/hf/test_transformers.py)")


def blog_literal_forward(impl, params, config, input_ids, attention_mask=None) -> np.ndarray:
    """The BERT-base blog's forward algorithm as written, composed from the implementation's
    public ops on a BERT model's weights: X = the input embeddings (``embed``); per layer
    Z~ = the heads concatenated with no output projection (``attention_forward`` with W^O = I,
    no b_o), Z- = LN(X + Z~), Z_out = FFN with ReLU, Z = LN(X + Z_out): both residuals add the
    embeddings X, never the layer's own input.  Returns the last hidden states [B, T, H]."""
    x = impl.embed(params, config, input_ids)  # [B, T, H]
    eye = np.eye(config.hidden, dtype=x.dtype)  # no W^O: the identity in its place
    z = x
    for i in range(config.n_layers):
        p = {k.split(".", 2)[2]: v for k, v in params.items() if k.startswith(f"layers.{i}.")}
        z_tilde, _ = impl.attention_forward(
            z, p["attn.W_q"], p["attn.W_k"], p["attn.W_v"], eye, p.get("attn.b_q"),
            p.get("attn.b_k"), p.get("attn.b_v"), None, n_heads=config.n_heads,
            mask=attention_mask)
        z_bar, _ = impl.layernorm_forward(x + z_tilde, p["ln1.gamma"], p["ln1.beta"],
                                          config.ln_eps)
        z_out, _ = impl.ffn_forward(z_bar, p["ffn.W_1"], p["ffn.b_1"], p["ffn.W_2"],
                                    p["ffn.b_2"], "relu")
        z, _ = impl.layernorm_forward(x + z_out, p["ln2.gamma"], p["ln2.beta"], config.ln_eps)
    return z


def _blog_literal_differences(ctx) -> dict[str, float]:
    """max |h_variant - h_BERT| / max |h_BERT| of the last hidden states on the same random
    BERT weights (bert_tiny's architecture, 4 layers, H=32, float64, B=2, T=12)."""
    from minibert_reference.config import bert_tiny
    from minibert_spec.numerics.finite_differences import random_params

    config = bert_tiny(n_layers=4, hidden=32, n_heads=4, intermediate=64, head="none")
    params = random_params(ctx.impl, config, seed=11)
    rng = np.random.default_rng(12)
    ids = rng.integers(0, config.vocab_size, size=(2, 12))
    mask = np.ones((2, 12), dtype=np.int64)
    ref, _ = ctx.impl.forward(params, config, ids, mask)
    no_wo = dict(params)
    for i in range(config.n_layers):
        no_wo[f"layers.{i}.attn.W_o"] = np.eye(config.hidden)
        no_wo[f"layers.{i}.attn.b_o"] = np.zeros(config.hidden)
    variants = {
        "ReLU only": ctx.impl.forward(params, config.replace(activation="relu"), ids, mask)[0],
        "no W^O only": ctx.impl.forward(no_wo, config, ids, mask)[0],
        "all three (the blog as written)": blog_literal_forward(ctx.impl, params, config, ids,
                                                                mask)}
    scale = float(np.abs(ref).max())
    return {k: float(np.abs(v - ref).max()) / scale for k, v in variants.items()}


@claim("blog.forward_literal", "The blog's forward algorithm (heads concatenated without an "
       "output projection, ReLU, both residuals adding the embeddings X in every layer) computes "
       "BERT-base", f"{BLOG} (forward algorithm)", "BERT-base's hidden states", "refuted")
def _blog_literal(ctx):
    diffs = _blog_literal_differences(ctx)
    worst = diffs["all three (the blog as written)"]
    return Result(f"relative difference {worst:.2f}", "refuted" if worst > 1e-3 else "confirmed",
                  "max |h_blog - h_BERT| / max |h_BERT| of the last hidden states, same weights: "
                  + "; ".join(f"{k} {v:.3f}" for k, v in diffs.items()))
