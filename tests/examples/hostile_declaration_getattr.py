"""Hostile adapter: reading its CAPABILITIES raises (a module ``__getattr__`` that fails).  It used
to be judged with the defaults, its declaration ignored without a word; now every entry point
refuses it in one line (exit 2), naming the exception."""

from minibert_reference.ops import linear_backward, linear_forward, relu_backward, relu_forward  # noqa: F401


def __getattr__(name):
    if name == "CAPABILITIES":
        raise RuntimeError("the declaration table is not built yet")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
