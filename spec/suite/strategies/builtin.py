"""The case families of the built-in ops' declarations (spec/builtin/): each ``Family`` becomes
a ``@cases`` family of kit.FAMILIES, its drawing and fixed examples handed the kit."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

from hypothesis import strategies as st

from minibert_spec.builtin import Family, declarations
from minibert_spec.protocol.norm_eps import eps_of
from minibert_spec.suite.strategies import kit
from minibert_spec.suite.strategies.embeddings import rope_bases
from minibert_spec.suite.strategies.norms import layernorm_eps

# what a declared family's drawing is handed: the drawing kit, the norms' eps draw and a
# variant's eps (False: 0, a number: the one the code fixes, True: the default)
HANDED = SimpleNamespace(**{n: getattr(kit, n) for n in dir(kit) if not n.startswith("__")},
                         layernorm_eps=layernorm_eps, eps_of=eps_of, rope_bases=rope_bases)


def _handed_kit(fn, wrapper):
    """``wrapper`` with ``fn``'s signature less its second parameter (the kit it is handed):
    the family reads its variant keywords from the signature (kit._parameters)."""
    params = list(inspect.signature(fn).parameters.values())
    wrapper.__signature__ = inspect.Signature(params[:1] + params[2:])
    wrapper.__doc__, wrapper.__name__ = fn.__doc__, fn.__name__
    return wrapper


def _register(op: str, family: Family) -> None:
    # Hypothesis binds the variant keywords by the signature: they may come positionally
    draw = _handed_kit(family.draw, lambda draw, *a, **kw: family.draw(draw, HANDED, *a, **kw))
    strategy = st.composite(draw)
    if family.examples is not None:
        build = _handed_kit(family.examples,
                            lambda rng, *a, **kw: family.examples(rng, HANDED, *a, **kw))
        strategy = kit.fixed_examples(build)(strategy)
    kit.cases(op, family.variant, torch=family.torch, **family.options)(strategy)


for _decl in declarations():
    for _family in _decl.families:
        _register(_decl.name, _family)
