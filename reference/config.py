"""Model configuration and the two presets the source documents describe."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields
from functools import cache
from typing import Literal, get_args, get_type_hints


@dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of an encoder.  Names follow the Mini-BERT derivation (L, H, A, I, T, V).

    position:        "learned" (BERT, Mini-BERT) or "sinusoidal" (NumPy-Transformer document)
    attn_bias:       biased Q/K/V/O projections (NumPy-Transformer document) or not (Mini-BERT)
    final_layernorm: the extra LayerNorm before the head (Mini-BERT derivation §2.6)
    head:            "mlm" (logits over V), "none" (hidden states, e.g. for MSE reconstruction)
                     or "classifier" (logits over num_labels from the tanh pooler, BERT-base blog)
    activation:      the FFN's (and BERT MLM transform's) nonlinearity: "relu" (the documents),
                     "gelu" (BERT, exact erf) or "gelu_tanh" (Hugging Face "gelu_new")
    type_vocab_size: token-type (segment) embeddings; 0 = none (the documents), 2 = BERT
    embedding_layernorm: LayerNorm of token + position + type embeddings (BERT)
    mlm_style:       head "mlm": "linear" (one untied linear layer, Mini-BERT) or "bert" (dense ->
                     activation -> LayerNorm -> decoder tied to the word embeddings + bias)
    pooler:          head "none": also compute the tanh pooler's output (BertModel)
    num_labels:      classes of head "classifier"
    pad_token_id:    the padding token, whose embedding row gets no gradient from the lookup
                     (Hugging Face's nn.Embedding(padding_idx=pad_token_id)); None: every row
    """

    n_layers: int = 3  # L
    hidden: int = 192  # H
    n_heads: int = 4  # A
    intermediate: int = 768  # I
    max_len: int = 64  # T
    vocab_size: int = 8192  # V
    position: Literal["learned", "sinusoidal"] = "learned"
    attn_bias: bool = False
    final_layernorm: bool = True
    head: Literal["mlm", "none", "classifier"] = "mlm"
    ln_eps: float = 1e-12
    init_std: float = 0.02
    activation: Literal["relu", "gelu", "gelu_tanh"] = "relu"
    type_vocab_size: int = 0
    embedding_layernorm: bool = False
    mlm_style: Literal["linear", "bert"] = "linear"
    pooler: bool = False
    num_labels: int = 2
    pad_token_id: int | None = None

    def __post_init__(self):
        for name in ("n_layers", "hidden", "n_heads", "intermediate", "max_len", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.hidden % self.n_heads:
            raise ValueError(f"n_heads: expected a divisor of hidden={self.hidden}, "
                             f"got {self.n_heads} (remainder {self.hidden % self.n_heads})")
        for name, options in choices().items():  # position, head, activation, mlm_style
            if getattr(self, name) not in options:
                listed = ", ".join(map(repr, options[:-1])) + f" or {options[-1]!r}"
                raise ValueError(f"{name}: expected {listed}, got {getattr(self, name)!r}")
        for name in ("type_vocab_size", "num_labels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: expected an integer >= 0, got {value!r}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id: expected None or an id in [0, {self.vocab_size}), "
                             f"got {self.pad_token_id!r}")
        if self.num_labels < 1:
            raise ValueError(f"num_labels: expected >= 1, got {self.num_labels}")
        if self.embedding_layernorm and (self.type_vocab_size < 1 or self.position != "learned"):
            raise ValueError("embedding_layernorm: needs type_vocab_size >= 1 and learned "
                             f"positions, got type_vocab_size={self.type_vocab_size}, "
                             f"position={self.position!r}")
        # ln_eps = 0 divides a constant row's zero deviation by zero: NaN, silently
        for name in ("ln_eps", "init_std"):
            value = getattr(self, name)
            if not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                    and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")

    @property
    def d_k(self) -> int:
        return self.hidden // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> BertConfig:
        return BertConfig(**{**asdict(self), **changes})

    @classmethod
    def from_dict(cls, fields: dict) -> BertConfig:
        """The config of a ``to_dict`` (a checkpoint's), older ones included: a retired field
        is accepted at the value every model now has, refused at any other."""
        fields = dict(fields)
        for name, value in RETIRED_FIELDS.items():
            got = fields.pop(name, value)
            if got != value:
                raise ValueError(f"{name}: a retired field, only {value!r} is supported, got "
                                 f"{got!r}")
        return cls(**fields)


# fields of earlier versions -> the value the model now always has (``blog_literal``: the
# BERT-base blog's literal forward lives beside its refuted claim, spec/claims/blog.py)
RETIRED_FIELDS = {"blog_literal": False}


@cache
def choices() -> dict[str, tuple]:
    """Field -> its allowed values, for the fields annotated with a ``Literal`` (the one list
    of each: validation and the tests that try every value read it)."""
    hints = get_type_hints(BertConfig)
    return {f.name: get_args(hints[f.name]) for f in fields(BertConfig)
            if getattr(hints[f.name], "__origin__", None) is Literal}


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


def bert_base(**overrides) -> BertConfig:
    """BERT-base (the BERT-base blog's sizes: 12 layers, H=768, 12 heads, I=3072, 512 positions)
    as Hugging Face's BertModel builds it: V=30522, 2 token types, embedding LayerNorm, biased
    Q/K/V/O, exact GELU, post-LN blocks without a final LayerNorm, tanh pooler; head "none"
    returns the last hidden states."""
    base = dict(n_layers=12, hidden=768, n_heads=12, intermediate=3072, max_len=512,
                vocab_size=30522, position="learned", attn_bias=True, final_layernorm=False,
                head="none", ln_eps=1e-12, activation="gelu", type_vocab_size=2,
                embedding_layernorm=True, mlm_style="bert", pooler=True, pad_token_id=0)
    return BertConfig(**{**base, **overrides})


def bert_tiny(**overrides) -> BertConfig:
    """A tiny BERT for tests: bert_base's architecture at L=2, H=16, A=2, I=32, T=32, V=50, with
    the BERT MLM head (decoder tied to the word embeddings) and no padding row (pad_token_id
    None: every gradient is the loss's true gradient, for finite differences)."""
    base = dict(n_layers=2, hidden=16, n_heads=2, intermediate=32, max_len=32, vocab_size=50,
                head="mlm", pooler=False, pad_token_id=None)
    return bert_base(**{**base, **overrides})


PRESETS = {"mini_bert": mini_bert, "seed001": seed001, "bert_base": bert_base,
           "bert_tiny": bert_tiny}
