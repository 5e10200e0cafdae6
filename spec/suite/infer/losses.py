"""The forms of a loss row of :mod:`minibert_spec.suite.infer` (``cross_entropy``,
``linear_cross_entropy``): what the subject declares in ``CAPABILITIES`` once its forward matched
the probe's mean loss over every position.

* ``ignore_index``: the probe run once more with one label set to the protocol's ignore_index
  (-100).  Where the subject raises (code without ignored positions indexes its probabilities
  by the label: -100 is out of range for the probe's V = 5), it has none:
  ``{"ignore_index": False}`` (the suite then draws every label in [0, V) and checks the
  predicted rows alone); declaring nothing would have the suite judge it red for a form it
  never claimed.  Where it gives a loss that is not the reference's with that position left
  out, nothing is declared: that may be a bug of its masking (a mean over every position,
  ignored ones included), which the declaration would hide -- the suite judges it, and the
  evidence line says what was seen, for the user to review;
* ``reduction``: where the adapter passes no ``reduction`` to the subject (it gives the mean
  the probe matched, and has no such argument or one the adapter leaves at its default),
  ``{"reduction": "mean"}``: the suite derives the sum and its gradient from the mean (x the
  kept positions) rather than calling ``reduction="sum"``, which the adapter could only answer
  *not applicable* -- the sum's checks run, on the subject's own mean.  Except for an op whose
  sum over no predicted position the suite checks (``SUM_OF_NOTHING_CHECKED``) where the
  subject takes ignored positions and its loss with every label ignored is not 0 (the
  reference's own mean of nothing is 0/0): the sum derived there would be that times 0, not the
  0 the suite requires -- a red for a sum the code never computes; undeclared, its sum calls are
  not applicable.

Neither decision looks at a gradient: the backward is judged by ``minibert check`` alone.
"""

from __future__ import annotations

import numpy as np

from minibert_reference.ops import IGNORE_INDEX as PROTOCOL_IGNORE_INDEX  # the losses' default
from minibert_spec.suite.infer.probes import (
    FORWARD_RTOL,
    Mapping_,
    Probe,
    _probe_values,
    _reference_forward,
)

LOSS_OPS = ("cross_entropy", "linear_cross_entropy")
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
    """ignore_index=False where an ignored label makes the subject raise (returned: True)."""
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
    """The probe's values with the first label (``every``: each label) set to the protocol's
    ignore_index."""
    vals = _probe_values(probe)
    labels = vals["labels"].copy()
    if every:
        labels.fill(PROTOCOL_IGNORE_INDEX)
    else:
        labels.flat[0] = PROTOCOL_IGNORE_INDEX
    return {**vals, "labels": labels}


def _run_loss(subject, m: Mapping_, probe: Probe, vals: dict) -> np.ndarray:
    """The subject's loss on ``vals`` (float64); what it raises propagates."""
    returned, _ = subject.run(m.trial, probe, vals, vals["x"])
    return np.asarray(returned[m.output] if m.output is not None else returned, np.float64)


def mean_of_nothing(subject, m: Mapping_, probe: Probe) -> str:
    """What the subject's loss is with every label ignored, where that is not 0 ("" where it
    is)."""
    with np.errstate(all="ignore"):  # 0 / 0 is the point here, not a warning to show
        try:
            got = _run_loss(subject, m, probe, ignored_probe(probe, every=True))
        except Exception as e:  # noqa: BLE001 -- no loss over no position: not 0 either
            return f"it raises {_said(e)}"
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
        got = _run_loss(subject, m, probe, vals)
    except Exception as e:  # noqa: BLE001 -- a subject that fails on an ignored label has none
        return True, _said(e)
    if got.shape == () and np.isfinite(got) and \
            abs(float(got) - want) <= FORWARD_RTOL * max(abs(want), 1e-300):
        return False, ""
    return False, (f"its loss is {np.array2string(got, precision=6)}, not the reference's "
                   f"{want:.6g} with that position left out")


def _said(e: Exception) -> str:
    """An exception in one line, for an evidence comment."""
    return f"{type(e).__name__}: {str(e).strip().partition(chr(10))[0]}"
