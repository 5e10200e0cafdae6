"""The reference's own checkpoints in transformers: our save_pretrained read back by
transformers.from_pretrained gives the same outputs with no missing or unexpected keys, and our
loader reads what we wrote bit for bit; bert_base's parameter count equals transformers'."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from minibert_spec.suite import torch_oracle as to  # noqa: E402
from minibert_spec.suite.checks.oracle_bert import LAYOUTS, A, C, H, I, V, batch  # noqa: E402

pytestmark = pytest.mark.oracle


@pytest.mark.parametrize("arch", list(LAYOUTS))
def test_our_checkpoint_loads_in_transformers(impl, arch, tmp_path):
    """Random reference parameters -> save_pretrained -> transformers.from_pretrained: the same
    outputs (float64), and transformers reports no missing or unexpected keys."""
    from minibert_spec.numerics.finite_differences import random_params

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
        to.assert_oracle("last_hidden_state", ours[keep],
                        out.last_hidden_state.numpy()[keep], np.float64)
        to.assert_oracle("pooler_output", cache.pooled, out.pooler_output.numpy(), np.float64)
    elif arch == "BertForMaskedLM":
        to.assert_oracle("logits", ours[keep], out.logits.numpy()[keep], np.float64)
    else:
        to.assert_oracle("logits", ours, out.logits.numpy(), np.float64)
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
