"""Hostile implementation whose misbehaviour is chosen by the environment, for the probe of
every entry point (tests/suite/test_hostile_entry_points.py): ``MINIBERT_HOSTILE=STAGE:ACTION``
with STAGE one of ``import``, ``construct`` (the layer's ``__init__``), ``forward``,
``backward``, ``class`` (a metaclass whose attribute lookups raise once the class exists), and
ACTION one of

* ``hang``: sleeps an hour; ``busy``: a busy loop; ``thread``: leaves a non-daemon thread that
  never ends (the call itself returns),
* ``exit``: ``sys.exit(0)``; ``os_exit``: ``os._exit(0)``; ``crash``: SIGKILL to itself,
* ``raise``: a RuntimeError; ``print``: writes to stdout and stderr, then behaves.

Unset, it is a correct ReLU layer (the reference's kernels): ``minibert check`` and ``adapter
infer`` see one class-style ReLU (``ReLU``, adapted by ``layer``), the only subject of each."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from minibert_reference import ops
from minibert_spec.suite.adapters import layer

STAGE, _, ACTION = os.environ.get("MINIBERT_HOSTILE", "").partition(":")


def _misbehave(stage: str) -> None:
    if stage != STAGE:
        return
    if ACTION == "hang":
        time.sleep(3600)
    elif ACTION == "busy":
        while True:
            pass
    elif ACTION == "thread":
        threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
    elif ACTION == "exit":
        sys.exit(0)
    elif ACTION == "os_exit":
        os._exit(0)
    elif ACTION == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif ACTION == "raise":
        raise RuntimeError(f"hostile_anywhere: raised in {stage}")
    elif ACTION == "print":
        print(f"hostile_anywhere: printed in {stage}")
        print(f"hostile_anywhere: printed to stderr in {stage}", file=sys.stderr)


class _Meta(type):
    """With STAGE ``class``: once the module is imported, any lookup on the class but its name
    raises (ACTION ignored)."""

    def __getattribute__(cls, name):
        if STAGE == "class" and _LOADED and name not in ("__name__", "__qualname__", "__class__"):
            raise RuntimeError(f"hostile_anywhere: the metaclass refuses {name!r}")
        return super().__getattribute__(name)


_LOADED = False
_misbehave("import")


class ReLU(metaclass=_Meta):
    def __init__(self):
        _misbehave("construct")

    def forward(self, x):
        _misbehave("forward")
        y, self.cache = ops._relu_forward(x)
        return y

    def backward(self, dout):
        _misbehave("backward")
        (dx,) = ops._relu_backward(dout, self.cache)
        return dx


relu_forward, relu_backward = layer("relu", ReLU)
_LOADED = True
