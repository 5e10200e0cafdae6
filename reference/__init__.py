"""minibert-spec reference implementation: a pure-NumPy BERT encoder with a hand-written backward.

Every op is a pair ``X_forward(...) -> (out, cache)`` / ``X_backward(dout, cache) -> grads``.
The maths here (ops, model, optim, accumulation, config, validate, registry) imports NumPy and
the standard library only; training tooling lives in the ``minibert_reference.train`` sub-package.
float32 and float64 go through the same code.
"""

from minibert_reference.accumulation import accumulate_gradients
from minibert_reference.config import (
    BertConfig,
    DecoderConfig,
    bert_base,
    bert_tiny,
    gpt2,
    llama,
    mini_bert,
    seed001,
)
from minibert_reference.data_parallel import (  # the model's entry points on batch shards
    backward,
    forward,
    loss,
    loss_and_grads,
    masked_lm_loss_and_grads,
)
from minibert_reference.decoder import (  # the causal decoder (GPT-2 and LLaMA forms)
    decoder_backward,
    decoder_forward,
    decoder_loss,
    decoder_loss_and_grads,
)
from minibert_reference.model import embed, init_params, param_shapes
from minibert_reference.optim import (
    adam_init,
    adam_step,
    clip_by_global_norm,
    global_grad_norm,
    warmup_linear_lr,
)

__all__ = [
    "BertConfig",
    "DecoderConfig",
    "gpt2",
    "llama",
    "decoder_forward",
    "decoder_backward",
    "decoder_loss",
    "decoder_loss_and_grads",
    "bert_base",
    "bert_tiny",
    "load_pretrained",
    "save_pretrained",
    "accumulate_gradients",
    "adam_init",
    "adam_step",
    "clip_by_global_norm",
    "global_grad_norm",
    "warmup_linear_lr",
    "backward",
    "embed",
    "forward",
    "init_params",
    "loss",
    "loss_and_grads",
    "masked_lm_loss_and_grads",
    "mini_bert",
    "param_shapes",
    "seed001",
]



def load_pretrained(path, dtype=None):
    """``(config, params)`` from a Hugging Face BERT directory (config.json + model.safetensors);
    see :func:`minibert_reference.hf.checkpoint.load_pretrained` (needs the ``safetensors``
    package).
    The maths modules stay NumPy-only: the tooling is imported on first use."""
    from minibert_reference.hf.checkpoint import load_pretrained as _load

    return _load(path) if dtype is None else _load(path, dtype=dtype)


def save_pretrained(params, config, path):
    """Write a Hugging Face BERT directory that ``transformers`` loads; see
    :func:`minibert_reference.hf.checkpoint.save_pretrained`."""
    from minibert_reference.hf.checkpoint import save_pretrained as _save

    return _save(params, config, path)


# Every variant of the protocol the reference implements (spec/protocol/capabilities.py,
# VARIANTS): the judging suite checks the reference in each form, as it checks an
# implementation declaring one of them.
CAPABILITIES = {
    "layernorm": {"affine": (True, False), "eps": (True, False)},
    "rmsnorm": {"gain": (True, False), "eps": (True, False)},
    "rope": {"convention": ("interleaved", "half")},
    "ffn": {"b_1": (True, False), "b_2": (True, False),
            "activation": ("relu", "gelu", "gelu_tanh", "relu2")},
    "swiglu": {"bias": (False, True)},
    "attention": {"W_o": (True, False), "causal": (False, True),
                  "rope": (None, "interleaved", "half")},
    "block": {"norm": ("post", "pre", "pre_final", "inner"), "causal": (False, True),
              "normalization": ("layernorm", "rmsnorm"), "ffn": ("mlp", "swiglu")},
    "cross_entropy": {"input": ("logits", "probabilities", "probabilities_dlogits")},
    "decoder": {"tied": (True, False),
                "position": ("learned", "rope", "learned_rope", "sinusoidal", "none"),
                "final_norm": (True, False), "head_bias": (False, True)},
}

# The op pairs are part of the implementation protocol: tests reach them as ``impl.<name>``.
from minibert_reference.ops import *  # noqa: E402,F403
from minibert_reference.ops import __all__ as _ops_all  # noqa: E402

__all__ += _ops_all
