"""Model configuration and the two presets the source documents describe."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of an encoder.  Names follow the Mini-BERT derivation (L, H, A, I, T, V).

    position:        "learned" (BERT, Mini-BERT) or "sinusoidal" (NumPy-Transformer document)
    attn_bias:       biased Q/K/V/O projections (NumPy-Transformer document) or not (Mini-BERT)
    final_layernorm: the extra LayerNorm before the head (Mini-BERT derivation §2.6)
    head:            "mlm" (logits over V) or "none" (hidden states, e.g. for MSE reconstruction)
    """

    n_layers: int = 3  # L
    hidden: int = 192  # H
    n_heads: int = 4  # A
    intermediate: int = 768  # I
    max_len: int = 64  # T
    vocab_size: int = 8192  # V
    position: str = "learned"
    attn_bias: bool = False
    final_layernorm: bool = True
    head: str = "mlm"
    ln_eps: float = 1e-12
    init_std: float = 0.02

    def __post_init__(self):
        for name in ("n_layers", "hidden", "n_heads", "intermediate", "max_len", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.hidden % self.n_heads:
            raise ValueError(f"n_heads: expected a divisor of hidden={self.hidden}, "
                             f"got {self.n_heads} (remainder {self.hidden % self.n_heads})")
        if self.position not in ("learned", "sinusoidal"):
            raise ValueError(f"position: expected 'learned' or 'sinusoidal', got {self.position!r}")
        if self.head not in ("mlm", "none"):
            raise ValueError(f"head: expected 'mlm' or 'none', got {self.head!r}")
        if not (self.ln_eps >= 0):
            raise ValueError(f"ln_eps: expected >= 0, got {self.ln_eps!r}")
        if not (self.init_std > 0):
            raise ValueError(f"init_std: expected > 0, got {self.init_std!r}")

    @property
    def d_k(self) -> int:
        return self.hidden // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> BertConfig:
        return BertConfig(**{**asdict(self), **changes})


def mini_bert(**overrides) -> BertConfig:
    """The Mini-BERT derivation's model: L=3, H=192, A=4, I=768, T=64, V=8192, learned positions,
    unbiased attention projections, post-LN blocks, a final LayerNorm and an MLM head."""
    return BertConfig(**overrides)


def seed001(**overrides) -> BertConfig:
    """The NumPy-Transformer document's model: 2 layers, d=64, 4 heads, d_ff=256, sinusoidal PE,
    biased projections, post-LN blocks, hidden states out (MSE reconstruction).

    The document states neither vocabulary, sequence length nor LayerNorm eps: V=1000, T=64 and
    eps=1e-5 are our conventions (recorded in the claims ledger)."""
    base = dict(n_layers=2, hidden=64, n_heads=4, intermediate=256, max_len=64, vocab_size=1000,
                position="sinusoidal", attn_bias=True, final_layernorm=False, head="none",
                ln_eps=1e-5)
    return BertConfig(**{**base, **overrides})


PRESETS = {"mini_bert": mini_bert, "seed001": seed001}
