"""The model's head is chosen once, from one table, and data parallelism composes the model
through its public seam only.

* ``minibert_reference.model.head_kind`` is the only code of the model that reads which head a
config
  has (``head``, ``mlm_style``, ``pooler``); everything else reads the chosen
  :class:`~minibert_reference.model.HeadKind` record of ``HEADS``.
* ``minibert_reference.data_parallel`` uses no private name of ``minibert_reference.model``.
* A mutant of a head's function reaches the model through the table (``minibert_spec.mutants``
patches
  the table's records) and is undone exactly.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from minibert_reference import data_parallel, model
from minibert_reference.config import BertConfig, bert_tiny, mini_bert
from minibert_spec.mutants import applied
from tests import ROOT

HEAD_FIELDS = ("head", "mlm_style", "pooler")


def _functions_reading(path: Path, attrs) -> dict[str, set[str]]:
    """function name -> the ``config.<attr>`` of ``attrs`` it decides on (reads outside an
    f-string: a message may name the config's fields)."""
    out: dict[str, set[str]] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        in_messages = {id(m) for s in ast.walk(fn) if isinstance(s, ast.JoinedStr)
                       for m in ast.walk(s)}
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and node.attr in attrs
                    and isinstance(node.value, ast.Name) and node.value.id == "config"
                    and id(node) not in in_messages):
                out.setdefault(fn.name, set()).add(node.attr)
    return out


def test_only_head_kind_decides_the_head():
    readers = _functions_reading(ROOT / "reference" / "model.py", HEAD_FIELDS)
    assert readers == {"head_kind": {"head", "mlm_style", "pooler"}}, readers


def test_the_check_sees_a_second_decision(tmp_path):
    """The structural test goes red on a function that decides the head for itself."""
    src = (ROOT / "reference" / "model.py").read_text(encoding="utf-8")
    bad = tmp_path / "model.py"
    bad.write_text(src + "\n\ndef _out(config):\n    return config.head == 'mlm'\n")
    assert "_out" in _functions_reading(bad, HEAD_FIELDS)


def test_data_parallel_uses_the_public_seam_only():
    tree = ast.parse((ROOT / "reference" / "data_parallel.py").read_text(encoding="utf-8"))
    private = sorted({node.attr for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                      and node.value.id == "model" and node.attr.startswith("_")})
    assert not private, \
        f"minibert_reference.data_parallel reaches private names of model: {private}"
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "model"}
    assert used <= {"check_inputs", "check_loss_inputs", "check_backward", "run_forward",
                    "run_backward", "run_loss", "run_loss_backward", "Batch", "ModelCache"}, used


@pytest.mark.parametrize("config, kind", [
    (mini_bert(), "mlm_linear"),
    (bert_tiny(), "mlm_bert"),
    (bert_tiny(head="classifier", num_labels=3), "classifier"),
    (bert_tiny(head="classifier", num_labels=3, pooler=False), "classifier"),
    (bert_tiny(head="none", pooler=False), "hidden_states"),
    (bert_tiny(head="none", pooler=True), "pooled_hidden_states"),
    (BertConfig(head="mlm", mlm_style="linear", pooler=True), "mlm_linear"),
])
def test_head_kind_of_each_config(config, kind):
    """Which row each config gets (mlm_style matters for head "mlm" only, pooler for head
    "none" only), and that row's parameters are the model's last ones."""
    assert model.head_kind(config).name == kind
    shapes = list(model.param_shapes(config).items())
    own = list(model.HEADS[kind].param_shapes(config).items())
    assert shapes[len(shapes) - len(own):] == own


def test_a_mutant_of_a_head_reaches_the_model_through_the_table():
    config = bert_tiny(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                       vocab_size=23, activation="gelu_tanh")
    params = model.init_params(config, seed=1, dtype=np.float64)
    ids = np.random.default_rng(0).integers(0, 23, size=(2, 5))
    before = dict(model.HEADS)
    want, _ = data_parallel.forward(params, config, ids)
    with applied("mlm_head_ignores_activation"):
        assert model.HEADS["mlm_bert"].forward.__mutant__ == "mlm_head_ignores_activation"
        got, _ = data_parallel.forward(params, config, ids)
        assert not np.allclose(got, want)
    assert all(model.HEADS[k] is v for k, v in before.items())
    again, _ = data_parallel.forward(params, config, ids)
    assert np.array_equal(again, want)
