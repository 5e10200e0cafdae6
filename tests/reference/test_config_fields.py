"""Every field of ``BertConfig``, away from its default, against an oracle.

The cases are generated from the config's own fields (``dataclasses.fields``), so a new field is
covered without a new list -- or the coverage test fails until it is.  Each field is varied
from a base config by a family of oracle comparisons that can express it:

* ``transformers``: a random ``BertModel`` (with and without pooler), ``BertForMaskedLM`` or
  ``BertForSequenceClassification`` built from the varied config through this file's own field
  map (``HF_FIELDS``), saved, loaded with ``load_pretrained`` (the loaded config must equal the
  varied one: the loader reads the field) and run forward and backward against transformers,
  float64: outputs at unpadded positions, loss, every parameter gradient (the helpers of
  spec/suite/checks/oracle_bert.py).  The batch holds every token type, the padding id and id 0 at
  unpadded positions.
* ``torch``: the documents' architecture (tests/torch_oracle.py's encoder from torch's own
  modules; the helpers of spec/suite/checks/oracle_model.py): positions, attention biases, final
  LayerNorm, hidden-state head.
* ``init``: the initial weights' spread against transformers' own initialisation.

Values away from the base: the other choices of a ``Literal`` field, the other bool, the next
valid integers above, ``None`` for an optional one, and for floats ``FLOAT_VALUES``.  A varied
value must be *visible*: ``test_ignoring_the_field_is_detected`` runs the same case with our side
given the base value instead and requires the comparison to fail.  A field that no family can
vary must take each of its values in some family's base, or be declared in ``NOT_COMPARED``
with its reason.
"""

from __future__ import annotations

import dataclasses
import types
import typing

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from minibert_reference.config import BertConfig, choices, mini_bert  # noqa: E402
from minibert_spec.suite import torch_oracle as to  # noqa: E402
from minibert_spec.suite.checks.oracle_bert import (  # noqa: E402
    EQUATIONS,
    LAYOUTS,
    compare_grads,
    hf_config,
    hf_model,
    torch_grads,
)
from minibert_spec.suite.checks.oracle_model import (  # noqa: E402
    LOSS_EQUATIONS,
    MODEL_EQUATIONS,
    SMALL,
    make_case,
)
from minibert_spec.suite.checks.oracle_model import compare_grads as compare_model_grads  # noqa: E402

pytestmark = pytest.mark.oracle

# our field -> transformers.BertConfig attribute (and our value -> theirs where they differ)
HF_FIELDS = {
    "n_layers": "num_hidden_layers", "hidden": "hidden_size", "n_heads": "num_attention_heads",
    "intermediate": "intermediate_size", "max_len": "max_position_embeddings",
    "vocab_size": "vocab_size", "ln_eps": "layer_norm_eps", "type_vocab_size": "type_vocab_size",
    "pad_token_id": "pad_token_id", "num_labels": "num_labels", "init_std": "initializer_range",
    # transformers' ACT2FN: "gelu" is the exact erf form, "gelu_new" the tanh approximation,
    # "relu2" squared ReLU
    "activation": ("hidden_act", {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu",
                                  "relu2": "relu2"}),
}
ARCH = {head: arch for arch, head in LAYOUTS.items()}  # head -> transformers class
# what transformers' BERT always is (its base values of the fields it cannot vary)
HF_FIXED = dict(position="learned", attn_bias=True, final_layernorm=False,
                embedding_layernorm=True, mlm_style="bert")
# fields only one head reads: varied on that head's base only, the dataclass default elsewhere
READ_ONLY_BY = {"num_labels": "classifier", "pooler": "none"}
NOT_COMPARED: dict[str, str] = {}  # field -> why no oracle can compare it (none today)
FLOAT_VALUES = (1e-3, 0.25)  # far from every default (1e-12, 0.02, 0.2), and each moves a
# LayerNorm of inputs of variance ~0.1 by ~0.5% or more: 1e7 x the float64 oracle tolerance


def _hf_value(field, value):
    spec = HF_FIELDS[field]
    return (spec[0], spec[1][value]) if isinstance(spec, tuple) else (spec, value)


def _from_hf(field, hf):
    spec = HF_FIELDS[field]
    name, table = (spec, None) if isinstance(spec, str) else spec
    value = getattr(hf, name)
    return value if table is None else {v: k for k, v in table.items()}[value]


def _default(field):
    return BertConfig.__dataclass_fields__[field].default


def _hf_base(head: str) -> BertConfig:
    """The config of the BERT oracle's transformers model, read through HF_FIELDS."""
    hf = hf_config()
    values = {f: _from_hf(f, hf) for f in HF_FIELDS}
    values.update(HF_FIXED, head=head, pooler=head == "none")
    for field, reader in READ_ONLY_BY.items():
        if reader != head:
            values[field] = _default(field)
    return BertConfig(**values)


# --------------------------------------------------------------------------- the families
def _batch(cfg: BertConfig, seed=0):
    """Padded rows (lengths T, 5, 3), repeated ids, ids 0 and 1 and the padding id at unpadded
    positions, every token type in the first row; MLM labels (>= 1 per row) and class labels."""
    rng = np.random.default_rng(seed)
    B, T = 3, min(7, cfg.max_len)
    lengths = np.minimum([T, 5, 3], T)
    mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(0, cfg.vocab_size, size=(B, T))
    ids[:, 1] = ids[:, 0]
    ids[0, 2], ids[1, 2] = 0, 1
    if cfg.pad_token_id is not None:
        ids[2, 2] = cfg.pad_token_id
    types = (np.arange(T)[None] * max(cfg.type_vocab_size, 1)) // lengths[:, None] * mask
    labels = np.where((rng.random((B, T)) < 0.4) & mask.astype(bool),
                      rng.integers(0, cfg.vocab_size, size=(B, T)), -100)
    labels[:, 0] = rng.integers(0, cfg.vocab_size, size=B)
    classes = np.arange(B) % cfg.num_labels
    return ids, mask, types, labels, classes


def _run_transformers(impl, cfg: BertConfig, tmp_path, ours: BertConfig | None = None):
    """transformers' model of ``cfg`` vs ours run with ``ours`` (default: the loaded config,
    which must equal ``cfg``).  Raises AssertionError (or ValueError) on a difference."""
    dtype = np.float64
    arch = ARCH[cfg.head]
    hf_kw = dict(_hf_value(f, getattr(cfg, f)) for f in HF_FIELDS)
    model_kw = {"add_pooling_layer": cfg.pooler} if cfg.head == "none" else {}
    model = hf_model(arch, dtype, model_kw=model_kw, **hf_kw)
    model.save_pretrained(tmp_path)
    loaded, params = impl.load_pretrained(tmp_path, dtype=dtype)
    if ours is None:
        assert loaded == cfg, f"load_pretrained read {loaded}, expected {cfg}"
        ours = loaded
    ids, mask, types, labels, classes = _batch(cfg)
    keep = mask.astype(bool)
    t = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
         "token_type_ids": torch.from_numpy(types)}
    if arch == "BertModel":
        out = model(**t)
        rng = np.random.default_rng(7)
        dH = rng.standard_normal(out.last_hidden_state.shape) * keep[..., None]
        total = (out.last_hidden_state * torch.from_numpy(dH)).sum()
        dP = None
        if cfg.pooler:
            dP = rng.standard_normal(out.pooler_output.shape)
            total = total + (out.pooler_output * torch.from_numpy(dP)).sum()
        total.backward()
        h, cache = impl.forward(params, ours, ids, mask, token_type_ids=types)
        to.assert_oracle("last_hidden_state", h[keep], out.last_hidden_state.detach().numpy()[keep],
                        dtype)
        if cfg.pooler:
            to.assert_oracle("pooler_output", cache.pooled, out.pooler_output.detach().numpy(),
                            dtype)
        grads, _ = impl.backward(dH, cache, d_pooled=dP)
    else:
        lab = labels if arch == "BertForMaskedLM" else classes
        out = model(**t, labels=torch.from_numpy(lab))
        out.loss.backward()
        logits, _ = impl.forward(params, ours, ids, mask, token_type_ids=types)
        rows = keep if arch == "BertForMaskedLM" else slice(None)
        to.assert_oracle("logits", logits[rows], out.logits.detach().numpy()[rows], dtype)
        loss, grads, _ = impl.loss_and_grads(params, ours, ids, labels=lab, attention_mask=mask,
                                             token_type_ids=types)
        to.assert_oracle("loss", np.asarray(loss), out.loss.detach().numpy(), dtype)
    compare_grads(arch, grads, torch_grads(model, cfg, dtype), dtype)


def _documents_case(impl, cfg: BertConfig):
    """make_case's params and batch at the first seed whose ReLUs are away from their kinks."""
    for seed in range(20):
        try:
            return make_case(impl, cfg, 3, 8, seed, np.float64)
        except AssertionError as e:
            if "kink" not in str(e):
                raise
    raise AssertionError(f"no seed in 0..19 keeps the ReLUs of {cfg} away from their kinks")


def _run_torch(impl, cfg: BertConfig, tmp_path, ours: BertConfig | None = None):
    """tests/torch_oracle.py's encoder of ``cfg`` vs ours run with ``ours`` (default cfg):
    loss (CE mean for the MLM head, MSE for hidden states) and every gradient."""
    params, batch = _documents_case(impl, cfg)
    kw = dict(attention_mask=batch["attention_mask"])
    kw.update(labels=batch["labels"]) if cfg.head == "mlm" else kw.update(targets=batch["targets"])
    value, grads, d_emb = impl.loss_and_grads(params, ours or cfg, batch["input_ids"], **kw)
    theirs = to.model_loss_and_grads(params, cfg, batch["input_ids"], **kw)
    to.assert_oracle("loss", np.asarray(value), theirs["loss"], np.float64)
    compare_model_grads(f"{cfg.head}", grads, d_emb, theirs, np.float64, params, 8)


def _run_init(impl, cfg: BertConfig, tmp_path, ours: BertConfig | None = None):
    """init_params' spread against transformers' initialisation of the same config: every
    weight matrix and table ~ N(0, init_std^2) (the spread of all their entries together
    within 5%; ~2,000 entries), every bias 0, every LayerNorm gamma 1 and beta 0."""
    params = impl.init_params(ours or cfg, seed=0, dtype=np.float64)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(hf_config(
        **dict(_hf_value(f, getattr(cfg, f)) for f in HF_FIELDS)))
    theirs = {n: p.detach().numpy() for n, p in model.named_parameters()}
    std = {}
    for side, named, is_weight in (
            ("ours", params, lambda n, a: n.rsplit(".", 1)[-1].startswith("W")),
            ("transformers", theirs, lambda n, a: a.ndim == 2)):
        weights = np.concatenate([a.ravel() for n, a in named.items() if is_weight(n, a)])
        std[side] = float(np.sqrt(np.mean(weights ** 2)))
        rest = [(n, a) for n, a in named.items() if not is_weight(n, a)]
        for n, a in rest:
            ln_gamma = n.endswith(("gamma", "LayerNorm.weight"))
            assert np.array_equal(a, np.ones_like(a) if ln_gamma else np.zeros_like(a)), (side, n)
    assert std["ours"] == pytest.approx(std["transformers"], rel=0.05), std
    assert std["transformers"] == pytest.approx(cfg.init_std, rel=0.05), std


FAMILIES = {
    "transformers": dict(bases={h: _hf_base(h) for h in ARCH}, run=_run_transformers,
                         varies=(set(HF_FIELDS) - {"init_std"}) | {"pooler"},
                         equations=lambda cfg: _hf_equations(cfg)),
    "torch": dict(bases={"mlm": mini_bert(**SMALL)}, run=_run_torch,
                  varies={"n_layers", "hidden", "n_heads", "intermediate", "max_len",
                          "vocab_size", "position", "attn_bias", "final_layernorm", "head",
                          "ln_eps"},
                  equations=lambda cfg: MODEL_EQUATIONS + LOSS_EQUATIONS,
                  expressible=lambda cfg: cfg.head in ("mlm", "none")),
    "init": dict(bases={"mlm": _hf_base("mlm")}, run=_run_init, varies={"init_std"},
                 equations=lambda cfg: ()),
}
ACTIVATION_EQUATIONS = {"gelu": ("gelu.forward.erf", "gelu.backward.erf"),
                        "gelu_tanh": ("gelu.forward.tanh", "gelu.backward.tanh"),
                        "relu": ("relu.forward", "relu.backward"),
                        "relu2": ("relu2.forward", "relu2.backward")}


def _hf_equations(cfg: BertConfig) -> tuple[str, ...]:
    """the BERT oracle's equations of the architecture, with the case's own activation, the
    embedding LayerNorm (every architecture has it) and the pooler where there is one."""
    eqs = [e for e in EQUATIONS[ARCH[cfg.head]] if not e.startswith("gelu.")]
    eqs += ["embedding_ln.forward", "embedding_ln.backward",
            *ACTIVATION_EQUATIONS[cfg.activation]]
    if cfg.head == "classifier" or cfg.pooler:
        eqs.append("pooler.forward")
    return tuple(dict.fromkeys(eqs))


# --------------------------------------------------------------------------- the values
def _alternatives(base: BertConfig, field: str) -> list:
    """Values of ``field`` away from ``base``'s, each giving a valid config."""
    hint = typing.get_type_hints(BertConfig)[field]
    current = getattr(base, field)
    args = typing.get_args(hint)
    if field in choices():
        candidates = [v for v in choices()[field] if v != current]
    elif hint is bool:
        candidates = [not current]
    elif hint is float:
        candidates = [v for v in FLOAT_VALUES if v != current]
    elif hint is int or (isinstance(hint, types.UnionType) and int in args):
        start = 0 if current is None else current
        candidates = [v for v in range(start + 1, start + 9) if _valid(base, field, v)][:1]
        if type(None) in args and current is not None:
            candidates.append(None)
    else:
        raise AssertionError(f"{field}: no rule makes values of type {hint} (add one here)")
    return [v for v in candidates if _valid(base, field, v)]


def _valid(base, field, value) -> bool:
    try:
        base.replace(**{field: value})
    except ValueError:
        return False
    return True


def _cases():
    """(family, field, value, head) for every field a family varies, on each base that reads
    it, every alternative value the family can express."""
    out = []
    for family, spec in FAMILIES.items():
        expressible = spec.get("expressible", lambda cfg: True)
        for field in sorted(spec["varies"]):
            for head, base in spec["bases"].items():
                if READ_ONLY_BY.get(field, head) != head:
                    continue
                for value in _alternatives(base, field):
                    if expressible(base.replace(**{field: value})):
                        out.append((family, field, value, head))
    return out


CASES = _cases()


def _param(family, field, value, head):
    """The case, tagged with the equations its comparison checks (none for ``init``)."""
    eqs = FAMILIES[family]["equations"](FAMILIES[family]["bases"][head].replace(**{field: value}))
    return pytest.param(family, field, value, head,
                        marks=[pytest.mark.equation(*eqs)] if eqs else [],
                        id=f"{family}-{field}={value}-{head}")


@pytest.mark.parametrize("family, field, value, head", [_param(*c) for c in CASES])
def test_field_away_from_its_default(impl, family, field, value, head, tmp_path):
    cfg = FAMILIES[family]["bases"][head].replace(**{field: value})
    FAMILIES[family]["run"](impl, cfg, tmp_path)


def test_the_bases_agree_with_their_oracle(impl, tmp_path):
    """Every base itself (nothing varied) passes its comparison."""
    for family, spec in FAMILIES.items():
        for head, base in spec["bases"].items():
            spec["run"](impl, base, tmp_path / f"{family}-{head}")


VARIED = sorted({(family, field, value) for family, field, value, _ in CASES}, key=str)


@pytest.mark.parametrize("family, field, value", VARIED,
                         ids=[f"{f}-{k}={v}" for f, k, v in VARIED])
def test_ignoring_the_field_is_detected(impl, family, field, value, tmp_path):
    """The varied value is visible: our side run with the base value instead (as if it ignored
    the field) fails the comparison on at least one base -- a shape error counts (the
    parameters do not fit the base value)."""
    seen = []
    for i, (fam, f, v, head) in enumerate(CASES):
        if (fam, f, v) != (family, field, value):
            continue
        base = FAMILIES[family]["bases"][head]
        cfg = base.replace(**{field: value})
        try:
            FAMILIES[family]["run"](impl, cfg, tmp_path / str(i), ours=base)
        except (AssertionError, ValueError) as e:
            seen.append(f"{head}: {type(e).__name__}")
    assert seen, f"{family}: {field}={value!r} and the base value {field}=" \
                 f"{getattr(base, field)!r} give the same comparison on every base"


def test_every_field_is_compared():
    """Each field is varied by a family, or takes all its values in the families' bases, or is
    declared with its reason; every declared name is a field."""
    names = [f.name for f in dataclasses.fields(BertConfig)]
    assert set(NOT_COMPARED) <= set(names) and set(HF_FIELDS) <= set(names)
    varied = {field for _, field, _, _ in CASES}
    for name in names:
        if name in NOT_COMPARED or name in varied:
            continue
        hint = typing.get_type_hints(BertConfig)[name]
        values = choices().get(name, (False, True) if hint is bool else None)
        seen = {getattr(b, name) for spec in FAMILIES.values() for b in spec["bases"].values()}
        assert values is not None and seen == set(values), (
            f"BertConfig.{name} is compared against no oracle: vary it in a family of "
            f"tests/reference/test_config_fields.py (or declare it in NOT_COMPARED with the "
            f"reason); "
            f"the bases give it only {sorted(seen, key=str)}")
    assert {b.head for b in FAMILIES["transformers"]["bases"].values()} == set(choices()["head"])


@pytest.mark.equation("gelu.forward.tanh", "gelu.backward.tanh", "gelu.forward.erf",
                      "gelu.backward.erf", "relu.forward", "relu.backward", "relu2.forward",
                      "relu2.backward", "mlm_head.forward")
@pytest.mark.parametrize("hidden_act, ours", [("gelu", "gelu"), ("gelu_new", "gelu_tanh"),
                                              ("gelu_pytorch_tanh", "gelu_tanh"),
                                              ("relu", "relu"), ("relu2", "relu2")])
def test_every_transformers_activation_name(impl, hidden_act, ours, tmp_path):
    """Each config.json ``hidden_act`` the loader accepts: loaded as the activation transformers
    itself runs for that name (ACT2FN), and the MLM logits and loss agree."""
    model = hf_model("BertForMaskedLM", np.float64, hidden_act=hidden_act)
    model.save_pretrained(tmp_path)
    cfg, params = impl.load_pretrained(tmp_path, dtype=np.float64)
    assert cfg.activation == ours
    ids, mask, types, labels, _ = _batch(cfg)
    keep = mask.astype(bool)
    out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                token_type_ids=torch.from_numpy(types), labels=torch.from_numpy(labels))
    logits, _ = impl.forward(params, cfg, ids, mask, token_type_ids=types)
    to.assert_oracle("logits", logits[keep], out.logits.detach().numpy()[keep], np.float64)
    loss, _, _ = impl.loss_and_grads(params, cfg, ids, labels=labels, attention_mask=mask,
                                     token_type_ids=types)
    to.assert_oracle("loss", np.asarray(loss), out.loss.detach().numpy(), np.float64)
