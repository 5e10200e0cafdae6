"""The case families of the built-in ops' declarations (spec/builtin/): each ``Family`` becomes
a ``@cases`` family of kit.FAMILIES, its drawing and fixed examples handed the kit."""

from __future__ import annotations

import inspect

from hypothesis import strategies as st

from minibert_spec.builtin import Family, declarations
from minibert_spec.suite.strategies import kit


def _handed_kit(fn, wrapper):
    """``wrapper`` with ``fn``'s signature less its second parameter (the kit it is handed):
    the family reads its variant keywords from the signature (kit._parameters)."""
    params = list(inspect.signature(fn).parameters.values())
    wrapper.__signature__ = inspect.Signature(params[:1] + params[2:])
    wrapper.__doc__, wrapper.__name__ = fn.__doc__, fn.__name__
    return wrapper


def _register(op: str, family: Family) -> None:
    draw = _handed_kit(family.draw, lambda draw, **kw: family.draw(draw, kit, **kw))
    strategy = st.composite(draw)
    if family.examples is not None:
        strategy = kit.fixed_examples(_handed_kit(
            family.examples, lambda rng, **kw: family.examples(rng, kit, **kw)))(strategy)
    kit.cases(op, family.variant, torch=family.torch, **family.options)(strategy)


for _decl in declarations():
    for _family in _decl.families:
        _register(_decl.name, _family)
