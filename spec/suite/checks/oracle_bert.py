"""Real BERT against ``transformers``: random BertModel / BertForMaskedLM /
BertForSequenceClassification models built from a ``BertConfig`` (no hub access: the weights
are random and saved to a temporary directory), loaded with ``load_pretrained`` and run through
the reference's forward and backward, float64 and float32, with padding and two token types.

Compared: last hidden states, pooled output, logits, loss and *every* parameter gradient, within
ORACLE_RTOL_F64 / ORACLE_RTOL_F32 of the tensor's magnitude (spec/suite/torch_oracle.allowed_error).

Only unpadded positions are compared, and the upstream gradient is zero at padded positions on
both sides: Hugging Face masks padded keys by adding a large finite negative (finfo.min) to the
scores and builds its mask per (query, key) pair, the reference drops padded keys exactly; at a
padded *query* position the two give different, meaningless rows (nothing downstream reads
them).  Unpadded positions never see padded keys in either, so they -- and every parameter
gradient of a loss that reads them only -- must agree.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

from minibert_spec.protocol import IGNORE_INDEX, capabilities
from minibert_spec.protocol.variants import pinned_eps
from minibert_spec.suite.registry import check, lazy_module

torch = lazy_module("torch")
transformers = lazy_module("transformers")
to = lazy_module("minibert_spec.suite.torch_oracle")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

B, T, V, H, A, I, L, C = 3, 7, 41, 12, 3, 24, 2, 3
DTYPES = (("f64", np.float64), ("f32", np.float32))
LAYOUTS = {"BertModel": "none", "BertForMaskedLM": "mlm",
           "BertForSequenceClassification": "classifier"}
EQUATIONS = {
    "BertModel": ("embedding_ln.forward", "embedding_ln.backward", "token_type.forward",
                  "token_type.backward", "gelu.forward.erf", "gelu.backward.erf",
                  "pooler.forward"),
    "BertForMaskedLM": ("mlm_head.forward", "mlm_head.backward", "mlm_head.decoder",
                        "mlm_head.tied", "loss.ce.mean", "loss.ce.backward.mean"),
    "BertForSequenceClassification": ("classifier.forward", "classifier.backward",
                                      "loss.ce.mean", "loss.ce.backward.mean"),
}


def hf_config(act="gelu", **kw):
    """The test's transformers config; ``kw`` adds or overrides fields."""
    return transformers.BertConfig(**{**dict(
        vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=A,
        intermediate_size=I, max_position_embeddings=16, type_vocab_size=2, hidden_act=act,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2,
        num_labels=C), **kw})


def hf_model(arch: str, dtype, seed=0, act="gelu", *, model_kw=None, **config_kw):
    """A random model of ``arch`` in ``dtype``: LayerNorm gamma/beta and every bias random too
    (transformers initialises them to 1 / 0), dropout 0, eager attention.  ``config_kw``
    overrides fields of hf_config; ``model_kw`` goes to the model's constructor."""
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(
        hf_config(act, attn_implementation="eager", **config_kw), **(model_kw or {}))
    assert model.config._attn_implementation == "eager", (
        f"transformers chose {model.config._attn_implementation!r} attention, not eager")
    model = model.to(torch.float64 if dtype == np.float64 else torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def batch(seed=0):
    """Padded rows (lengths 7, 5, 3) of sentence pairs: token type 1 from mid-sequence."""
    rng = np.random.default_rng(seed)
    lengths = np.array([T, 5, 3])
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(0, V, size=(B, T))
    ids[:, 1] = ids[:, 3]  # repeated ids
    ids[:, 2] = 0  # the padding token (id 0): its row gets no gradient from the lookup
    types = (np.arange(T)[None] >= (lengths[:, None] + 1) // 2).astype(np.int64) * mask
    labels = np.where((rng.random((B, T)) < 0.4) & mask.astype(bool),
                      rng.integers(0, V, size=(B, T)), IGNORE_INDEX)
    labels[:, 0] = rng.integers(0, V, size=B)  # every row predicts at least one token
    return ids, mask, types, labels


def torch_grads(model, config, dtype):
    """{our name: torch's gradient in our layout}; the tied table's gradient is the single
    ``word_embeddings.weight.grad`` (both uses accumulate there in torch)."""
    from minibert_reference.hf.checkpoint import _hf_names  # the protocol's names <-> transformers'

    named = {_strip(n): p for n, p in model.named_parameters()}
    out = {}
    for ours, (theirs, transposed) in _hf_names(config).items():
        g = named[theirs].grad
        g = np.zeros(tuple(named[theirs].shape)) if g is None else g.detach().numpy()
        out[ours] = (g.T if transposed else g).astype(dtype)
    return out


def _strip(name):
    return name[len("bert."):] if name.startswith("bert.") else name


def compare_grads(arch, ours: dict, theirs: dict, dtype):
    assert sorted(ours) == sorted(theirs), "gradient keys differ from the checkpoint's parameters"
    scale = to.grad_scale(theirs.values())
    for name in theirs:
        to.assert_oracle(f"{arch} d[{name}]", ours[name], theirs[name], dtype, scale)


def run_case(impl, arch, dtype, part, act="gelu"):
    """A random transformers model saved to a temporary directory and loaded with the
    implementation's ``load_pretrained``; ``part`` "forward" compares the outputs (hidden
    states, pooled output, logits, loss), "backward" every parameter gradient."""
    eps = pinned_eps(capabilities(impl))  # a LayerNorm eps fixed in the code: the checkpoint's
    model = hf_model(arch, dtype, act=act, **({} if eps is None else {"layer_norm_eps": eps}))
    with tempfile.TemporaryDirectory(prefix="minibert-hf-") as tmp:
        model.save_pretrained(tmp)
        config, params = impl.load_pretrained(tmp, dtype=dtype)
    assert config.head == LAYOUTS[arch], f"loaded head {config.head!r}, expected {LAYOUTS[arch]!r}"
    got = next(iter(params.values())).dtype
    assert got == dtype, f"loaded parameters are {got}, asked for {np.dtype(dtype)}"
    ids, mask, types, labels = batch()
    keep = mask.astype(bool)
    t_ids, t_mask, t_types = (torch.from_numpy(a) for a in (ids, mask, types))
    rng = np.random.default_rng(7)
    if arch == "BertModel":
        out = model(input_ids=t_ids, attention_mask=t_mask, token_type_ids=t_types)
        dH = rng.standard_normal((B, T, H)).astype(dtype) * keep[..., None]
        dP = rng.standard_normal((B, H)).astype(dtype)
        ((out.last_hidden_state * torch.from_numpy(dH)).sum()
         + (out.pooler_output * torch.from_numpy(dP)).sum()).backward()
        h, cache = impl.forward(params, config, ids, mask, token_type_ids=types)
        if part == "forward":
            to.assert_oracle("BertModel last_hidden_state", h[keep],
                            out.last_hidden_state.detach().numpy()[keep], dtype)
            to.assert_oracle("BertModel pooler_output", cache.pooled,
                            out.pooler_output.detach().numpy(), dtype)
            return config
        grads, _ = impl.backward(dH, cache, d_pooled=dP)
    else:
        lab = labels if arch == "BertForMaskedLM" else np.array([0, 2, 1])
        out = model(input_ids=t_ids, attention_mask=t_mask, token_type_ids=t_types,
                    labels=torch.from_numpy(lab))
        out.loss.backward()
        if part == "forward":
            logits, _ = impl.forward(params, config, ids, mask, token_type_ids=types)
            t_logits = out.logits.detach().numpy()
            if arch == "BertForMaskedLM":
                to.assert_oracle(f"{arch} logits", logits[keep], t_logits[keep], dtype)
            else:
                to.assert_oracle(f"{arch} logits", logits, t_logits, dtype)
            loss = impl.loss(params, config, ids, labels=lab, attention_mask=mask,
                             token_type_ids=types)
            to.assert_oracle(f"{arch} loss", np.asarray(loss), out.loss.detach().numpy(), dtype)
            return config
        loss, grads, _ = impl.loss_and_grads(params, config, ids, labels=lab,
                                             attention_mask=mask, token_type_ids=types)
    compare_grads(arch, grads, torch_grads(model, config, dtype), dtype)
    return config


# hand-written, not a case family's oracle: the twin is a transformers checkpoint (its names, its
# config and its padding convention), not a torch function of the op's inputs
@check("oracle.forward|oracle.backward", "model.bert", kinds_arg="part", ops=("model",),
       requires=("torch", "transformers"), equations=lambda kw: EQUATIONS[kw["arch"]],
       cases=[(f"{a}-{dl}", {"arch": a, "dtype": dt}) for a in LAYOUTS for dl, dt in DTYPES])
def transformers_checkpoint_forward_and_every_gradient(impl, part, arch, dtype):
    """A random transformers checkpoint (padding, two token types, random LayerNorm and
    biases) loaded with load_pretrained: outputs and every parameter gradient vs transformers."""
    run_case(impl, arch, dtype, part)


@check("oracle.forward|oracle.backward", "model.bert_gelu_new", kinds_arg="part",
       ops=("model",), requires=("torch", "transformers"),
       equations=("gelu.forward.tanh", "gelu.backward.tanh"))
def gelu_new_checkpoint(impl, part):
    """hidden_act="gelu_new" loads as the tanh approximation and matches transformers."""
    config = run_case(impl, "BertForMaskedLM", np.float64, part, act="gelu_new")
    assert config.activation == "gelu_tanh", (
        f"gelu_new loaded as activation {config.activation!r}, expected 'gelu_tanh'")
