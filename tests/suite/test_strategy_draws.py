"""The draws of one example differ (issue 41): arrays of SEEDED_FROM elements or more come from
one drawn seed each, and Hypothesis hands two draws of one example the same integer on purpose
(in a few examples of a run: too few to count on); without the salt (how many seeded arrays the
example drew before) W_q = W_k, y_hat = y, and a swap of their gradients is invisible.  Here
every seed drawn is the same integer, the collision in every example."""

from __future__ import annotations

import itertools
import sys

import numpy as np
from hypothesis import strategies as st

import minibert_reference
from minibert_spec.protocol import capabilities
from minibert_spec.suite import strategies as S
from tests.drawn import family_cases

# families whose cases hold two or more inputs of one shape in every example (mse's y_hat and
# y, SwiGLU's W_1 and W_3)
FAMILIES = ("mse", "swiglu")
DRAWS = 20


def drawn(name: str) -> list:
    return family_cases(S.family(name), capabilities(minibert_reference), DRAWS)


def seeded_pairs(case) -> list:
    """(name, name, a, b) for every two inputs of one shape drawn from seeds (SEEDED_FROM
    elements or more)."""
    arrays = [(n, np.asarray(a)) for n, a in case.inputs.items()
              if a is not None and np.size(a) >= S.SEEDED_FROM]
    return [(m, n, a, b) for (m, a), (n, b) in itertools.combinations(arrays, 2)
            if a.shape == b.shape]


def test_two_arrays_drawn_in_one_example_differ(monkeypatch):
    # every seed of an example the same: ``_seed`` of each module of the package that has one
    # (a module calls its own name: the kit's seeded arrays, each family's case seed)
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[:4] == S.__name__.split(".") and hasattr(module, "_seed"):
            monkeypatch.setattr(module, "_seed", lambda: st.just(7))
    compared = 0
    for name in FAMILIES:
        for case in drawn(name):
            for m, n, a, b in seeded_pairs(case):
                compared += 1
                assert not np.array_equal(a, b), (
                    f"{name}: {m} and {n} drawn equal in one example (a lost salt: a swap of "
                    f"their gradients would pass)")
    assert compared >= DRAWS // 2, f"only {compared} pairs of one shape compared"
