"""Claims of the NumPy-Transformer document: its architecture and reported training result
(§5), and its closing claim of exact correspondence."""

from __future__ import annotations

import json
import math
from pathlib import Path

from minibert_spec.claims import TRAINING_RESULT, Result, claim, exact_correspondence
from minibert_spec.paths import HOME
from minibert_spec.sources import SEED001


@claim("seed001.architecture", "The NumPy Transformer has 2 layers, d_model=64, 4 heads, "
       "d_ff=256", f"{SEED001} §5", "2, 64, 4, 256", "confirmed")
def _seed_arch(ctx):
    c = ctx.impl.seed001()
    shapes = ctx.impl.param_shapes(c)
    got = (sum(1 for k in shapes if k.endswith("attn.W_q")), shapes["layers.0.attn.W_q"][0],
           c.n_heads, shapes["layers.0.ffn.W_1"][1])
    return Result(", ".join(map(str, got)), "confirmed" if got == (2, 64, 4, 256) else "refuted",
                  f"the seed001 preset (d_k = {c.hidden // c.n_heads})")


def _training_result() -> dict | None:
    try:
        return json.loads(TRAINING_RESULT.read_text())
    except (OSError, ValueError):
        return None


@claim("seed001.mse", "After 500 epochs the reconstruction MSE is 0.0043", f"{SEED001} §5",
       "0.0043", "not reproducible")
def _seed_mse(ctx):
    r = _training_result()
    if r is None:
        return Result("-", "not reproducible",
                      "the document gives no data set, sequence length or learning rate",
                      pending=f"no training result at {TRAINING_RESULT.relative_to(_root_dir())}"
                              " (written by the training code)")
    mse = float(r["final_mse"])
    verdict = "confirmed" if mse <= 0.0043 * 1.5 else "not reproducible"
    return Result(f"{mse:.4g} after {r.get('epochs')} epochs", verdict,
                  f"{r.get('command', '')}; confirmed when within 1.5x of 0.0043 or below "
                  "(the document's data are unknown)")


@claim("seed001.token_error", "The per-token embedding error is about 0.02", f"{SEED001} §5",
       "≈ 0.02", "not reproducible")
def _seed_tok(ctx):
    r = _training_result()
    if r is None or "per_token_error" not in r:
        return Result("-", "not reproducible", "no definition of the error in the document",
                      pending="no per_token_error in the training result")
    e = float(r["per_token_error"])
    return Result(f"{e:.3g}", "confirmed" if math.isclose(e, 0.02, rel_tol=0.5) or e < 0.02
                  else "not reproducible", r.get("command", ""))


@claim("seed001.exact_correspondence", "Every equation of the document matches the code "
       "exactly", f"{SEED001} (title, closing line)", "100%", "refuted")
def _seed_exact(ctx):
    return exact_correspondence(SEED001)


def _root_dir() -> Path:
    return HOME
