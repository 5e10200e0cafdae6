"""Real BERT against ``transformers``: random BertModel / BertForMaskedLM /
BertForSequenceClassification models built from a ``BertConfig`` (no hub access: the weights
are random and saved to a temporary directory), loaded with ``load_pretrained`` and run through
the reference's forward and backward, float64 and float32, with padding and two token types.

Compared: last hidden states, pooled output, logits, loss and *every* parameter gradient, within
ORACLE_RTOL_F64 / ORACLE_RTOL_F32 of the tensor's magnitude (tests/torch_oracle.allowed_error).

Only unpadded positions are compared, and the upstream gradient is zero at padded positions on
both sides: Hugging Face masks padded keys by adding a large finite negative (finfo.min) to the
scores and builds its mask per (query, key) pair, the reference drops padded keys exactly; at a
padded *query* position the two give different, meaningless rows (nothing downstream reads
them).  Unpadded positions never see padded keys in either, so they -- and every parameter
gradient of a loss that reads them only -- must agree.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from reference.hf.checkpoint import _hf_names  # noqa: E402
from tests import torch_oracle as to  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.oracle

B, T, V, H, A, I, L, C = 3, 7, 41, 12, 3, 24, 2, 3
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
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
    assert model.config._attn_implementation == "eager"
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
                      rng.integers(0, V, size=(B, T)), -100)
    labels[:, 0] = rng.integers(0, V, size=B)  # every row predicts at least one token
    return ids, mask, types, labels


def torch_grads(model, config, dtype):
    """{our name: torch's gradient in our layout}; the tied table's gradient is the single
    ``word_embeddings.weight.grad`` (both uses accumulate there in torch)."""
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
        to.assert_close(f"{arch} d[{name}]", ours[name], theirs[name], dtype, scale)


def run_case(impl, arch, dtype, tmp_path, act="gelu"):
    model = hf_model(arch, dtype, act=act)
    model.save_pretrained(tmp_path)
    config, params = impl.load_pretrained(tmp_path, dtype=dtype)
    assert config.head == LAYOUTS[arch] and next(iter(params.values())).dtype == dtype
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
        to.assert_close("BertModel last_hidden_state", h[keep],
                        out.last_hidden_state.detach().numpy()[keep], dtype)
        to.assert_close("BertModel pooler_output", cache.pooled,
                        out.pooler_output.detach().numpy(), dtype)
        grads, _ = impl.backward(dH, cache, d_pooled=dP)
    else:
        lab = labels if arch == "BertForMaskedLM" else np.array([0, 2, 1])
        out = model(input_ids=t_ids, attention_mask=t_mask, token_type_ids=t_types,
                    labels=torch.from_numpy(lab))
        out.loss.backward()
        logits, _ = impl.forward(params, config, ids, mask, token_type_ids=types)
        t_logits = out.logits.detach().numpy()
        if arch == "BertForMaskedLM":
            to.assert_close(f"{arch} logits", logits[keep], t_logits[keep], dtype)
        else:
            to.assert_close(f"{arch} logits", logits, t_logits, dtype)
        loss, grads, _ = impl.loss_and_grads(params, config, ids, labels=lab,
                                             attention_mask=mask, token_type_ids=types)
        to.assert_close(f"{arch} loss", np.asarray(loss), out.loss.detach().numpy(), dtype)
    compare_grads(arch, grads, torch_grads(model, config, dtype), dtype)
    return model, config, params


@pytest.mark.parametrize("arch", [pytest.param(a, id=a, marks=pytest.mark.equation(*EQUATIONS[a]))
                                  for a in LAYOUTS])
@DTYPES
def test_transformers_checkpoint_forward_and_every_gradient(impl, arch, dtype, tmp_path):
    run_case(impl, arch, dtype, tmp_path)


@pytest.mark.equation("gelu.forward.tanh", "gelu.backward.tanh")
def test_gelu_new_checkpoint(impl, tmp_path):
    """hidden_act="gelu_new" loads as the tanh approximation and matches transformers."""
    _, config, _ = run_case(impl, "BertForMaskedLM", np.float64, tmp_path, act="gelu_new")
    assert config.activation == "gelu_tanh"


@pytest.mark.parametrize("arch", list(LAYOUTS))
def test_our_checkpoint_loads_in_transformers(impl, arch, tmp_path):
    """Random reference parameters -> save_pretrained -> transformers.from_pretrained: the same
    outputs (float64), and transformers reports no missing or unexpected keys."""
    from spec.gradcheck import random_params

    num_labels = C if arch == "BertForSequenceClassification" else 2
    config = impl.bert_tiny(head=LAYOUTS[arch], pooler=arch == "BertModel", num_labels=num_labels,
                            vocab_size=V, hidden=H, n_heads=A, intermediate=I, max_len=16)
    params = random_params(impl, config, seed=3)
    impl.save_pretrained(params, config, tmp_path)
    model, info = getattr(transformers, arch).from_pretrained(
        tmp_path, attn_implementation="eager", output_loading_info=True, dtype=torch.float64)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    model.eval()
    ids, mask, types, _ = batch(1)
    keep = mask.astype(bool)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    token_type_ids=torch.from_numpy(types))
    ours, cache = impl.forward(params, config, ids, mask, token_type_ids=types)
    if arch == "BertModel":
        to.assert_close("last_hidden_state", ours[keep],
                        out.last_hidden_state.numpy()[keep], np.float64)
        to.assert_close("pooler_output", cache.pooled, out.pooler_output.numpy(), np.float64)
    elif arch == "BertForMaskedLM":
        to.assert_close("logits", ours[keep], out.logits.numpy()[keep], np.float64)
    else:
        to.assert_close("logits", ours, out.logits.numpy(), np.float64)
    # and back: our loader reads what we wrote, bit for bit
    config2, params2 = impl.load_pretrained(tmp_path, dtype=np.float64)
    assert config2 == config
    assert all(np.array_equal(params2[k], params[k]) for k in params)


def test_bert_base_parameter_count_matches_transformers(impl):
    """bert_base's parameter count = transformers' own count of BertModel(BertConfig()) (the
    pooler included), built on the meta device (no memory, no download)."""
    with torch.device("meta"):
        model = transformers.BertModel(transformers.BertConfig())
    theirs = model.num_parameters()
    ours = sum(int(np.prod(s)) for s in impl.param_shapes(impl.bert_base()).values())
    assert ours == theirs == 109_482_240
