"""Hugging Face BERT directories (``config.json`` + ``model.safetensors``) <-> ``(config, params)``.

Layouts: ``BertModel`` (names without prefix, a pooler), ``BertForMaskedLM`` (``bert.`` prefix,
``cls.predictions.*``, the decoder tied to the word embeddings and usually absent from the file)
and ``BertForSequenceClassification`` (``bert.`` prefix, pooler, ``classifier.*``).  Linear
weights are stored ``[out, in]`` (torch's ``y = x W^T + b``) and transposed to the reference's
``[in, out]``.  Buffers (``position_ids``) are skipped.  Weights are read with
``safetensors.numpy``: never unpickled, no torch, no network.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from reference.config import BertConfig
from reference.model import param_shapes

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "relu": "relu"}
BUFFERS = ("position_ids",)  # registered buffers some checkpoints carry


def _hf_names(config: BertConfig) -> dict[str, tuple[str, bool]]:
    """Our parameter name -> (Hugging Face name without the ``bert.`` prefix, transposed?)."""
    names = {"embeddings.token.W": ("embeddings.word_embeddings.weight", False),
             "embeddings.position.W": ("embeddings.position_embeddings.weight", False),
             "embeddings.type.W": ("embeddings.token_type_embeddings.weight", False),
             "embeddings.ln.gamma": ("embeddings.LayerNorm.weight", False),
             "embeddings.ln.beta": ("embeddings.LayerNorm.bias", False)}
    for i in range(config.n_layers):
        hf, ours = f"encoder.layer.{i}.", f"layers.{i}."
        for q, n in (("q", "attention.self.query"), ("k", "attention.self.key"),
                     ("v", "attention.self.value"), ("o", "attention.output.dense")):
            names[f"{ours}attn.W_{q}"] = (f"{hf}{n}.weight", True)
            names[f"{ours}attn.b_{q}"] = (f"{hf}{n}.bias", False)
        for ln, n in (("ln1", "attention.output.LayerNorm"), ("ln2", "output.LayerNorm")):
            names[f"{ours}{ln}.gamma"] = (f"{hf}{n}.weight", False)
            names[f"{ours}{ln}.beta"] = (f"{hf}{n}.bias", False)
        for w, n in (("1", "intermediate.dense"), ("2", "output.dense")):
            names[f"{ours}ffn.W_{w}"] = (f"{hf}{n}.weight", True)
            names[f"{ours}ffn.b_{w}"] = (f"{hf}{n}.bias", False)
    names.update({"pooler.W": ("pooler.dense.weight", True),
                  "pooler.b": ("pooler.dense.bias", False),
                  "mlm.transform.W": ("cls.predictions.transform.dense.weight", True),
                  "mlm.transform.b": ("cls.predictions.transform.dense.bias", False),
                  "mlm.ln.gamma": ("cls.predictions.transform.LayerNorm.weight", False),
                  "mlm.ln.beta": ("cls.predictions.transform.LayerNorm.bias", False),
                  "mlm.b": ("cls.predictions.bias", False),
                  "classifier.W": ("classifier.weight", True),
                  "classifier.b": ("classifier.bias", False)})
    return {k: v for k, v in names.items() if k in param_shapes(config)}


# --------------------------------------------------------------------------- config.json
def config_from_hf(hf: dict, *, head: str, pooler: bool) -> BertConfig:
    """A BertConfig from a parsed ``config.json`` (``head`` and ``pooler`` come from the
    tensors the checkpoint holds)."""
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"config.json: expected model_type 'bert', got {hf.get('model_type')!r}")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"config.json: hidden_act {act!r} is not supported "
                         f"(expected one of {sorted(ACTIVATIONS)})")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("config.json: position_embedding_type "
                         f"{hf['position_embedding_type']!r} is not supported (only 'absolute')")
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise ValueError("config.json: decoder / cross-attention BERT is not supported")
    num_labels = hf.get("num_labels") or len(hf.get("id2label") or {}) or 2
    try:
        return BertConfig(
            n_layers=hf["num_hidden_layers"], hidden=hf["hidden_size"],
            n_heads=hf["num_attention_heads"], intermediate=hf["intermediate_size"],
            max_len=hf["max_position_embeddings"], vocab_size=hf["vocab_size"],
            position="learned", attn_bias=True, final_layernorm=False, head=head,
            ln_eps=float(hf.get("layer_norm_eps", 1e-12)),
            init_std=float(hf.get("initializer_range", 0.02)), activation=ACTIVATIONS[act],
            type_vocab_size=hf.get("type_vocab_size", 2), embedding_layernorm=True,
            mlm_style="bert", pooler=pooler and head == "none",
            num_labels=int(num_labels) if head == "classifier" else 2,
            pad_token_id=hf.get("pad_token_id"))
    except KeyError as e:
        raise ValueError(f"config.json: missing field {e.args[0]!r}") from None


def config_to_hf(config: BertConfig) -> dict:
    """The ``config.json`` of a BERT-architecture config (ValueError for other architectures)."""
    if not (config.embedding_layernorm and config.attn_bias and config.position == "learned"
            and not config.final_layernorm and config.type_vocab_size
            and (config.head != "mlm" or config.mlm_style == "bert")):
        raise ValueError("config: only the BERT architecture (embedding LayerNorm, token types, "
                         "biased attention, no final LayerNorm, BERT MLM head) has a Hugging Face "
                         "layout")
    act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[config.activation]
    arch = {"none": "BertModel", "mlm": "BertForMaskedLM",
            "classifier": "BertForSequenceClassification"}[config.head]
    out = {"architectures": [arch], "model_type": "bert", "hidden_size": config.hidden,
           "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
           "intermediate_size": config.intermediate,
           "max_position_embeddings": config.max_len, "vocab_size": config.vocab_size,
           "type_vocab_size": config.type_vocab_size, "hidden_act": act,
           "layer_norm_eps": config.ln_eps, "initializer_range": config.init_std,
           "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
           "position_embedding_type": "absolute", "pad_token_id": config.pad_token_id,
           "tie_word_embeddings": True}
    if config.head == "classifier":
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(config.num_labels)}
        out["label2id"] = {f"LABEL_{i}": i for i in range(config.num_labels)}
    return out


# --------------------------------------------------------------------------- tensors
def _read_tensors(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, np.ndarray] = {}
        for shard in shards:
            tensors.update(load_file(str(path / shard)))
        return tensors
    if (path / "pytorch_model.bin").is_file() or (path / "tf_model.h5").is_file():
        raise ValueError(
            f"{path}: only a pickled pytorch_model.bin (or TensorFlow weights), no "
            "model.safetensors; loading never unpickles.  Convert it once where you trust the "
            "file, e.g. python -c \"from transformers import AutoModel; "
            f"AutoModel.from_pretrained('{path}').save_pretrained('{path}', "
            "safe_serialization=True)\" (use the model's own class, e.g. BertForMaskedLM, to "
            "keep its head)")
    raise ValueError(f"{path}: no model.safetensors (nor a sharded index) in the directory")


def _strip(name: str) -> str:
    return name[len("bert."):] if name.startswith("bert.") else name


def load_pretrained(path, dtype=np.float32) -> tuple[BertConfig, dict[str, np.ndarray]]:
    """``(config, params)`` from a Hugging Face BERT directory; ``params`` in ``dtype``.

    Every tensor of the file must be used and every parameter found, with its shape: an
    unknown, missing or wrong-shaped tensor is a ValueError naming it."""
    path = Path(path)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    if not path.is_dir():
        raise ValueError(f"path: expected a checkpoint directory, got {str(path)!r}")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{path}: no config.json")
    hf = json.loads(cfg_file.read_text())
    raw = {_strip(k): v for k, v in _read_tensors(path).items()
           if k.rsplit(".", 1)[-1] not in BUFFERS}
    for old, new in ((".gamma", ".weight"), (".beta", ".bias")):  # original TF-converted names
        raw = {(k[: -len(old)] + new if "LayerNorm" in k and k.endswith(old) else k): v
               for k, v in raw.items()}
    head = ("mlm" if any(k.startswith("cls.predictions.") for k in raw)
            else "classifier" if any(k.startswith("classifier.") for k in raw) else "none")
    config = config_from_hf(hf, head=head, pooler="pooler.dense.weight" in raw)
    names = _hf_names(config)
    shapes = param_shapes(config)
    params, used = {}, set()
    for ours, (theirs, transposed) in names.items():
        if theirs not in raw:
            raise ValueError(f"{path}: missing tensor {theirs!r} (for {ours})")
        a = np.asarray(raw[theirs])
        a = a.T if transposed else a
        if a.shape != shapes[ours]:
            raise ValueError(f"{path}: tensor {theirs!r} has shape {tuple(raw[theirs].shape)}, "
                             f"expected {shapes[ours][::-1] if transposed else shapes[ours]} "
                             "from config.json")
        params[ours] = np.ascontiguousarray(a, dtype=dtype)
        used.add(theirs)
    # the decoder, when the file has it, must be the tied table and the head's bias
    for theirs, ours in (("cls.predictions.decoder.weight", "embeddings.token.W"),
                         ("cls.predictions.decoder.bias", "mlm.b")):
        if theirs in raw and head == "mlm":
            if raw[theirs].shape != params[ours].shape or not np.array_equal(
                    raw[theirs].astype(dtype), params[ours]):
                raise ValueError(f"{path}: tensor {theirs!r} differs from {names[ours][0]!r}: an "
                                 "untied decoder is not supported")
            used.add(theirs)
    unknown = sorted(set(raw) - used)
    if unknown:
        raise ValueError(f"{path}: unknown tensor {unknown[0]!r}" + (
            f" (and {len(unknown) - 1} more: {unknown[1:4]})" if len(unknown) > 1 else ""))
    return config, {name: params[name] for name in shapes}  # param_shapes' order


def save_pretrained(params: dict, config: BertConfig, path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` in the Hugging Face layout of the
    config's head (BertModel / BertForMaskedLM / BertForSequenceClassification)."""
    from safetensors.numpy import save_file

    from reference.model import check_params

    hf = config_to_hf(config)
    check_params(params, config)
    prefix = "" if config.head == "none" else "bert."
    tensors = {}
    for ours, (theirs, transposed) in _hf_names(config).items():
        a = params[ours].T if transposed else params[ours]
        full = theirs if theirs.startswith(("cls.", "classifier.")) else prefix + theirs
        tensors[full] = np.ascontiguousarray(a)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf["dtype"] = str(next(iter(params.values())).dtype)
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
