"""The Hugging Face name map checked against transformers' own module tree, not against our
saver.

A random transformers model (every tensor random: no two entries alike) is saved by
transformers and read by ``load_pretrained``; each of our parameters is then *found by value*
among the model's parameters -- as stored or transposed -- so the test recovers the mapping the
loader actually applied without reading its table.  It must be a bijection onto transformers'
distinct parameter tensors (the tied decoder is the word-embedding tensor itself), transposed
exactly where transformers' module is an ``nn.Linear`` weight (stored ``[out, in]``; ours are
``[in, out]``), and each of our names must agree with the module it was found in: the same layer
index, the same part of the model, a LayerNorm's weight/bias for gamma/beta, a weight for
``W``, a bias for ``b``.  Which of the same-shaped weights of one layer is the query and which
the key is for the forward comparison (spec/suite/checks/oracle_bert.py) to see.

Saving goes the other way: ``save_pretrained`` of the loaded parameters writes exactly the
tensor names, shapes and values transformers wrote for the same model.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.numpy import load_file  # noqa: E402

from minibert_spec.suite.checks.oracle_bert import EQUATIONS, hf_model  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytestmark = pytest.mark.oracle

# our name's first component -> the part of transformers' BERT it must come from
PARTS = {"embeddings": "embeddings", "layers": "encoder", "pooler": "pooler", "mlm": "cls",
         "classifier": "classifier"}
LAYOUTS = [pytest.param("BertModel", True, id="BertModel",
                        marks=pytest.mark.equation(*EQUATIONS["BertModel"])),
           pytest.param("BertModel", False, id="BertModel-no-pooler",
                        marks=pytest.mark.equation(*EQUATIONS["BertModel"])),
           pytest.param("BertForMaskedLM", False, id="BertForMaskedLM",
                        marks=pytest.mark.equation(*EQUATIONS["BertForMaskedLM"])),
           pytest.param("BertForSequenceClassification", True,
                        id="BertForSequenceClassification",
                        marks=pytest.mark.equation(*EQUATIONS["BertForSequenceClassification"],
                                                   "pooler.forward"))]


def _model(arch, pooler):
    kw = {"model_kw": {"add_pooling_layer": pooler}} if arch == "BertModel" else {}
    return hf_model(arch, np.float64, seed=3, **kw)


def _found(ours: np.ndarray, tensors: dict) -> list[tuple[str, bool]]:
    """(transformers name, transposed?) of every tensor equal to ``ours`` as stored or as its
    transpose."""
    out = []
    for name, t in tensors.items():
        if t.shape == ours.shape and np.array_equal(t, ours):
            out.append((name, False))
        if t.ndim == 2 and t.shape == ours.shape[::-1] and np.array_equal(t.T, ours):
            out.append((name, True))
    return out


def _strip(name):
    return name[len("bert."):] if name.startswith("bert.") else name


@pytest.mark.parametrize("arch, pooler", LAYOUTS)
def test_loader_mapping_against_transformers_module_tree(impl, arch, pooler, tmp_path):
    model = _model(arch, pooler)
    model.save_pretrained(tmp_path)
    _, params = impl.load_pretrained(tmp_path, dtype=np.float64)
    primary = {n: p.detach().numpy() for n, p in model.named_parameters()}  # tied: first name
    modules = dict(model.named_modules())
    used = {}
    for ours, value in params.items():
        found = _found(value, primary)
        assert len(found) == 1, f"{ours} {value.shape}: found as {found or 'nothing'}"
        (theirs, transposed), = found
        assert theirs not in used, f"{ours} and {used.get(theirs)} are both {theirs}"
        used[theirs] = ours
        owner_name, _, leaf = theirs.rpartition(".")
        owner = modules[owner_name]
        linear_weight = isinstance(owner, torch.nn.Linear) and leaf == "weight"
        assert transposed == linear_weight, (
            f"{ours}: {'transposed' if transposed else 'as stored'} from {theirs} "
            f"({type(owner).__name__}.{leaf}): a Linear weight is [out, in], ours [in, out]")
        # the name agrees with the module it was found in
        part, *rest = ours.split(".")
        path = _strip(theirs).split(".")
        assert path[0] == PARTS[part], f"{ours} comes from {theirs}"
        if part == "layers":
            assert path[:3] == ["encoder", "layer", rest[0]], f"{ours} comes from {theirs}"
        our_leaf = ours.rsplit(".", 1)[-1]
        if our_leaf in ("gamma", "beta"):
            assert isinstance(owner, torch.nn.LayerNorm), f"{ours} comes from {theirs}"
            assert leaf == {"gamma": "weight", "beta": "bias"}[our_leaf]
        else:
            assert not isinstance(owner, torch.nn.LayerNorm), f"{ours} comes from {theirs}"
            assert leaf == ("weight" if our_leaf.startswith("W") else "bias"), (ours, theirs)
    missing = sorted(set(primary) - set(used))
    assert not missing, f"transformers' parameters no parameter of ours holds: {missing}"


@pytest.mark.parametrize("arch, pooler", LAYOUTS)
def test_saver_writes_what_transformers_writes(impl, arch, pooler, tmp_path):
    """Our save_pretrained of the loaded parameters: transformers' own file for the model, name
    by name, shape by shape, bit for bit."""
    model = _model(arch, pooler)
    model.save_pretrained(tmp_path / "theirs")
    config, params = impl.load_pretrained(tmp_path / "theirs", dtype=np.float64)
    impl.save_pretrained(params, config, tmp_path / "ours")
    theirs = load_file(str(tmp_path / "theirs" / "model.safetensors"))
    ours = load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for name, t in theirs.items():
        assert ours[name].shape == t.shape and np.array_equal(ours[name], t), name
