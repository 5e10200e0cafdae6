"""``minibert adapter infer``'s decoder row without a parameter source
(minibert_spec.suite.infer.decoder.recorded_decoder, minibert_spec.suite.infer.recording):
tests/examples/realstyle_gpt.py's MiniGPT loads its weights, so its names and shapes are
recorded from the keys the class looks up in a recording dict, each set judged by its logits
against the reference's, the forms joined into one row -- whose ``minibert check`` verdict is
the hand adapter's, with and without the module's planted BUGS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minibert_spec.suite.infer import infer_source, recording
from minibert_spec.suite.infer.decoder import DecoderMapping
from minibert_spec.suite.infer.decoder_recorded import infer_decoder
from tests.examples import realstyle_gpt
from tests.suite.infer_support import exec_source, load_source
from tests.unshrunk import check_implementation

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.examples.realstyle_gpt"
HAND_NAMES = {**realstyle_gpt.TOP,
              **{k: f"h.{{i}}.{v}" for k, v in realstyle_gpt.LAYER.items()}}


def _row(mod):
    rows, why = infer_decoder(mod)
    return (rows[0] if rows else None), why


@pytest.fixture
def correct(monkeypatch):
    monkeypatch.setattr(realstyle_gpt, "BUGS", set())


def test_realstyle_gpts_row_is_its_hand_adapters(correct):
    """No parameter source: the recorded keys give the hand adapter's name map, every name of
    it (the LayerNorm's and the RMSNorm's, the MLP's and SwiGLU's, tied and untied), and the
    forms the hand adapter declares among those declared."""
    m, why = _row(realstyle_gpt)
    assert isinstance(m, DecoderMapping), why
    assert m.names == HAND_NAMES
    assert not m.fused and not m.transposed
    d = m.declares
    assert d["decoder"]["tied"] == (True, False)
    assert set(d["block"]["normalization"]) == {"layernorm", "rmsnorm"}
    assert set(d["block"]["ffn"]) == {"mlp", "swiglu"}
    assert {"learned", "rope"} <= set(d["decoder"]["position"])
    assert set(d["attention"]["rope"]) == {None, "half"}
    assert d["ffn"]["activation"] == "gelu_tanh" and d["attention_bias"] is True
    assert "impl.MiniGPT(weights=params, n_layer=config.n_layers" in m.code
    assert "cache.loss(ids=input_ids, labels=labels, ignore_index=ignore_index)" in m.code
    assert any("looked up in a recording dict" in e for e in m.evidence)


@pytest.mark.parametrize("bug,said", [
    ("causal", "recording its lookups found none that gives the reference's logits"),
    ("rope_sign", "takes a RoPE base, but its logits equal the reference's in no form with"),
    ("rope_base", "takes a RoPE base, but its logits equal the reference's in no form with")])
def test_a_forward_bug_leaves_no_row(bug, said, monkeypatch):
    """A bug in the forward: no row (never the forms it spares declared alone -- RoPE's bugs
    would then never be run), one line saying why."""
    monkeypatch.setattr(realstyle_gpt, "BUGS", {bug})
    m, why = _row(realstyle_gpt)
    assert m is None
    assert len(why) == 1 and said in why[0], why


def test_a_set_matching_in_no_form_leaves_no_row(correct, monkeypatch):
    """A form of the class whose logits are not the reference's (here its SwiGLU with the
    gate's sigmoid dropped) while the others are: no row, not the others alone."""
    def broken_forward(self, x):
        self.x = x
        if "gate.w" in self.w:
            return self._lin(self._lin(x, "gate") * self._lin(x, "up"), "down")
        return original(self, x)

    original = realstyle_gpt.MLP.forward
    monkeypatch.setattr(realstyle_gpt.MLP, "forward", broken_forward)
    m, why = _row(realstyle_gpt)
    assert m is None
    assert len(why) == 1 and "the other sets match: not decided" in why[0], why


NOTHING = '''
class TinyGPT:
    """A decoder by its name whose forward looks nothing up."""

    def __init__(self, weights, n_heads):
        self.w = weights

    def forward(self, ids):
        raise RuntimeError("not built yet")

    def backward(self, dlogits):
        return {}
'''


def test_a_class_recording_finds_nothing_in_gets_the_reason(tmp_path, monkeypatch):
    """A class named like a decoder whose lookups give nothing: no row, the one line."""
    m, why = _row(load_source(tmp_path, monkeypatch, NOTHING, "tiny_gpt"))
    assert m is None
    assert len(why) == 1 and why[0].startswith("decoder: class TinyGPT may be a decoder, but "
                                               "the module has no parameter source"), why
    assert "recording its lookups found none" in why[0]


PREFIXED = '''
import numpy as np


class Net:
    def __init__(self, weights):
        self.blocks = [{k[len(p):]: v for k, v in weights.items() if k.startswith(p)}
                       for p in ("a.", "b.")]
        self.head = weights["head.w"]

    def forward(self, x):
        for w in self.blocks:
            x = x @ w["lin.w"] + (w["lin.b"] if "lin.b" in w else 0)
        return x @ self.head
'''


def test_grow_finds_keys_of_sub_dicts_built_by_prefix(tmp_path, monkeypatch):
    """Keys missing from a plain dict the code built from the recording one by prefix: each
    added under the prefix that lets the run go on; shapes from the options, transposed
    where the first does not run; the biases guessed kept where the forward uses them (the
    head's it never reads, and a key no code asks for, left out)."""
    net = load_source(tmp_path, monkeypatch, PREFIXED, "prefixed_net").Net
    x = np.ones((2, 3))

    def options(key):
        return [(3, 3)] if key.endswith("lin.w") else [(5, 3), (3, 5)] if key == "head.w" \
            else [(3,)]

    grown = recording.grow(lambda w: net(w).forward(x), options, recording.ABSENT)
    assert grown.reason is None
    assert grown.shapes == {"head.w": (3, 5), "a.lin.w": (3, 3), "b.lin.w": (3, 3)}
    siblings = recording.bias_siblings(grown.shapes, options)
    assert set(siblings) == {"a.lin.b", "b.lin.b", "head.b"}
    kept = recording.prune(lambda w: net(w).forward(x), {**grown.shapes, **siblings,
                                                         "unused.w": (3, 3)}, recording.ABSENT)
    assert set(kept) == {"head.w", "a.lin.w", "b.lin.w", "a.lin.b", "b.lin.b"}


def _check_json(target: str, bug: str | None, *paths: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]),
           "MINIBERT_EXAMPLE_BUGS": bug or ""}
    proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", target, "--ops",
                           "decoder", "--format", "json", "-j", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def inferred_adapter(tmp_path_factory):
    """The adapter infer writes for the correct realstyle_gpt, as a file."""
    saved, realstyle_gpt.BUGS = realstyle_gpt.BUGS, set()
    try:
        source = infer_source(MODULE)
    finally:
        realstyle_gpt.BUGS = saved
    path = tmp_path_factory.mktemp("recorded") / "inferred_realstyle_gpt.py"
    path.write_text(source)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("bug", [None, "tied"])
def test_inferred_adapters_verdict_equals_the_hand_adapters(bug, inferred_adapter):
    """``MINIBERT_EXAMPLE_BUGS=<bug> minibert check ... --ops decoder --format json`` under the
    adapter infer wrote (for the correct module) and under the hand one: the same exit status
    and verdict, and every check the hand adapter ran with the same outcome (the inferred one
    declares more forms, so it runs more)."""
    inferred = _check_json(inferred_adapter.stem, bug, str(inferred_adapter.parent))
    hand = _check_json(MODULE, bug)
    assert inferred["exit_code"] == hand["exit_code"] == (0 if bug is None else 1)
    assert [(o["op"], o["verdict"]) for o in inferred["ops"]] == \
        [(o["op"], o["verdict"]) for o in hand["ops"]]
    got = {r["id"]: r["outcome"] for r in inferred["results"]}
    ran = {r["id"]: r["outcome"] for r in hand["results"] if r["outcome"] != "n/a"}
    assert {k: got.get(k) for k in ran} == ran


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["causal", "final_ln", "tied", "rope_sign", "rope_base"])
def test_every_planted_bug_is_red_under_the_inferred_adapter(bug, inferred_adapter,
                                                             monkeypatch):
    """Each of the module's BUGS switched on under the adapter inferred from the correct
    module: FAIL, as under the hand adapter."""
    adapter = exec_source(inferred_adapter.read_text())
    monkeypatch.setattr(realstyle_gpt, "BUGS", {bug})
    inferred = check_implementation(adapter, ops=["decoder"], first_red=True)
    hand = check_implementation(realstyle_gpt, ops=["decoder"], first_red=True)
    assert inferred.verdicts()["decoder"] == hand.verdicts()["decoder"] == "FAIL"


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["final_ln", "tied"])
def test_a_backward_bug_is_red_under_the_adapter_inferred_with_it(bug, monkeypatch):
    """Inferred from the buggy module itself (the backward is never compared, so the row is
    written): FAIL, as under the hand adapter."""
    monkeypatch.setattr(realstyle_gpt, "BUGS", {bug})
    source = infer_source(MODULE)
    assert "decoder_forward, decoder_backward, decoder_loss_and_grads = decoder(" in source
    inferred = check_implementation(exec_source(source), ops=["decoder"], first_red=True)
    hand = check_implementation(realstyle_gpt, ops=["decoder"], first_red=True)
    assert inferred.verdicts()["decoder"] == hand.verdicts()["decoder"] == "FAIL"
