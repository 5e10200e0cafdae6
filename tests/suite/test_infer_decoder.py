"""``minibert adapter infer``'s decoder row (minibert_spec.suite.infer.decoder): a whole
decoder-only LM's names read onto the protocol's and confirmed by its logits alone, its form
decided by the forward, the model's backward wired as it is -- on tests/examples/wm_decoder.py
(fused c_attn, a transposed head, learned + RoPE positions) and variants of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert_reference.config import DecoderConfig
from minibert_reference.decoder import param_shapes
from minibert_spec.suite.adapters import decoder
from minibert_spec.suite.infer import infer, infer_source
from minibert_spec.suite.infer.decoder import DecoderMapping
from minibert_spec.suite.infer.decoder_recorded import infer_decoder
from tests.examples import realstyle_gpt, wm_decoder
from tests.suite.infer_support import exec_source, load_source
from tests.unshrunk import check_implementation

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.examples.wm_decoder"


def _row(mod) -> tuple[DecoderMapping | None, list]:
    rows, why = infer_decoder(mod)
    return (rows[0] if rows else None), why


def test_wm_decoder_maps_to_its_hand_adapters_names_and_form():
    m, why = _row(wm_decoder)
    assert isinstance(m, DecoderMapping), why
    assert m.names == wm_decoder.NAMES and m.fused == wm_decoder.FUSED
    assert m.transposed == ("lm_head.w",)
    hand = wm_decoder.DECODER.__dict__.get("CAPABILITIES") or wm_decoder.decoder_ops().CAPABILITIES
    assert m.declares["decoder"] == hand["decoder"]
    assert m.declares["block"]["normalization"] == hand["block"]["normalization"]
    assert m.declares["attention"]["rope"] == "half"
    assert m.declares["ffn"]["activation"] == "gelu_tanh"
    assert "impl.make(n_heads=config.n_heads, rope_base=config.rope_base)" in m.code
    assert "loss=impl.next_token_loss" in m.code
    assert any("equal minibert_reference.decoder.decoder_forward's" in e for e in m.evidence)
    assert any("never compared" in e for e in m.evidence)


def test_the_row_is_written_and_its_forward_is_the_reference_form():
    """infer() writes the row; the adapter's decoder_forward, as written, equals the reference
    decoder's logits in the declared form (the adapter, not only the map)."""
    from minibert_reference.decoder import decoder_forward

    mappings, _ = infer(wm_decoder)
    assert [m.op for m in mappings if isinstance(m, DecoderMapping)] == ["decoder"]
    adapter = exec_source(infer_source(MODULE))
    config = DecoderConfig(n_layers=3, hidden=8, n_heads=2, intermediate=16, max_len=8,
                           vocab_size=13, normalization="rmsnorm", position="learned_rope",
                           tie_embeddings=False, final_norm=False, head_bias=True, ln_eps=1e-6,
                           rope_base=500000.0)
    rng = np.random.default_rng(5)
    params = {k: rng.standard_normal(s) / 2 for k, s in param_shapes(config).items()}
    ids = rng.integers(0, 13, (2, 6))
    got = adapter.decoder_forward(params, config, ids)[0]
    want = decoder_forward(params, config, ids)[0]
    assert np.max(np.abs(got - want)) <= 1e-12 * np.max(np.abs(want))
    grads = adapter.decoder_backward(np.ones_like(got), adapter.decoder_forward(params, config,
                                                                                ids)[1])
    assert list(grads) == list(params)


def test_a_buggy_backward_is_mapped_the_same_way(monkeypatch):
    """Gradients are never compared: a planted backward bug changes no decision (minibert
    check is what turns it red)."""
    correct, _ = _row(wm_decoder)
    monkeypatch.setattr(wm_decoder.make, "__defaults__", ("head_bias",))
    buggy, _ = _row(wm_decoder)
    assert buggy is not None and buggy.code == correct.code
    assert buggy.declares == correct.declares


def _check_json(target: str, *paths: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)])}
    proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", target, "--ops",
                           "decoder", "--format", "json", "-j", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_inferred_adapters_verdict_equals_the_hand_adapters(tmp_path):
    """``minibert check <adapter> --ops decoder --format json``: the adapter infer writes gives
    the hand adapter's verdict, check by check, on the correct model."""
    (tmp_path / "inferred_wm_decoder.py").write_text(infer_source(MODULE))
    inferred = _check_json("inferred_wm_decoder", str(tmp_path))
    hand = _check_json(f"{MODULE}:DECODER")
    assert inferred["exit_code"] == hand["exit_code"] == 0, inferred["summary"]
    assert inferred["counts"] == hand["counts"]
    assert inferred["ops"] == hand["ops"]


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["head_bias", "rmsnorm", "wpe", "rope"])
def test_a_planted_backward_bug_is_red_under_the_inferred_adapter(bug, monkeypatch):
    """Issue 39's "no adapter under which a bug passes": ``make(bug=...)``'s default set to
    the bug, infer writes the row and minibert check finds it FAIL, as under the hand adapter
    ``decoder_ops(bug)``."""
    monkeypatch.setattr(wm_decoder.make, "__defaults__", (bug,))
    source = infer_source(MODULE)
    assert "decoder_forward, decoder_backward, decoder_loss_and_grads = decoder(" in source
    inferred = check_implementation(exec_source(source), ops=["decoder"], first_red=True)
    hand = check_implementation(wm_decoder.decoder_ops(bug), ops=["decoder"], first_red=True)
    assert inferred.verdicts()["decoder"] == hand.verdicts()["decoder"] == "FAIL"


# wm_decoder under other names: the two norms' gains spelt as nothing infer reads ("g_a",
# "g_b"), which of them is ln_1 chosen by RENAME
VARIANT = '''
from tests.examples import wm_decoder as base

RENAME = {RENAME!r}
BACK = {{v: k for k, v in RENAME.items()}}


def _ours(name):
    for old, new in RENAME.items():
        name = name.replace(old, new)
    return name


def _theirs(name):
    for new, old in BACK.items():
        name = name.replace(new, old)
    return name


def init_params():
    return {{_ours(k): v for k, v in base.init_params().items()}}


def make(*, n_heads=2, rope_base=10000.0):
    forward, backward = base.make(n_heads=n_heads, rope_base=rope_base)

    def logits_forward(params, idx):
        return forward.logits({{_theirs(k): v for k, v in params.items()}}, idx)

    def logits_backward(dlogits, cache):
        return {{_ours(k): v for k, v in backward.logits(dlogits, cache).items()}}

    return logits_forward, logits_backward


def next_token_loss(logits, labels, ignore_index=-100):
    return base.next_token_loss(logits, labels, ignore_index)
'''


@pytest.mark.parametrize("first", ["g_a", "g_b"])
def test_names_read_as_nothing_are_decided_by_the_forward(first, tmp_path, monkeypatch):
    """Two gains of one shape whose names say nothing: each order is tried, and the one whose
    logits equal the reference's is kept -- whichever it is (not the order of the names)."""
    other = {"g_a": "g_b", "g_b": "g_a"}[first]
    rename = {"ln_1.g": first, "ln_2.g": other}
    mod = load_source(tmp_path, monkeypatch, VARIANT.format(RENAME=rename), f"dec_{first}")
    m, why = _row(mod)
    assert m is not None, why
    assert m.names["ln1.gamma"] == f"h.{{i}}.{first}"
    assert m.names["ln2.gamma"] == f"h.{{i}}.{other}"


def test_names_that_cannot_be_read_give_a_reason_and_no_row(tmp_path, monkeypatch):
    """Names that read as nothing at all (p0, p1, ...): no token table to size the model by,
    so no row, and one line saying so."""
    source = VARIANT.format(RENAME={}) + '''

_KEYS = sorted(base.init_params())


def init_params():
    return {f"p{k}": v for k, v in enumerate(base.init_params().values())}
'''
    mod = load_source(tmp_path, monkeypatch, source, "dec_opaque")
    m, why = _row(mod)
    assert m is None
    assert len(why) == 1 and why[0].startswith("decoder: init_params(): no tensor reads as the "
                                               "token embedding"), why


def test_transposed_names_a_per_layer_tensor_in_every_layer():
    """decoder(transposed=("h.{i}....",)): a per-layer pattern is transposed in every layer,
    both ways (it was accepted and then applied to none)."""
    config = DecoderConfig(n_layers=2, hidden=8, n_heads=2, intermediate=12, vocab_size=11)
    names = {**{k: k for k in param_shapes(config) if not k.startswith("layers.")},
             **{k.split(".", 2)[2]: "h.{i}." + k.split(".", 2)[2]
                for k in param_shapes(config) if k.startswith("layers.0.")}}
    given = {}

    def forward(params, config, ids):
        given.update(params)
        return np.zeros(ids.shape + (11,)), params

    row = decoder(forward, lambda dlogits, params: dict(params), names=names,
                  transposed=("h.{i}.attn.W_o",), loss=lambda logits: (0.0, logits))
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s) for k, s in param_shapes(config).items()}
    logits, cache = row.decoder_forward(params, config, np.zeros((1, 3), int))
    for i in range(2):
        np.testing.assert_array_equal(given[f"h.{i}.attn.W_o"], params[f"layers.{i}.attn.W_o"].T)
        np.testing.assert_array_equal(given[f"h.{i}.attn.W_q"], params[f"layers.{i}.attn.W_q"])
    back = row.decoder_backward(logits, cache)
    for k in params:
        np.testing.assert_array_equal(back[k], params[k])


# realstyle_gpt's MiniGPT (a class over the dict, GPT-2's names) in a module that also gives its
# parameters: tied, learned positions, LayerNorm, a gelu_new MLP, the final norm
GPT_INIT = '''
import numpy as np
from tests.examples import realstyle_gpt as base

V, H, I, T_MAX, LAYERS = 11, 8, 12, 9, 2


class MiniGPT(base.MiniGPT):
    """realstyle_gpt's model, in a module with its parameter source."""


def init_params(seed=0):
    rng = np.random.default_rng(seed)
    p = {"wte": rng.normal(0, 0.5, (V, H)), "wpe": rng.normal(0, 0.3, (T_MAX, H))}
    for i in range(LAYERS):
        b = f"h.{i}."
        for n in ("ln_1", "ln_2"):
            p[b + n + ".g"], p[b + n + ".b"] = np.ones(H), np.zeros(H)
        for n in "qkvo":
            p[b + f"attn.{n}.w"], p[b + f"attn.{n}.b"] = rng.normal(0, 0.4, (H, H)), np.zeros(H)
        p[b + "mlp.fc.w"], p[b + "mlp.fc.b"] = rng.normal(0, 0.4, (H, I)), np.zeros(I)
        p[b + "mlp.proj.w"], p[b + "mlp.proj.b"] = rng.normal(0, 0.4, (I, H)), np.zeros(H)
    p["ln_f.g"], p["ln_f.b"] = np.ones(H), np.zeros(H)
    return p
'''


@pytest.fixture
def gpt_init(tmp_path, monkeypatch):
    return load_source(tmp_path, monkeypatch, GPT_INIT, "gpt_init")


def test_a_model_class_maps_to_realstyle_gpts_hand_names(gpt_init):
    """The class is built from the config (its n_layer, n_head, eps, rope_base -- None without
    RoPE -- and tied arguments), the names are the hand adapter's, the loss its loss method
    with the dlogits it leaves; the positions it follows from the config both declared."""
    m, why = _row(gpt_init)
    assert m is not None, why
    hand = {**realstyle_gpt.TOP, **{k: f"h.{{i}}.{v}" for k, v in realstyle_gpt.LAYER.items()}}
    assert m.names == {k: hand[k] for k in m.names} and len(m.names) == 20
    assert not m.fused and not m.transposed
    assert "rope_base=config.rope_base if config.rope else None" in m.code
    assert "tied=config.tie_embeddings" in m.code and "eps=config.ln_eps" in m.code
    assert "cache.loss(ids=input_ids, labels=labels, ignore_index=ignore_index), " \
        "cache.dlogits" in m.code
    assert m.declares["decoder"] == {"position": ("learned", "learned_rope"), "final_norm": True,
                                     "head_bias": False, "tied": True}
    assert m.declares["attention"]["rope"] == (None, "half")


def test_a_forward_bug_leaves_no_row_and_says_how_close(gpt_init, monkeypatch):
    """realstyle_gpt's "causal" bug (the mask hides the past): its logits equal the reference's
    in no form, so no row is written (never a form chosen to fit the bug), with the reason."""
    monkeypatch.setattr(realstyle_gpt, "BUGS", {"causal"})
    m, why = _row(gpt_init)
    assert m is None
    assert len(why) == 1 and "no model's logits equal the reference decoder_forward's" in why[0]
    assert "closest positions learned" in why[0], why


@pytest.mark.parametrize("bug", ["rope_sign", "rope_base"])
def test_a_rope_bug_leaves_no_row_where_the_class_takes_a_rope_base(bug, gpt_init,
                                                                     monkeypatch):
    """realstyle_gpt's RoPE bugs: its logits still equal the reference's with learned
    positions alone, but a class taking a RoPE base whose RoPE forms all miss gets no row --
    never one declaring the forms without RoPE, under which its RoPE would never be run."""
    monkeypatch.setattr(realstyle_gpt, "BUGS", {bug})
    m, why = _row(gpt_init)
    assert m is None
    assert len(why) == 1 and "takes a RoPE base, but its logits equal the reference's in no " \
        "form with RoPE" in why[0], why


@pytest.mark.slow
@pytest.mark.parametrize("bug", [None, "final_ln", "tied"])
def test_realstyle_gpts_bugs_are_red_under_the_inferred_adapter(bug, gpt_init, monkeypatch):
    """realstyle_gpt's backward BUGS, one at a time: FAIL under the adapter infer writes for
    the class, as under the hand adapter; the correct model ok under both."""
    monkeypatch.setattr(realstyle_gpt, "BUGS", {bug} - {None})
    source = infer_source("gpt_init")
    inferred = check_implementation(exec_source(source), ops=["decoder"], first_red=True)
    hand = check_implementation(realstyle_gpt, ops=["decoder"], first_red=True)
    want = "ok" if bug is None else "FAIL"
    assert inferred.verdicts()["decoder"] == hand.verdicts()["decoder"] == want


def test_a_layernorm_eps_fixed_in_the_class_is_found_and_declared(tmp_path, monkeypatch):
    """MiniGPT with its eps fixed at 1e-5 in the code (no eps argument): of FIXED_EPS only 1e-5
    gives the reference's logits, and it is declared (the check's configs then pinned to it)."""
    docstring = '''    """realstyle_gpt's model, in a module with its parameter source."""'''
    source = GPT_INIT.replace(docstring, '''    def __init__(self, weights, n_layer, n_head,
                 rope_base=None, tied=True):
        super().__init__(weights, n_layer, n_head, 1e-5, rope_base, tied)''')
    assert source != GPT_INIT
    m, why = _row(load_source(tmp_path, monkeypatch, source, "gpt_fixed_eps"))
    assert m is not None, why
    assert m.declares["layernorm"] == {"eps": 1e-5}
    assert "eps=" not in m.code.split("model = ", 1)[1].split("\n", 1)[0]
    assert any("fixed in the code at 1e-05" in e and "no other within" in e
               for e in m.evidence), m.evidence
