"""The forms of a loss row of :mod:`minibert_spec.suite.infer` (``cross_entropy``,
``linear_cross_entropy``): what the subject declares in ``CAPABILITIES`` once its forward matched
the probe's mean loss, probed by its forward alone (never a gradient).

* ``ignore_index``: the probe run with one label set to -100.  A subject that raises has none:
  ``{"ignore_index": False}`` (declaring nothing would have the suite judge it red for a form it
  never claimed).  One that gives another loss than the reference's without that position gets
  nothing declared: that may be a bug of its masking, which a declaration would hide.
* ``reduction``: where the adapter passes none, ``{"reduction": "mean"}``, so that the suite
  derives the sum from the mean instead of calling ``reduction="sum"`` (not applicable).  Except
  where the sum over no predicted position is checked (``SUM_OF_NOTHING_CHECKED``) and the
  subject's loss with every label ignored is not 0: the sum derived there would be a red for a
  sum the code never computes.
"""

from __future__ import annotations

import numpy as np

from minibert_reference.ops import IGNORE_INDEX as PROTOCOL_IGNORE_INDEX  # the losses' default
from minibert_spec.suite.infer.probes import (
    FORWARD_RTOL,
    SCALAR_OPS,
    Mapping_,
    Probe,
    _probe_values,
    _reference_forward,
    one_line,
)

LOSS_OPS = SCALAR_OPS
# the ops whose sum over no predicted position the suite checks to be 0
# (invariant[cross_entropy.sum_of_nothing_is_zero]); tests/suite/test_infer_losses.py keeps this
# in step with the registered checks
SUM_OF_NOTHING_CHECKED = ("cross_entropy",)


def declare_forms(subject, m: Mapping_, probe: Probe) -> None:
    """``m.declares`` and ``m.evidence`` gain the loss's forms (the module's docstring)."""
    raised = _declare_ignore_index(subject, m, probe)
    if "reduction" not in m.inputs:  # passed on, the suite calls either reduction
        _declare_reduction(subject, m, probe, raised)


def _declare_ignore_index(subject, m: Mapping_, probe: Probe) -> bool:
    """ignore_index=False where an ignored label makes the subject raise (then True)."""
    raised, seen = ignored_probe_run(subject, m, probe)
    where = f"with one label set to {PROTOCOL_IGNORE_INDEX} (the protocol's ignore_index)"
    if raised:
        _declare(m, "ignore_index", False)
        m.evidence.append(f"{where} it raises {seen}: declared ignore_index=False (the suite "
                          "draws no ignored positions)")
    elif seen:
        m.evidence.append(f"{where} {seen}: ignore_index left undeclared (the protocol's), so "
                          "that the suite judges its ignored positions -- review")
    return raised


def _declare_reduction(subject, m: Mapping_, probe: Probe, no_ignored: bool) -> None:
    """reduction="mean" for a subject the adapter passes no reduction, unless a sum over no
    predicted position is checked (``no_ignored``: it takes none) and its mean there is not 0."""
    checked = not no_ignored and m.op in SUM_OF_NOTHING_CHECKED
    nothing = mean_of_nothing(subject, m, probe) if checked else ""
    if nothing:
        m.evidence.append(
            f"the adapter passes no reduction, and with every label ignored {nothing}: a sum "
            "derived from its mean over no predicted position would not be 0 -- reduction left "
            "undeclared (its reduction='sum' calls are not applicable)")
        return
    _declare(m, "reduction", "mean")
    m.evidence.append(
        "the adapter passes no reduction, and the loss matched is the mean over the positions: "
        "declared reduction='mean' (the suite derives the sum and its gradient from it; "
        "undeclared, every reduction='sum' call would be not applicable)")


def _declare(m: Mapping_, option: str, value) -> None:
    m.declares = {**m.declares, m.op: {**m.declares.get(m.op, {}), option: value}}


def ignored_probe(probe: Probe, every: bool = False) -> dict:
    """The probe's values with the first label (``every``: each) set to the ignore_index."""
    vals = _probe_values(probe)
    labels = vals["labels"].copy()
    if every:
        labels.fill(PROTOCOL_IGNORE_INDEX)
    labels.flat[0] = PROTOCOL_IGNORE_INDEX
    return {**vals, "labels": labels}


def rerun(subject, m: Mapping_, probe: Probe, vals: dict, x=None) -> np.ndarray:
    """The matched subject's output (float64) on ``vals`` (its input ``x``, else the probe's);
    what it raises propagates."""
    returned, _ = subject.run(m.trial, probe, vals, vals["x"] if x is None else x)
    return np.asarray(returned[m.output] if m.output is not None else returned, np.float64)


def mean_of_nothing(subject, m: Mapping_, probe: Probe) -> str:
    """The subject's loss with every label ignored, where it is not 0 (else "")."""
    with np.errstate(all="ignore"):  # 0 / 0 is the point here, not a warning to show
        try:
            got = rerun(subject, m, probe, ignored_probe(probe, every=True))
        except Exception as e:  # noqa: BLE001 -- no loss over no position: not 0 either
            return f"it raises {one_line(e)}"
    return "" if got.shape == () and got == 0 else \
        f"its loss is {np.array2string(got, precision=6)}, not 0"


def ignored_probe_run(subject, m: Mapping_, probe: Probe) -> tuple[bool, str]:
    """The subject on :func:`ignored_probe`: (True, what it raised), or (False, the loss it
    gave where that is not the reference's with that position left out, to FORWARD_RTOL as
    the match itself), or (False, "") where it is."""
    vals = ignored_probe(probe)
    absent = [b for b in probe.optional if b not in m.trial.placed]  # as the match compared
    want = float(_reference_forward(probe.op, {k: v for k, v in vals.items()
                                               if k not in absent}))
    try:
        got = rerun(subject, m, probe, vals)
    except Exception as e:  # noqa: BLE001 -- a subject that fails on an ignored label has none
        return True, one_line(e)
    if got.shape == () and np.isfinite(got) and \
            abs(float(got) - want) <= FORWARD_RTOL * max(abs(want), 1e-300):
        return False, ""
    return False, (f"its loss is {np.array2string(got, precision=6)}, not the reference's "
                   f"{want:.6g} with that position left out")
