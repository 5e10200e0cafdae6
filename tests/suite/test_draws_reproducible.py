"""A check's examples follow from its seed alone, not from which modules the process loaded
before it (Hypothesis mixes constants read from the source of loaded local modules into its
draws: minibert_spec.suite.run.draws_from_seed_alone).  Two runs on one implementation agree,
in a pool worker as alone, and a red's rerun line reproduces it."""

from __future__ import annotations

import contextlib
import importlib
from types import SimpleNamespace

import numpy as np

import minibert_reference as R
import minibert_spec.suite.run as run_module
from minibert_spec.suite.registry import all_checks
from minibert_spec.suite.run import check_settings, run_check

CHECK = "fd[silu]"
# a local module full of floats and integers a SiLU case may draw (inside [-4, 4], small sizes)
CONSTANTS = ("VALUES = [" + ", ".join(repr(float(v)) for v in np.linspace(-3.9, 3.9, 157))
             + "]\nSIZES = [" + ", ".join(str(i) for i in range(1, 40)) + "]\n")


def _drawn() -> list[bytes]:
    """The bytes of every x the check's SiLU forward was called with."""
    seen: list[bytes] = []

    def silu_forward(x):
        seen.append(np.asarray(x).tobytes())
        return R.silu_forward(x)

    impl = SimpleNamespace(silu_forward=silu_forward, silu_backward=R.silu_backward)
    check = next(c for c in all_checks() if c.id == CHECK)
    result = run_check(check, impl, settings=check_settings(max_examples=60, derandomize=True))
    assert result.outcome == "passed", result.message
    return seen


def test_a_checks_draws_do_not_depend_on_the_modules_loaded(tmp_path, monkeypatch):
    alone = _drawn()
    with monkeypatch.context() as m:  # Hypothesis as it is: the constants pool on
        m.setattr(run_module, "draws_from_seed_alone", contextlib.nullcontext)
        pooled_before = _drawn()
        (tmp_path / "minibert_many_constants.py").write_text(CONSTANTS)
        m.syspath_prepend(str(tmp_path))
        importlib.import_module("minibert_many_constants")
        pooled_after = _drawn()
    # the hazard is real: one more local module loaded, other examples drawn ...
    assert pooled_before != pooled_after
    # ... and gone: the same examples as before that module was loaded
    assert _drawn() == alone
