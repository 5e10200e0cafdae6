"""Training checkpoints in safetensors (never pickle): tensors plus string metadata.

Tensors: ``param/<name>``, ``adam_m/<name>``, ``adam_v/<name>`` (exact copies: float64 stays
float64, so a resumed run continues bit-exactly).  Metadata (JSON strings): ``step`` (Adam's
update count), ``rng`` (the data generator's bit-generator state), ``model_config``,
``train_config``, ``tokenizer`` (the tokenizer.json text), ``history``, ``sha256`` (tensor name
-> SHA-256 of its bytes: a bit flip is caught on load), ``threads`` (the writer's worker count
and BLAS thread count, ``{"workers": w, "blas": b}``: either one changes the reduction order --
batch shards, BLAS blocking -- so a resume with other counts would not be bit-exact),
``extra`` (free JSON, e.g. the corpus and tokenizer hashes of the run).  ``sha256`` also holds
``meta:<field>`` -> SHA-256 of every other metadata field (the RNG state, step, configs, ...):
a changed byte anywhere in the file but the padding is refused on load.

Bytes are deterministic: the file is written here in the safetensors layout with its header
keys sorted (``safetensors``' own writer emits the metadata in a per-process hash order, so
two identical states gave two different files and ``sha256sum`` disagreed with "identical").

Loading checks, in this order and before any tensor is read: the file is a safetensors file of
this format; the metadata fields hash to their record; every tensor name belongs to a known
group; the model config is valid and its parameter shapes are exactly the tensors present (so a
config declaring 300000 layers fails at once instead of allocating); then each tensor's hash,
and that the state is one training can continue from (finite parameters and moments, second
moments >= 0, valid thread counts).  ``safetensors`` is imported lazily.
"""

from __future__ import annotations

import json
import os

import numpy as np

from minibert_reference.train.fileio import atomic_path, loads_json, sha256_bytes, sha256_text

FORMAT = "minibert-checkpoint/1"
_GROUPS = ("param", "adam_m", "adam_v")
_REQUIRED_META = ("format", "step", "rng", "model_config", "train_config", "history")
META = "meta:"  # sha256 record entries of the metadata fields: "meta:rng", "meta:step", ...
_ST_DTYPES = {np.dtype("<f8"): "F64", np.dtype("<f4"): "F32"}  # what the trainer stores


def blas_threads() -> int | None:
    """Threads the loaded BLAS uses (threadpoolctl), else the thread variables, else None."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    if threadpool_info is not None:
        counts = [int(i["num_threads"]) for i in threadpool_info()
                  if i.get("user_api") == "blas"]
        if counts:
            return max(counts)
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return None


def thread_counts() -> dict:
    """This process's ``{"workers": minibert_reference.parallel's count, "blas": BLAS threads or
    None}``."""
    from minibert_reference import parallel

    return {"workers": parallel.get_workers(), "blas": blas_threads()}


def _counts(value) -> dict | None:
    ok = (isinstance(value, dict) and set(value) == {"workers", "blas"}
          and all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)
                  for v in value.values()))
    return value if ok else None


def recorded_threads(path: str) -> dict | None:
    """The thread counts a checkpoint was written with (metadata only, no tensor read); None
    when the file or the record is absent or unreadable -- load_checkpoint reports those."""
    try:
        from safetensors import safe_open

        with safe_open(path, framework="numpy") as f:
            value = json.loads((f.metadata() or {}).get("threads", "null"))
    except Exception:  # noqa: BLE001 -- a bad file is load_checkpoint's to name
        return None
    return _counts(value)


def tensor_sha256(a: np.ndarray) -> str:
    return sha256_bytes(np.ascontiguousarray(a).tobytes())


def write_safetensors(path: str, tensors: dict, metadata: dict) -> None:
    """``tensors`` (float32/float64) and string ``metadata`` in the safetensors layout
    (8-byte little-endian header size, JSON header, the tensors' bytes), byte-deterministic:
    header keys sorted, tensors in name order.  Streams the arrays: no copy of the state."""
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name in sorted(tensors):
        a = tensors[name]
        if a.dtype not in _ST_DTYPES or not a.flags.c_contiguous:
            raise ValueError(f"tensors[{name!r}]: expected a C-contiguous little-endian float32 "
                             f"or float64 array, got dtype {a.dtype}")
        header[name] = {"dtype": _ST_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little"))
        fh.write(text)
        for name in sorted(tensors):
            fh.write(memoryview(tensors[name]).cast("B"))


def save_checkpoint(path: str, params: dict, opt_state: dict, *, rng_state: str,
                    model_config: dict, train_config: dict | None = None,
                    tokenizer_json: str | None = None, history: dict | None = None,
                    extra: dict | None = None) -> None:
    """Write atomically (temporary file, fsync, rename): a crash never leaves half a
    checkpoint, and the previous checkpoint stays until the new one is complete."""
    tensors = {}
    for group, d in zip(_GROUPS, (params, opt_state["m"], opt_state["v"])):
        for name, a in d.items():
            tensors[f"{group}/{name}"] = np.ascontiguousarray(a)
    metadata = {"format": FORMAT, "step": str(int(opt_state["step"])), "rng": rng_state,
                "model_config": json.dumps(model_config),
                "train_config": json.dumps(train_config or {}),
                "history": json.dumps(history or {}),
                "threads": json.dumps(thread_counts()),
                "extra": json.dumps(extra or {})}
    if tokenizer_json is not None:
        metadata["tokenizer"] = tokenizer_json
    record = {k: tensor_sha256(a) for k, a in tensors.items()}
    record.update({META + k: sha256_text(v) for k, v in metadata.items()})
    metadata["sha256"] = json.dumps(record, sort_keys=True)
    with atomic_path(path) as tmp:
        write_safetensors(tmp, tensors, metadata)


def _bad(path: str, what: str) -> ValueError:
    return ValueError(f"checkpoint: expected a {FORMAT} file written by minibert train, "
                      f"got {what} in {path!r}")


def _split_key(path: str, key: str) -> tuple[str, str]:
    group, sep, name = key.partition("/")
    if not sep or group not in _GROUPS or not name:
        raise _bad(path, f"an unknown tensor {key!r}")
    return group, name


def check_model_config(path: str, model_config, shapes: dict) -> None:
    """The config's parameter shapes must be exactly the ``param/`` tensors present (the shapes
    from the file header: nothing allocated yet).  The layer count is bounded by the layer
    tensors present *before* the expected shapes are enumerated."""
    from minibert_reference.config import BertConfig
    from minibert_reference.model import param_shapes

    if not isinstance(model_config, dict):
        raise _bad(path, f"model_config {type(model_config).__name__}")
    present = {name: tuple(s) for (group, name), s in shapes.items() if group == "param"}
    n_present = len({n.split(".")[1] for n in present if n.startswith("layers.")})
    n_layers = model_config.get("n_layers")
    if not isinstance(n_layers, int) or isinstance(n_layers, bool) or not (
            1 <= n_layers <= n_present):
        raise _bad(path, f"model_config n_layers={n_layers!r} but {n_present} layers of "
                         f"tensors")
    try:
        config = BertConfig.from_dict(model_config)
    except (TypeError, ValueError) as e:
        raise _bad(path, f"an invalid model_config ({e})") from None
    expected = param_shapes(config)
    if expected != present:
        diff = sorted(set(expected.items()) ^ set(present.items()))[:3]
        raise _bad(path, f"tensors that do not match model_config (first differences: {diff})")
    for group in ("adam_m", "adam_v"):
        got = {name: tuple(s) for (g, name), s in shapes.items() if g == group}
        if got != expected:
            raise _bad(path, f"{group} tensors that do not match the parameters")


def _verify_metadata(path: str, meta: dict, hashes: dict) -> None:
    """Every metadata field (the RNG state, step, configs, history, thread counts, ...) hashes
    to its ``meta:`` record entry, and no field is unrecorded."""
    for field, text in sorted(meta.items()):
        if field != "sha256" and sha256_text(text) != hashes.get(META + field):
            raise _bad(path, f"metadata {field!r} whose content hash does not match (the file "
                             f"is corrupt, or written before metadata hashes were recorded: "
                             f"load with verify=False)")


def _check_state(path: str, groups: dict) -> None:
    """A state training can continue from: finite parameters and moments, second moments
    >= 0.  A hash-valid file can still hold NaN (written by something other than the trainer,
    which never checkpoints a non-finite step): named here, not blamed later on the lr."""
    from minibert_reference.validate import non_finite

    for group in _GROUPS:
        bad = non_finite(groups[group])
        if bad:
            a = groups[group][bad[0]]
            i = tuple(int(j) for j in np.argwhere(~np.isfinite(a))[0])
            raise _bad(path, f"tensor '{group}/{bad[0]}' holding {a[i]} at index {i} (not a "
                             f"state training can continue from)")
    for name, v in groups["adam_v"].items():
        if v.size and v.min() < 0:
            i = tuple(int(j) for j in np.argwhere(v < 0)[0])
            raise _bad(path, f"tensor 'adam_v/{name}' holding {v[i]} at index {i} (a second "
                             f"moment is >= 0)")


def load_checkpoint(path: str, *, verify: bool = True) -> dict:
    """Returns dict(params, opt_state, rng_state, model_config, train_config, tokenizer_json,
    history, threads, extra, warnings) with the arrays exactly as saved.  Every problem
    with the file is a ValueError that names it."""
    from safetensors import safe_open

    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ValueError(f"checkpoint: expected an existing checkpoint file, got {path!r}")
    path = os.fspath(path)
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise _bad(path, f"format {meta.get('format')!r}")
            missing = [k for k in _REQUIRED_META if k not in meta]
            if missing:
                raise _bad(path, f"no metadata {missing}")
            hashes = loads_json(f"checkpoint {path!r} sha256", meta.get("sha256", "{}"))
            if verify:
                _verify_metadata(path, meta, hashes)
            keys = list(f.keys())
            shapes = {_split_key(path, k): f.get_slice(k).get_shape() for k in keys}
            model_config = loads_json(f"checkpoint {path!r} model_config", meta["model_config"])
            check_model_config(path, model_config, shapes)
            if verify and set(hashes) != set(keys) | {META + k for k in meta if k != "sha256"}:
                raise _bad(path, "no content hash for some tensors (written before hashes "
                                 "were recorded? load with verify=False)")
            groups: dict[str, dict[str, np.ndarray]] = {g: {} for g in _GROUPS}
            for key in keys:
                a = f.get_tensor(key)
                if verify and tensor_sha256(a) != hashes[key]:
                    raise _bad(path, f"tensor {key!r} whose content hash does not match "
                                     f"(the file is corrupt)")
                group, name = _split_key(path, key)
                groups[group][name] = a
    except ValueError:
        raise
    except Exception as e:  # SafetensorError and friends: truncated or not safetensors at all
        raise _bad(path, f"an unreadable file ({type(e).__name__}: {e})") from None
    step = meta["step"]
    if not step.isdigit():
        raise _bad(path, f"step {step!r}")
    _check_state(path, groups)
    recorded = loads_json(f"checkpoint {path!r} threads", meta.get("threads", "null"),
                          expect=None)
    threads = _counts(recorded)
    if recorded is not None and threads is None:
        raise _bad(path, f'threads {recorded!r} (expected {{"workers": n >= 1, "blas": n >= 1 '
                         f'or null}})')
    warnings = []
    now = thread_counts()
    if threads is not None and threads != now:
        warnings.append(f"checkpoint was written with {threads['workers']} worker(s) and "
                        f"{threads['blas']} BLAS thread(s), this process uses {now['workers']} "
                        f"and {now['blas']}: results will not be bit-identical to an "
                        f"uninterrupted run (pass --threads {threads['workers']})")
    return {
        "params": groups["param"],
        "opt_state": {"step": int(step), "m": groups["adam_m"], "v": groups["adam_v"]},
        "rng_state": meta["rng"],
        "model_config": model_config,
        "train_config": loads_json(f"checkpoint {path!r} train_config", meta["train_config"]),
        "tokenizer_json": meta.get("tokenizer"),
        "history": loads_json(f"checkpoint {path!r} history", meta["history"]),
        "threads": threads,
        "extra": loads_json(f"checkpoint {path!r} extra", meta.get("extra", "{}")),
        "warnings": warnings,
    }
