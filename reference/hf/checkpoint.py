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
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minibert_reference.config import BertConfig
from minibert_reference.model import param_shapes
from minibert_reference.train.fileio import read_user_json

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
               "relu": "relu", "relu2": "relu2"}
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
    shapes = param_shapes(config)
    return {k: v for k, v in names.items() if k in shapes}


# --------------------------------------------------------------------------- config.json
# config.json field -> BertConfig field, for the sizes: every error names the field the user
# wrote, never the internal name
SIZE_FIELDS = {"num_hidden_layers": "n_layers", "hidden_size": "hidden",
               "num_attention_heads": "n_heads", "intermediate_size": "intermediate",
               "max_position_embeddings": "max_len", "vocab_size": "vocab_size",
               "type_vocab_size": "type_vocab_size"}
HF_NAMES = {**{ours: theirs for theirs, ours in SIZE_FIELDS.items()},
            "ln_eps": "layer_norm_eps", "init_std": "initializer_range",
            "activation": "hidden_act", "pad_token_id": "pad_token_id",
            "num_labels": "num_labels"}


def _int_field(hf: dict, name: str, where: str, default: int | None = None) -> int:
    if name not in hf and default is None:
        raise ValueError(f"{where}: missing field {name!r}")
    value = hf.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: {name}: expected an integer >= 1, got {value!r}")
    return value


def _real_field(hf: dict, name: str, where: str, default: float) -> float:
    value = hf.get(name, default)
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0):
        raise ValueError(f"{where}: {name}: expected a finite number > 0, got {value!r}")
    return float(value)


def config_from_hf(hf: dict, *, head: str, pooler: bool,
                   where: str = "config.json") -> BertConfig:
    """A BertConfig from a parsed ``config.json`` (``head`` and ``pooler`` come from the
    tensors the checkpoint holds).  Every error names ``where`` (the file) and the field as
    written in it (``num_hidden_layers``, not ``n_layers``)."""
    if not isinstance(hf, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(hf).__name__}")
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"{where}: model_type: expected 'bert', got {hf.get('model_type')!r}")
    act = hf.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"{where}: hidden_act {act!r} is not supported "
                         f"(expected one of {sorted(ACTIVATIONS)})")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{where}: position_embedding_type "
                         f"{hf['position_embedding_type']!r} is not supported (only 'absolute')")
    for flag in ("is_decoder", "add_cross_attention"):  # either alone makes another model
        if hf.get(flag):
            raise ValueError(f"{where}: {flag}: expected false (a decoder / cross-attention "
                             f"BERT is not supported), got {hf[flag]!r}")
    sizes = {ours: _int_field(hf, theirs, where, 2 if theirs == "type_vocab_size" else None)
             for theirs, ours in SIZE_FIELDS.items()}
    if sizes["hidden"] % sizes["n_heads"]:
        raise ValueError(f"{where}: num_attention_heads: expected a divisor of hidden_size="
                         f"{sizes['hidden']}, got {sizes['n_heads']}")
    pad = hf.get("pad_token_id")
    if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool)
                            or not 0 <= pad < sizes["vocab_size"]):
        raise ValueError(f"{where}: pad_token_id: expected null or an id in [0, vocab_size="
                         f"{sizes['vocab_size']}), got {pad!r}")
    num_labels = 2
    if head == "classifier":
        labels = hf.get("id2label")
        num_labels = hf.get("num_labels") or (len(labels) if isinstance(labels, dict) else 0) or 2
        if not isinstance(num_labels, int) or isinstance(num_labels, bool) or num_labels < 1:
            raise ValueError(f"{where}: num_labels: expected an integer >= 1, got "
                             f"{num_labels!r}")
    try:
        return BertConfig(
            **sizes, position="learned", attn_bias=True, final_layernorm=False, head=head,
            ln_eps=_real_field(hf, "layer_norm_eps", where, 1e-12),
            init_std=_real_field(hf, "initializer_range", where, 0.02),
            activation=ACTIVATIONS[act], embedding_layernorm=True, mlm_style="bert",
            pooler=pooler and head == "none", num_labels=num_labels, pad_token_id=pad)
    except ValueError as e:  # a rule BertConfig has and the checks above missed: its field
        field, _, rest = str(e).partition(":")
        raise ValueError(f"{where}: {HF_NAMES.get(field, field)}:{rest}") from None


def config_to_hf(config: BertConfig) -> dict:
    """The ``config.json`` of a BERT-architecture config (ValueError for other architectures)."""
    if not (config.embedding_layernorm and config.attn_bias and config.position == "learned"
            and not config.final_layernorm and config.type_vocab_size
            and (config.head != "mlm" or config.mlm_style == "bert")):
        raise ValueError("config: only the BERT architecture (embedding LayerNorm, token types, "
                         "biased attention, no final LayerNorm, BERT MLM head) has a Hugging Face "
                         "layout")
    act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu",
           "relu2": "relu2"}[config.activation]
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
# safetensors dtype codes of the parameters: converted to the requested dtype on load.  NumPy
# has no bfloat16 (and safetensors.numpy refuses it): a bf16 value is the upper 16 bits of the
# float32 with the same sign, exponent and leading mantissa bits, so the raw bits shifted left
# by 16 are that float32 exactly.
FLOAT_CODES = ("F64", "F32", "F16", "BF16")
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"


@dataclass(frozen=True)
class Stored:
    """A tensor of a checkpoint as its file's header describes it (nothing read yet)."""

    file: Path
    key: str  # its name in the file
    dtype: str  # safetensors dtype code: F32, BF16, I64, ...
    shape: tuple[int, ...]


def _header(file: Path) -> dict[str, Stored]:
    """The tensors a safetensors file declares (its header, validated by ``safetensors``)."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="numpy") as f:
            out = {}
            for k in f.keys():
                sl = f.get_slice(k)
                out[k] = Stored(file, k, sl.get_dtype(), tuple(sl.get_shape()))
            return out
    except Exception as e:  # noqa: BLE001 -- SafetensorError and friends: not safetensors
        raise ValueError(f"{file}: expected a safetensors file, got an unreadable one "
                         f"({type(e).__name__}: {e})") from None


def _stored_tensors(path: Path) -> dict[str, Stored]:
    """Name -> Stored of every tensor of the directory's weights (one file or a sharded
    index), from the headers alone."""
    single, index = path / WEIGHTS, path / INDEX
    if single.is_file():
        return _header(single)
    if index.is_file():
        weight_map = read_user_json(index, "a sharded checkpoint index").get("weight_map")
        if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index}: weight_map: expected an object of tensor name -> "
                             f"shard file, got {type(weight_map).__name__}")
        tensors: dict[str, Stored] = {}
        for shard in sorted(set(weight_map.values())):
            if Path(shard).name != shard or not (path / shard).is_file():
                raise ValueError(f"{index}: weight_map: expected shard files in {path}, got "
                                 f"{shard!r}")
            for k, t in _header(path / shard).items():
                if k in tensors:
                    raise ValueError(f"{index}: tensor {k!r} is in two shards "
                                     f"({tensors[k].file.name}, {shard})")
                tensors[k] = t
        listed = sorted(k for k, shard in weight_map.items()
                        if k not in tensors or tensors[k].file.name != shard)
        if listed:
            raise ValueError(f"{index}: weight_map: tensor {listed[0]!r} is not in the shard "
                             f"it names ({weight_map[listed[0]]})")
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


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 raw bits (uint16) -> the float32 values they denote, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _read_tensors(wanted: list[Stored], dtype) -> dict[str, np.ndarray]:
    """The arrays of ``wanted`` (key -> array in ``dtype``, C-contiguous), file by file."""
    from safetensors import safe_open

    out: dict[str, np.ndarray] = {}
    by_file: dict[Path, list[Stored]] = {}
    for t in wanted:
        if t.dtype not in FLOAT_CODES:
            raise ValueError(f"{t.file}: tensor {t.key!r} has dtype {t.dtype}, expected a "
                             f"float ({', '.join(FLOAT_CODES)})")
        by_file.setdefault(t.file, []).append(t)
    for file, ts in by_file.items():
        with safe_open(str(file), framework="numpy") as f:
            for t in ts:
                if t.dtype != "BF16":
                    out[t.key] = np.ascontiguousarray(f.get_tensor(t.key), dtype=dtype)
        bf16 = [t for t in ts if t.dtype == "BF16"]
        if bf16:
            with open(file, "rb") as fh:  # offsets from the header safe_open validated
                size = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(size))
                for t in bf16:
                    begin, end = header[t.key]["data_offsets"]
                    fh.seek(8 + size + begin)
                    bits = np.fromfile(fh, dtype="<u2", count=(end - begin) // 2)
                    out[t.key] = np.ascontiguousarray(
                        bf16_to_float32(bits).reshape(t.shape), dtype=dtype)
    return out


def _strip(name: str) -> str:
    return name[len("bert."):] if name.startswith("bert.") else name


def _size_fields(ours: str, config: BertConfig) -> str:
    """The config.json fields that set parameter ``ours``'s shape, with their values."""
    H = ("hidden_size",)
    special = {"embeddings.token.W": ("vocab_size", *H), "mlm.b": ("vocab_size",),
               "embeddings.position.W": ("max_position_embeddings", *H),
               "embeddings.type.W": ("type_vocab_size", *H),
               "classifier.W": ("num_labels", *H), "classifier.b": ("num_labels",)}
    leaf = ours.split(".", 2)[-1]
    fields = special.get(ours) or {"ffn.W_1": ("intermediate_size", *H),
                                   "ffn.W_2": ("intermediate_size", *H),
                                   "ffn.b_1": ("intermediate_size",)}.get(leaf, H)
    value = {"vocab_size": config.vocab_size, "max_position_embeddings": config.max_len,
             "type_vocab_size": config.type_vocab_size, "num_labels": config.num_labels,
             "intermediate_size": config.intermediate, "hidden_size": config.hidden}
    return ", ".join(f"{f}={value[f]}" for f in fields)


def _check_layers(config: BertConfig, stored: dict[str, Stored], where: Path) -> None:
    """config.json's layer count against the layers the weights' headers hold, before any
    per-layer list is built: a crafted num_hidden_layers is refused at once."""
    layers = {int(k.split(".")[2]) for k in stored
              if k.startswith("encoder.layer.") and k.split(".")[2].isdigit()}
    if config.n_layers != len(layers):
        held = f"encoder.layer.{min(layers)}-{max(layers)}" if layers else "none"
        raise ValueError(f"{where}: num_hidden_layers: expected the {len(layers)} layer(s) the "
                         f"weights hold ({held}), got {config.n_layers}")


def load_pretrained(path, dtype=np.float32) -> tuple[BertConfig, dict[str, np.ndarray]]:
    """``(config, params)`` from a Hugging Face BERT directory; ``params`` in ``dtype``
    (float32/float64 tensors as stored, float16 and bfloat16 ones converted exactly).

    config.json is validated and checked against the weights' headers before anything is
    built or read; then every tensor of the file must be used and every parameter found, with
    its shape: an unknown, missing or wrong-shaped tensor is a ValueError naming it."""
    path = Path(path)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    if not path.is_dir():
        raise ValueError(f"path: expected a checkpoint directory, got {str(path)!r}")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{path}: no config.json")
    hf = read_user_json(cfg_file, "a Hugging Face BERT config")
    raw = {_strip(k): t for k, t in _stored_tensors(path).items()
           if k.rsplit(".", 1)[-1] not in BUFFERS}
    for old, new in ((".gamma", ".weight"), (".beta", ".bias")):  # original TF-converted names
        raw = {(k[: -len(old)] + new if "LayerNorm" in k and k.endswith(old) else k): v
               for k, v in raw.items()}
    head = ("mlm" if any(k.startswith("cls.predictions.") for k in raw)
            else "classifier" if any(k.startswith("classifier.") for k in raw) else "none")
    config = config_from_hf(hf, head=head, pooler="pooler.dense.weight" in raw,
                            where=str(cfg_file))
    _check_layers(config, raw, cfg_file)
    names = _hf_names(config)
    shapes = param_shapes(config)
    for ours, (theirs, transposed) in names.items():
        if theirs not in raw:
            raise ValueError(f"{path}: missing tensor {theirs!r} (for {ours})")
        shape = raw[theirs].shape[::-1] if transposed else raw[theirs].shape
        if shape != shapes[ours]:
            raise ValueError(f"{path}: tensor {theirs!r} has shape {raw[theirs].shape}, "
                             f"expected {shapes[ours][::-1] if transposed else shapes[ours]} "
                             f"from {cfg_file.name} ({_size_fields(ours, config)})")
    # the decoder, when the file has it, must be the tied table and the head's bias
    tied = {theirs: ours for theirs, ours in (("cls.predictions.decoder.weight",
                                               "embeddings.token.W"),
                                              ("cls.predictions.decoder.bias", "mlm.b"))
            if theirs in raw and head == "mlm"}
    used = {theirs for theirs, _ in names.values()} | set(tied)
    unknown = sorted(set(raw) - used)
    if unknown:
        raise ValueError(f"{path}: unknown tensor {unknown[0]!r}" + (
            f" (and {len(unknown) - 1} more: {unknown[1:4]})" if len(unknown) > 1 else ""))
    arrays = _read_tensors([raw[k] for k in sorted(used)], dtype)
    params = {}
    for ours, (theirs, transposed) in names.items():
        a = arrays[raw[theirs].key]
        params[ours] = np.ascontiguousarray(a.T) if transposed else a
    for theirs, ours in tied.items():
        if raw[theirs].shape != params[ours].shape or not np.array_equal(
                arrays[raw[theirs].key], params[ours]):
            raise ValueError(f"{path}: tensor {theirs!r} differs from {names[ours][0]!r}: an "
                             "untied decoder is not supported")
    return config, {name: params[name] for name in shapes}  # param_shapes' order


def save_pretrained(params: dict, config: BertConfig, path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` in the Hugging Face layout of the
    config's head (BertModel / BertForMaskedLM / BertForSequenceClassification)."""
    from safetensors.numpy import save_file

    from minibert_reference.model import check_params

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
