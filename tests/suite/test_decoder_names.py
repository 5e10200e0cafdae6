"""``minibert_spec.suite.adapters.decoder``: the decoder row from a model with its own parameter
names, the map applied exactly both ways (tests/examples/wm_decoder.py's names: per-layer
``h.{i}.*``, a fused ``c_attn`` joining W_q | W_k | W_v, a head stored [H, V]).  A stand-in
model stands behind it here: its forward keeps what it was given, its backward returns
``2 * param`` under the same names, so a round trip must give back exactly twice the
protocol's parameters; the real decoders are judged through it in test_decoder_forms.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

from minibert_reference.config import DecoderConfig
from minibert_reference.decoder import init_params
from minibert_spec.protocol import NotApplicable
from minibert_spec.suite.adapters import DecoderRow, decoder
from tests.examples.wm_decoder import FUSED, NAMES

CONFIG = DecoderConfig(n_layers=2, hidden=8, n_heads=2, intermediate=16, vocab_size=13,
                       max_len=8, normalization="rmsnorm", position="learned_rope",
                       tie_embeddings=False, final_norm=False, head_bias=True)
IDS = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])


def params(config=CONFIG) -> dict:
    return init_params(config, seed=3, dtype=np.float64)


def stand_in(drop=(), add=(), none=(), reshape=()):
    """(forward, backward) of a stand-in model: the backward's gradient of each tensor is twice
    the tensor; ``drop`` / ``none`` / ``add`` / ``reshape``: names it leaves out, gives None,
    adds, or cuts to half its last axis (the bugs of a hand-written name map)."""

    def forward(own, config, input_ids):
        logits = np.zeros(input_ids.shape + (config.vocab_size,))
        return logits, dict(own)

    def backward(dlogits, own):
        g = {k: 2 * v for k, v in own.items() if k not in drop}
        g.update({k: None for k in none})
        g.update({k: np.zeros(3) for k in add})
        g.update({k: g[k][..., : g[k].shape[-1] // 2] for k in reshape})
        return g

    return forward, backward


def row(*model, **kw) -> DecoderRow:
    declared = {"names": NAMES, "fused": FUSED, "transposed": ("lm_head.w",),
                "loss": lambda logits: (0.0, np.zeros_like(logits)), **kw}
    return decoder(*(model or stand_in()), **declared)


def test_round_trip_gives_every_protocol_tensor_back_exactly_once():
    p = params()
    logits, cache = row().decoder_forward(p, CONFIG, IDS)
    grads = row().decoder_backward(logits, cache)
    assert list(grads) == list(p)  # every key, in the params' order, nothing more
    for k in p:
        np.testing.assert_array_equal(grads[k], 2 * p[k], err_msg=k)
        assert grads[k].shape == p[k].shape, k


def test_fused_tensor_joins_q_k_v_side_by_side_and_splits_back():
    p = params()
    own = row().decoder_forward(p, CONFIG, IDS)[1].cache
    for i in range(CONFIG.n_layers):
        for w, n in (("W", "w"), ("b", "b")):
            parts = [p[f"layers.{i}.attn.{w}_{q}"] for q in "qkv"]
            np.testing.assert_array_equal(own[f"h.{i}.attn.c_attn.{n}"],
                                          np.concatenate(parts, -1))
    assert own["h.1.attn.c_attn.w"].shape == (8, 24)
    assert not any(k.startswith("layers.") for k in own)  # only the model's names reach it


def test_transposed_head_is_given_as_h_by_v_and_its_gradient_returned_as_v_by_h():
    p = params()
    logits, cache = row().decoder_forward(p, CONFIG, IDS)
    assert cache.cache["lm_head.w"].shape == (8, 13)
    np.testing.assert_array_equal(cache.cache["lm_head.w"], p["lm_head.W"].T)
    np.testing.assert_array_equal(row().decoder_backward(logits, cache)["lm_head.W"],
                                  2 * p["lm_head.W"])


@pytest.mark.parametrize("model, named", [
    (stand_in(drop=("h.1.attn.c_attn.b",)), r"lack \['h.1.attn.c_attn.b'\] \(of "
                                             r"\['layers.1.attn.b_q', 'layers.1.attn.b_k', "
                                             r"'layers.1.attn.b_v'\]\)"),
    (stand_in(none=("wpe",)), r"lack \['wpe'\] \(of \['embeddings.position.W'\]\)"),
    (stand_in(add=("ln_f.g",)), r"gradients \['ln_f.g'\] are of no parameter"),
    (stand_in(reshape=("h.0.attn.c_attn.w",)),
     r"'h.0.attn.c_attn.w' has shape \(8, 12\): expected a last axis of 24 \(8 \+ 8 \+ 8"),
])
def test_a_gradient_missing_none_extra_or_misshapen_is_refused_naming_it(model, named):
    logits, cache = row(*model).decoder_forward(params(), CONFIG, IDS)
    with pytest.raises(ValueError, match=named):
        row(*model).decoder_backward(logits, cache)


def test_a_protocol_tensor_no_rule_maps_is_refused_naming_it():
    p = {**params(), "final_ln.gamma": np.ones(8)}  # a form the names do not cover
    with pytest.raises(ValueError, match=r"params \['final_ln.gamma'\]: no name of the model"):
        row().decoder_forward(p, CONFIG, IDS)


def test_a_fused_tensor_with_a_part_missing_is_refused_naming_the_part():
    p = {k: v for k, v in params().items() if k != "layers.0.attn.b_k"}
    with pytest.raises(ValueError, match=r"not \['layers.0.attn.b_k'\]: the model's "
                                         r"'h.0.attn.c_attn.b' joins"):
        row().decoder_forward(p, CONFIG, IDS)


def test_a_form_without_biases_maps_only_what_it_has():
    config = DecoderConfig(n_layers=1, hidden=8, n_heads=2, intermediate=16, vocab_size=13,
                           max_len=8, normalization="rmsnorm", position="learned_rope",
                           tie_embeddings=False, final_norm=False, head_bias=True,
                           attn_bias=False, mlp_bias=False)
    p = params(config)
    logits, cache = row().decoder_forward(p, config, IDS)
    assert "h.0.attn.c_attn.b" not in cache.cache and "h.0.attn.c_attn.w" in cache.cache
    assert list(row().decoder_backward(logits, cache)) == list(p)


@pytest.mark.parametrize("change, message", [
    ({"names": {**NAMES, "attn.Wq": "h.{i}.q"}}, r"names names 'attn.Wq': expected a parameter "
                                                 r"name of the decoder row"),
    ({"names": {**NAMES, "ln1.gamma": "ln_1.g"}}, r"names\['ln1.gamma'\]: 'layers.{i}.ln1.gamma'"
                                                  r" is in every layer: expected a name holding"
                                                  r" {i}, the layer index, got 'ln_1.g'"),
    ({"names": {**NAMES, "ln2.gamma": "h.{i}.ln_1.g"}}, r"the model's name 'h.0.ln_1.g' is "
                                                        r"mapped twice"),
    ({"names": {**NAMES, "attn.W_q": "h.{i}.q"}}, r"protocol name 'layers.0.attn.W_q' is mapped"
                                                  r" twice"),
    ({"transposed": ("lm_head.W",)}, r"transposed names \['lm_head.W'\]: expected the model's "
                                     r"names"),
    ({"fused": {"h.{i}.qk": ("attn.W_q",)}}, r"fused\['h.{i}.qk'\]: expected a tuple of two or "
                                             r"more protocol names, got \('attn.W_q',\)"),
    ({"fused": {"h.{i}.x": ("attn.W_q", "lm_head.b")}}, r"fused\['h.{i}.x'\] joins \['attn.W_q',"
                                                        r" 'lm_head.b'\]: expected names of one"),
    ({"loss": lambda labels: (0.0, 0.0)}, r"loss takes \['labels'\]: expected names among "
                                          r"logits, labels, input_ids, ignore_index, cache"),
    ({"loss": lambda logits, weights: (0.0, 0.0)}, r"loss takes \['logits', 'weights'\]"),
])
def test_a_wrong_declaration_is_refused_at_declaration_naming_it(change, message):
    with pytest.raises(ValueError, match=message):
        row(**change)


def test_loss_and_grads_passes_what_the_loss_names_and_calls_a_closures_gradient():
    seen = {}

    def loss(logits, labels, ignore_index):  # closure-style: (loss, dloss -> dlogits)
        seen.update(labels=labels, ignore_index=ignore_index)
        return 1.5, lambda dloss: np.full_like(logits, dloss)

    p = params()
    value, grads = row(loss=loss).decoder_loss_and_grads(p, CONFIG, IDS, ignore_index=0)
    assert value == 1.5 and seen["ignore_index"] == 0 and seen["labels"] is IDS
    assert list(grads) == list(p)
    np.testing.assert_array_equal(grads["lm_head.W"], 2 * p["lm_head.W"])


def test_a_loss_without_ignore_index_or_labels_is_not_applicable_to_other_values():
    r = row()  # its loss names logits alone
    assert r.decoder_loss_and_grads(params(), CONFIG, IDS)[0] == 0.0  # the protocol defaults
    with pytest.raises(NotApplicable, match="takes no ignore_index"):
        r.decoder_loss_and_grads(params(), CONFIG, IDS, ignore_index=0)
    with pytest.raises(NotApplicable, match="takes no labels"):
        r.decoder_loss_and_grads(params(), CONFIG, IDS, labels=IDS[:, ::-1].copy())


def test_the_row_unpacks_as_the_three_protocol_functions_with_its_declaration():
    declared = {"decoder": {"position": "learned_rope"}}
    r = row(capabilities=declared)
    forward, backward, loss_and_grads = r
    assert (forward.__name__, backward.__name__, loss_and_grads.__name__) == (
        "decoder_forward", "decoder_backward", "decoder_loss_and_grads")
    assert r.CAPABILITIES == declared and r.decoder_forward is forward
    assert re.search(r"adapters\.decoder", forward.__doc__)
