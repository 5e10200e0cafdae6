"""Every keyword argument of every op pair is drawn off its default somewhere (issue 41).

A pre-LN block that dropped its ``rope_base`` passed ``minibert check``: no case drew another
base, so a bug that ignores an argument was invisible wherever the argument stayed at its
default.  Here the arguments are listed from the op table's forwards (the reference's own
signatures, their one definition), the cases of each op's case families drawn -- their
fixed-seed cases and drawn ones, in the variants an implementation declaring every form gets
(the reference's declarations) -- and each argument with a default must come out at another
value in at least one case."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

import minibert_reference
from minibert_spec.protocol import OPS, capabilities
from minibert_spec.protocol.capabilities import unmet
from minibert_spec.suite import strategies as S
from tests.drawn import family_cases

# drawn cases per family (and its fixed-seed ones): a sampled_from of two to four values turns
# up in a handful
DRAWS = 10
# arguments of the reference's forwards that are not the protocol's (an implementation need not
# take them): the reason each is left out
NOT_PROTOCOL = {
    ("linear_cross_entropy", "block_rows"): "the reference's own row-block size (the protocol's "
    "signature is x, W, b, labels, ignore_index, reduction); its block boundaries are the "
    "reference's own tests, tests/reference/test_linear_cross_entropy.py",
}
# arguments no case family draws off its default yet: each a strict xfail with what is missing
# (it fails the run once a family draws it: then the entry goes)
NOT_YET: dict = {}


def keyword_defaults(op: str) -> dict:
    """The forward's arguments with a default, by name (the reference's signature)."""
    module = importlib.import_module(f"minibert_reference.{OPS[op].module}")
    params = inspect.signature(getattr(module, OPS[op].pair[0])).parameters.values()
    return {p.name: p.default for p in params if p.default is not p.empty}


def off_default(value, default) -> bool:
    """``value`` is another value than ``default`` (an array where the default is None)."""
    if default is None:
        return value is not None
    if value is None:
        return False
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return float(value) != float(default)
    return value != default


def drawn_off_default() -> dict:
    """(op, argument) -> whether some case of some family of the op passes it off its default."""
    caps = capabilities(minibert_reference)
    seen: dict = {}
    for family in S.families():
        defaults = keyword_defaults(family.op)
        for name in defaults:
            seen.setdefault((family.op, name), False)
        if unmet(caps, dict(family.needs)):
            continue
        for case in family_cases(family, caps, DRAWS):
            args = {**case.inputs, **case.fixed}
            for name, default in defaults.items():
                if name in args and off_default(args[name], default):
                    seen[(family.op, name)] = True
    return seen


@pytest.fixture(scope="module")
def coverage() -> dict:
    return drawn_off_default()


ARGUMENTS = sorted((op, name) for op, row in OPS.items()
                   if row.pair and op not in S.ops_without_cases() for name in keyword_defaults(op))


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("op, argument", [
    pytest.param(op, name, id=f"{op}.{name}",
                 marks=[pytest.mark.xfail(strict=True, reason=NOT_YET[op, name])]
                 if (op, name) in NOT_YET else [])
    for op, name in ARGUMENTS if (op, name) not in NOT_PROTOCOL])
def test_every_argument_is_drawn_off_its_default(coverage, op, argument):
    assert coverage[op, argument], (
        f"{op}: no case of its families passes {argument} at another value than its default "
        f"{keyword_defaults(op)[argument]!r}: an implementation that ignores {argument} "
        f"is never seen (draw it in spec/suite/strategies/)")


def test_the_exemptions_name_real_arguments():
    """An exemption names an argument of the op's forward (a renamed one would leave a gap)."""
    for op, name in {**NOT_PROTOCOL, **NOT_YET}:
        assert name in keyword_defaults(op), (op, name)


def test_off_default_tells_values_apart():
    assert off_default(np.zeros(2), None) and not off_default(None, None)
    assert off_default(500000.0, 10000.0) and not off_default(10000, 10000.0)
    assert off_default("half", None) and not off_default("relu", "relu")
