"""Pictures of a training run: the loss curve and attention heat-maps (matplotlib, Agg backend,
imported lazily so the NumPy core never needs it).

``attention_maps`` recomputes each layer's attention probabilities from the public op pairs
(linear -> split_heads -> scaled scores -> masked softmax), layer by layer, and checks that every
row sums to 1 before anything is drawn.
"""

from __future__ import annotations

import os

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def attention_maps(impl, params, config, input_ids, attention_mask=None) -> np.ndarray:
    """Attention probabilities [L, B, A, T, T] of every layer and head (rows: queries)."""
    x = impl.embed(params, config, input_ids)  # [B, T, H]
    B, T, H = x.shape
    if attention_mask is None:
        attention_mask = np.ones((B, T), dtype=bool)
    key_mask = np.broadcast_to(np.asarray(attention_mask, bool)[:, None, None, :],
                               (B, config.n_heads, T, T))
    maps = []
    for i in range(config.n_layers):
        p = {k.split(".", 2)[2]: v for k, v in params.items() if k.startswith(f"layers.{i}.")}
        q, _ = impl.linear_forward(x, p["attn.W_q"], p.get("attn.b_q"))
        k, _ = impl.linear_forward(x, p["attn.W_k"], p.get("attn.b_k"))
        qh, kh = impl.split_heads(q, config.n_heads), impl.split_heads(k, config.n_heads)
        scores = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(config.d_k)  # [B, A, T, T]
        probs, _ = impl.softmax_forward(scores, key_mask)
        maps.append(probs)
        x, _ = impl.block_forward(x, p, n_heads=config.n_heads, mask=attention_mask,
                                  eps=config.ln_eps)
    maps = np.stack(maps)
    if not np.allclose(maps.sum(axis=-1), 1.0, atol=1e-5):
        raise AssertionError("attention rows do not sum to 1")
    return maps


def plot_attention(path: str, maps: np.ndarray, tokens: list[str], *, title: str = "") -> None:
    """One panel per (layer, head) for the first sequence; tokens on both axes."""
    plt = _pyplot()
    L, _, A, T, _ = maps.shape
    fig, axes = plt.subplots(L, A, figsize=(3.2 * A + 1.5, 3.2 * L + 0.8), squeeze=False,
                             constrained_layout=True)
    fs = max(4, min(8, 160 // max(T, 1)))
    vmax = float(maps[:, 0].max())  # one colour scale for every panel, so they compare
    for layer in range(L):
        for head in range(A):
            ax = axes[layer, head]
            im = ax.imshow(maps[layer, 0, head], vmin=0.0, vmax=vmax, cmap="viridis")
            ax.set_xticks(range(T))
            ax.set_yticks(range(T))
            ax.set_xticklabels(tokens, rotation=90, fontsize=fs)
            ax.set_yticklabels(tokens if head == 0 else [], fontsize=fs)
            ax.set_title(f"layer {layer}, head {head}", fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6,
                 label="attention probability (each row sums to 1)")
    fig.suptitle(title or "attention: query (row) -> key (column)", fontsize=10)
    _save(fig, path)
    plt.close(fig)


def plot_loss_curve(path: str, history: dict, *, baseline: float | None = None,
                    window: int = 50) -> None:
    """Training loss (raw and moving average), held-out MLM loss, the unigram baseline."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    steps, loss = np.asarray(history["step"]), np.asarray(history["loss"])
    if loss.size:
        ax.plot(steps, loss, color="0.8", lw=0.6, label="train loss (per step)")
        if loss.size >= window:
            avg = np.convolve(loss, np.ones(window) / window, mode="valid")
            ax.plot(steps[window - 1:], avg, color="C0", label=f"train loss ({window}-step mean)")
    if history.get("eval_step"):
        ax.plot(history["eval_step"], history["eval_loss"], "o-", color="C3", ms=3,
                label="held-out MLM loss")
    if baseline is not None:
        ax.axhline(baseline, color="k", ls="--", lw=1, label=f"unigram baseline {baseline:.3f}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def _save(fig, path: str) -> None:
    """Atomic: a kill mid-write leaves the previous image, never a truncated one."""
    from minibert_reference.train.fileio import atomic_path

    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=fmt)
