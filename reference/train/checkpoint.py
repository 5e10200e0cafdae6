"""Training checkpoints in safetensors (never pickle): tensors plus string metadata.

Tensors: ``param/<name>``, ``adam_m/<name>``, ``adam_v/<name>`` (exact copies: float64 stays
float64, so a resumed run continues bit-exactly).  Metadata (JSON strings): ``step`` (Adam's
update count), ``rng`` (the data generator's bit-generator state), ``model_config``,
``train_config``, ``tokenizer`` (the tokenizer.json text), ``history``.
``safetensors`` is imported lazily.
"""

from __future__ import annotations

import json
import os

import numpy as np

FORMAT = "minibert-checkpoint/1"
_GROUPS = ("param", "adam_m", "adam_v")


def save_checkpoint(path: str, params: dict, opt_state: dict, *, rng_state: str,
                    model_config: dict, train_config: dict | None = None,
                    tokenizer_json: str | None = None, history: dict | None = None) -> None:
    """Write atomically (temporary file, then rename): a crash never leaves half a checkpoint."""
    from safetensors.numpy import save_file

    tensors = {}
    for group, d in zip(_GROUPS, (params, opt_state["m"], opt_state["v"])):
        for name, a in d.items():
            tensors[f"{group}/{name}"] = np.ascontiguousarray(a)
    metadata = {"format": FORMAT, "step": str(int(opt_state["step"])), "rng": rng_state,
                "model_config": json.dumps(model_config),
                "train_config": json.dumps(train_config or {}),
                "history": json.dumps(history or {})}
    if tokenizer_json is not None:
        metadata["tokenizer"] = tokenizer_json
    tmp = f"{path}.tmp"
    save_file(tensors, tmp, metadata=metadata)
    os.replace(tmp, path)


def load_checkpoint(path: str) -> dict:
    """Returns dict(params, opt_state, rng_state, model_config, train_config, tokenizer_json,
    history) with the arrays exactly as saved."""
    from safetensors import safe_open

    if not os.path.exists(path):
        raise ValueError(f"path: expected an existing checkpoint file, got {path!r}")
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"path: expected a {FORMAT} safetensors file, got format "
                             f"{meta.get('format')!r} in {path!r}")
        groups: dict[str, dict[str, np.ndarray]] = {g: {} for g in _GROUPS}
        for key in f.keys():
            group, name = key.split("/", 1)
            groups[group][name] = f.get_tensor(key)
    return {
        "params": groups["param"],
        "opt_state": {"step": int(meta["step"]), "m": groups["adam_m"], "v": groups["adam_v"]},
        "rng_state": meta["rng"],
        "model_config": json.loads(meta["model_config"]),
        "train_config": json.loads(meta["train_config"]),
        "tokenizer_json": meta.get("tokenizer"),
        "history": json.loads(meta["history"]),
    }
