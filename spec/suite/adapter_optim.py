"""The declarative adapter of an optimizer class (:func:`optimizer`, re-exported by
:mod:`minibert_spec.suite.adapters`): the protocol's pure ``adam_init`` / ``adam_step`` made from
an optimizer that updates parameters in place (see ``optimizer``'s docstring for every
argument)."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping

import numpy as np

from minibert_spec.suite.adapter_paths import get_path, set_path

__all__ = ["optimizer", "StandInModel"]


# --------------------------------------------------------------------------- optimizers
class StandInModel:
    """The model an optimizer bound to a model (``optimizer(..., bound=True)``) is given: its
    ``params`` and ``grads`` (dicts keyed by the protocol's names), and ``parameters()`` /
    ``named_parameters()`` as parameter objects with ``data`` (also ``value``) and ``grad``."""

    class Parameter:
        def __init__(self, model, name):
            self._model, self.name = model, name

        data = property(lambda self: self._model.params[self.name],
                        lambda self, v: self._model.params.__setitem__(self.name, v))
        value = data
        grad = property(lambda self: self._model.grads[self.name],
                        lambda self, v: self._model.grads.__setitem__(self.name, v))

    def __init__(self, params):
        self.params = {k: np.array(v, copy=True) for k, v in params.items()}
        self.grads = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._parameters = [StandInModel.Parameter(self, k) for k in self.params]

    def parameters(self):
        return list(self._parameters)

    def named_parameters(self):
        return [(p.name, p) for p in self._parameters]


def _as_dict(x, names) -> dict:
    """A moment or parameter container as ``{name: array}``: a dict as it is, a list in the
    order of ``names`` (the parameters' order at init)."""
    if isinstance(x, Mapping):
        return dict(x)
    return dict(zip(names, x))


def optimizer(new: Callable, *, step: str = "step", hyper: Mapping, m, v, t: str = "t",
              no_decay: str | None = None, params: str | None = None, value: str | None = None,
              grad: str | None = None, bound: bool = False, each: str | None = None,
              each_args: tuple[str, ...] = ("param", "grad", "name")
              ) -> tuple[Callable, Callable]:
    """``(adam_init, adam_step)`` for an optimizer updating parameters in place.

    new:      ``new(params) -> optimizer`` (``new(model)`` with ``bound=True``)
    step:     its method: ``step(params, grads)`` updating ``params`` (a dict) in place, or
              ``step(grads)`` / ``step()`` for the shapes below
    hyper:    protocol keyword (``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``) ->
              attribute path set before each step; a tuple of keywords sets a tuple
              (``("beta1", "beta2"): "betas"``).  Keywords not listed are not in the
              signature (no ``weight_decay``: declare CAPABILITIES["weight_decay"] = False)
    m, v:     paths of the moments (a dict by name, or a list in the parameters' order), or
              ``optimizer -> dict`` callables
    t:        path of the step counter
    no_decay: the step method's keyword taking a collection of undecayed names, if it has one
              (without it the suite applies the protocol's default rule itself, and says so)
    params:   the optimizer *owns* its parameters at this path (a dict by name, or a list in
              the order ``new`` got them): ``step(grads)`` (grads in the same layout), or with
              ``grad`` (``"grad"``) ``step()`` reading each parameter object's gradient
              attribute; ``value`` (``"data"``): the parameter objects' value attribute
    bound:    ``new(model)`` gets a :class:`StandInModel` holding the parameters and gradients
              (``model.params``, ``model.grads``, ``model.parameters()``); ``step()``
    each:     a trainer's per-name update method, called for every name as
              ``each(param, grad, name)`` (``each_args`` orders them) updating ``param`` in
              place or returning the new one; the counter ``t`` is advanced once per step
              before it, as the trainer's own step does

    The state is ``{"step", "m", "v", "opt"}``; each step deep-copies ``opt`` (the protocol's
    ``adam_step`` is pure) and the parameters."""
    flat = {k: path for keys, path in hyper.items()
            for k in (keys if isinstance(keys, tuple) else (keys,))}
    defaults = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    unknown = sorted(set(flat) - {"lr", *defaults})
    if unknown or "lr" not in flat:
        raise ValueError(f"optimizer: hyper keys {sorted(flat)}: expected lr and some of "
                         f"{sorted(defaults)}")
    if sum(x is not None and x is not False for x in (params, bound or None, each)) > 1:
        raise ValueError("optimizer: params=, bound=True and each= are different shapes; "
                         "declare one")
    bad = sorted(set(each_args) - {"param", "grad", "name"})
    if bad:
        raise ValueError(f"optimizer: each_args {bad}: expected param, grad, name")

    def _get(opt, what, names):
        x = what(opt) if callable(what) else get_path(opt, what)
        return _as_dict(x, names) if not isinstance(x, Mapping) else x

    def state_of(opt, names, model=None):
        t_value = get_path(opt, t)
        state = {"step": t_value, "m": _get(opt, m, names), "v": _get(opt, v, names),
                 "opt": opt, "names": names}
        if model is not None:
            state["model"] = model
        return state

    def adam_init(ps):
        names = list(ps)
        if bound:
            model = StandInModel(ps)
            return state_of(new(model), names, model)
        return state_of(new({k: np.array(p, copy=True) for k, p in ps.items()}), names)

    def _load(container, names, ps):
        """Write copies of the given parameters into the optimizer's own container."""
        for i, k in enumerate(names):
            key = k if isinstance(container, Mapping) else i
            if value is not None:
                set_path(container[key], value, np.array(ps[k], copy=True))
            else:
                container[key] = np.array(ps[k], copy=True)

    def _read(container, names) -> dict:
        out = {}
        for i, k in enumerate(names):
            item = container[k if isinstance(container, Mapping) else i]
            out[k] = np.asarray(get_path(item, value) if value is not None else item)
        return out

    def adam_step(ps, grads, state, **kw):
        names = state["names"]
        opt, model = copy.deepcopy((state["opt"], state.get("model")))
        for keys, path in hyper.items():
            if isinstance(keys, tuple):
                set_path(opt, path, tuple(kw.get(k, defaults.get(k)) for k in keys))
            else:
                set_path(opt, path, kw.get(keys, defaults.get(keys)))
        new_params = {k: np.array(p, copy=True) for k, p in ps.items()}
        extra = {}
        if no_decay is not None:
            nd = kw.get("no_decay")
            if nd is None:
                from minibert_reference.optim import default_no_decay as nd
            extra[no_decay] = [k for k in ps if nd(k)] if callable(nd) else list(nd)
        g = {k: np.asarray(grads[k]) for k in names}
        if bound:
            model.params.update(new_params)
            model.grads.update({k: np.array(x, copy=True) for k, x in g.items()})
            getattr(opt, step)(**extra)
            new_params = {k: np.asarray(model.params[k]) for k in names}
        elif params is not None:
            container = get_path(opt, params)
            _load(container, names, new_params)
            if grad is not None:
                for i, k in enumerate(names):
                    item = container[k if isinstance(container, Mapping) else i]
                    set_path(item, grad, np.array(g[k], copy=True))
                getattr(opt, step)(**extra)
            else:
                getattr(opt, step)(g if isinstance(container, Mapping) else
                                   [g[k] for k in names], **extra)
            new_params = _read(get_path(opt, params), names)
        elif each is not None:
            set_path(opt, t, get_path(opt, t) + 1)
            update = getattr(opt, each)
            for k in names:
                given = {"param": new_params[k], "grad": g[k], "name": k}
                r = update(*(given[a] for a in each_args), **extra)
                if isinstance(r, np.ndarray) and r.shape == new_params[k].shape:
                    new_params[k] = r
        else:
            getattr(opt, step)(new_params, grads, **extra)
        return new_params, state_of(opt, names, model)

    P = inspect.Parameter
    adam_step.__signature__ = inspect.Signature(
        [P("params", P.POSITIONAL_OR_KEYWORD), P("grads", P.POSITIONAL_OR_KEYWORD),
         P("state", P.POSITIONAL_OR_KEYWORD), P("lr", P.KEYWORD_ONLY)]
        + [P(k, P.KEYWORD_ONLY, default=d) for k, d in defaults.items() if k in flat]
        + ([P("no_decay", P.KEYWORD_ONLY, default=None)] if no_decay is not None else []))
    return adam_init, adam_step
