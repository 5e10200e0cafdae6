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
                     "gelu" (BERT, exact erf), "gelu_tanh" (Hugging Face "gelu_new") or
                     "relu2" (squared ReLU, Hugging Face "relu2")
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
    activation: Literal["relu", "gelu", "gelu_tanh", "relu2"] = "relu"
    type_vocab_size: int = 0
    embedding_layernorm: bool = False
    mlm_style: Literal["linear", "bert"] = "linear"
    pooler: bool = False
    num_labels: int = 2
    pad_token_id: int | None = None

    def __post_init__(self):
        # sizes, the Literal fields (position, head, activation, mlm_style); ln_eps = 0 divides
        # a constant row's zero deviation by zero: NaN, silently
        _check_fields(self, ("n_layers", "hidden", "n_heads", "intermediate", "max_len",
                             "vocab_size"), (), ("ln_eps", "init_std"))
        if self.hidden % self.n_heads:
            raise ValueError(f"n_heads: expected a divisor of hidden={self.hidden}, "
                             f"got {self.n_heads} (remainder {self.hidden % self.n_heads})")
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
def choices(cls=None) -> dict[str, tuple]:
    """Field -> its allowed values, for the fields of a config class (default BertConfig)
    annotated with a ``Literal`` (the one list of each: validation and the tests that try
    every value read it)."""
    cls = BertConfig if cls is None else cls
    hints = get_type_hints(cls)
    return {f.name: get_args(hints[f.name]) for f in fields(cls)
            if getattr(hints[f.name], "__origin__", None) is Literal}


def _check_fields(config, positive: tuple[str, ...], flags: tuple[str, ...],
                  reals: tuple[str, ...]) -> None:
    """A config's fields: ``positive`` integers >= 1, ``flags`` bools, ``reals`` finite > 0,
    every ``Literal`` field one of its values; a ValueError naming the field otherwise."""
    for name in positive:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    for name in flags:
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{name}: expected True or False, got {getattr(config, name)!r}")
    for name, options in choices(type(config)).items():
        if getattr(config, name) not in options:
            listed = ", ".join(map(repr, options[:-1])) + f" or {options[-1]!r}"
            raise ValueError(f"{name}: expected {listed}, got {getattr(config, name)!r}")
    for name in reals:
        value = getattr(config, name)
        if not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                and math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")


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


@dataclass(frozen=True)
class DecoderConfig:
    """Hyper-parameters of a causal decoder (minibert_reference.decoder): token embedding (+
    positions) -> L pre-norm causal blocks -> final norm (or none) -> LM head (+ bias) ->
    next-token cross-entropy.  The two forms Hugging Face has are presets: :func:`gpt2` and
    :func:`llama`; the other fields compose the forms ports write.

    normalization:   "layernorm" (GPT-2: gamma, beta) or "rmsnorm" (LLaMA: gamma only)
    position:        "learned" (GPT-2's wpe table), "rope" (rotary q/k, LLaMA; no table),
                     "learned_rope" (the table *and* rotary q/k, as GPT ports adding RoPE
                     have it), "sinusoidal" (the fixed sin/cos table added to the embedding,
                     no parameters) or "none" (no position signal but the causal mask)
    ffn:             "mlp" (W_2 act(x W_1 + b_1) + b_2) or "swiglu" (LLaMA's gated FFN)
    activation:      the MLP's nonlinearity: "gelu_tanh" (GPT-2's gelu_new), "gelu", "relu",
                     "relu2" (squared ReLU: Primer, the nanoGPT speedrun)
    attn_bias:       biased Q/K/V/O projections (GPT-2) or not (LLaMA)
    mlp_bias:        biased FFN projections (GPT-2) or not (LLaMA)
    tie_embeddings:  the LM head is the token embedding table (logits = h W_E^T, GPT-2) or a
                     matrix of its own ``lm_head.W`` [V, H] (LLaMA's usual)
    final_norm:      the final norm ``final_ln`` before the head (GPT-2's ln_f, LLaMA's norm)
                     or none (the last block's output goes to the head as it is)
    head_bias:       the LM head adds a bias ``lm_head.b`` [V] (tied or untied head)
    rope_convention: which features RoPE rotates together: "half" (i, i + d/2; Hugging Face)
                     or "interleaved" (2i, 2i+1; Meta's original)
    """

    n_layers: int = 2  # L
    hidden: int = 16  # H
    n_heads: int = 2  # A
    intermediate: int = 64  # I
    max_len: int = 16  # T_max (the learned position table's rows)
    vocab_size: int = 32  # V
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["learned", "rope", "learned_rope", "sinusoidal", "none"] = "learned"
    ffn: Literal["mlp", "swiglu"] = "mlp"
    activation: Literal["gelu_tanh", "gelu", "relu", "relu2"] = "gelu_tanh"
    attn_bias: bool = True
    mlp_bias: bool = True
    tie_embeddings: bool = True
    final_norm: bool = True
    head_bias: bool = False
    ln_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_convention: Literal["half", "interleaved"] = "half"
    init_std: float = 0.02

    def __post_init__(self):
        _check_fields(self, ("n_layers", "hidden", "n_heads", "intermediate", "max_len",
                             "vocab_size"), ("attn_bias", "mlp_bias", "tie_embeddings",
                                             "final_norm", "head_bias"),
                      ("ln_eps", "rope_base", "init_std"))
        if self.hidden % self.n_heads:
            raise ValueError(f"n_heads: expected a divisor of hidden={self.hidden}, "
                             f"got {self.n_heads} (remainder {self.hidden % self.n_heads})")
        if self.rope and self.d_k % 2:
            raise ValueError(f"n_heads: RoPE rotates pairs of a head's features, so d_k = "
                             f"hidden / n_heads must be even, got d_k={self.d_k}")

    @property
    def d_k(self) -> int:
        return self.hidden // self.n_heads

    @property
    def position_table(self) -> bool:
        """A learned position table ``embeddings.position.W`` (with or without RoPE)."""
        return self.position in ("learned", "learned_rope")

    @property
    def rope(self) -> bool:
        """Rotary positions on every block's queries and keys (with or without a table)."""
        return self.position in ("rope", "learned_rope")

    def replace(self, **changes) -> DecoderConfig:
        return DecoderConfig(**{**asdict(self), **changes})


def gpt2(**overrides) -> DecoderConfig:
    """GPT-2's form (Hugging Face GPT2LMHeadModel): learned positions, pre-LN blocks with
    LayerNorm eps 1e-5, causal biased attention, a gelu_new MLP of 4H, the final LayerNorm
    ln_f and the LM head tied to the token embedding.  Tiny sizes by default (GPT-2 small:
    n_layers=12, hidden=768, n_heads=12, intermediate=3072, max_len=1024, vocab_size=50257)."""
    return DecoderConfig(**overrides)


def llama(**overrides) -> DecoderConfig:
    """LLaMA's form (Hugging Face LlamaForCausalLM): no position table (RoPE on q and k,
    half-split pairs as Hugging Face stores the weights), pre-RMSNorm blocks (eps 1e-6) without
    biases, a SwiGLU FFN, the final RMSNorm and an LM head of its own (``tie_embeddings``
    declares the tied one).  Tiny sizes by default."""
    base = dict(normalization="rmsnorm", position="rope", ffn="swiglu", activation="gelu_tanh",
                attn_bias=False, mlp_bias=False, tie_embeddings=False, ln_eps=1e-6,
                intermediate=48)
    return DecoderConfig(**{**base, **overrides})


DECODER_PRESETS = {"gpt2": gpt2, "llama": llama}
