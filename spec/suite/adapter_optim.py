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


def _keyword(path: str) -> str | None:
    """``"lr="`` -> ``"lr"``: a keyword of the step call, not an attribute path."""
    return path[:-1] if isinstance(path, str) and path.endswith("=") else None


def optimizer(new: Callable, *, step: str = "step", hyper: Mapping, m, v, t: str = "t",
              no_decay: str | None = None, params: str | None = None, value: str | None = None,
              grad: str | None = None, bound: bool = False, each: str | None = None,
              each_args: tuple[str, ...] = ("param", "grad", "name"), first_t: int | None = None
              ) -> tuple[Callable, Callable]:
    """``(adam_init, adam_step)`` for an optimizer updating parameters in place.

    new:      ``new(params) -> optimizer`` (``new(model)`` with ``bound=True``)
    step:     its method: ``step(params, grads)`` updating ``params`` (a dict) in place, or
              ``step(grads)`` / ``step()`` for the shapes below
    hyper:    protocol keyword (``lr``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``) ->
              attribute path set before each step; a tuple of keywords sets a tuple
              (``("beta1", "beta2"): "betas"``).  A path ending in ``=`` is a keyword of the
              step call instead (``{"lr": "lr="}``: ``opt.step(params, grads, lr=lr_t)``; with
              ``each``, of each per-name call).  Keywords not listed are not in the
              signature (no ``weight_decay``: declare CAPABILITIES["weight_decay"] = False)
    m, v:     paths of the moments (a dict by name, or a list in the parameters' order), or
              ``optimizer -> dict`` callables
    t:        path of the step counter; ``"t="``: the counter is kept outside the update
              (by the training loop) and passed as that keyword of the step call, the suite
              counting the steps (``each_args`` naming ``"t"``: passed in that place instead)
    first_t:  with an outside counter, the value passed at the first step: 1 (the update
              corrects by ``1 - beta ** t``) or 0 (a loop's ``for t in range(steps)``, the
              update adding 1 itself); required there, refused with a counter inside
    no_decay: the step method's keyword taking a collection of undecayed names, if it has one
              (without it the suite applies the protocol's default rule itself, and says so)
    params:   the optimizer *owns* its parameters at this path (a dict by name, or a list in
              the order ``new`` got them): ``step(grads)`` (grads in the same layout), or with
              ``grad`` (``"grad"``) ``step()`` reading each parameter object's gradient
              attribute; ``value`` (``"data"``): the parameter objects' value attribute
    bound:    ``new(model)`` gets a :class:`StandInModel` holding the parameters and gradients
              (``model.params``, ``model.grads``, ``model.parameters()``); ``step()``
    each:     a trainer's per-name update method, called for every name as
              ``each(param, grad, name)`` (``each_args`` orders them, and may add ``"t"``)
              updating ``param`` in place or returning the new one; a counter ``t`` inside is
              advanced once per step before it, as the trainer's own step does

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
    bad = sorted(set(each_args) - {"param", "grad", "name", "t"})
    if bad:
        raise ValueError(f"optimizer: each_args {bad}: expected param, grad, name, t")
    outside = _keyword(t) is not None or "t" in each_args  # the loop's counter, not opt's
    if outside and (first_t not in (0, 1) or isinstance(first_t, bool)):
        where = f"each_args {each_args!r}" if "t" in each_args else f"t={t!r}"
        raise ValueError(f"optimizer: {where}: a counter kept outside the update: expected "
                         f"first_t=0 or 1 (its value at the first step), got first_t={first_t!r}")
    if not outside and first_t is not None:
        raise ValueError(f"optimizer: first_t={first_t!r} is for a counter kept outside the "
                         f"update (t='t=' or 't' in each_args); got t={t!r}, the optimizer's own")

    def _get(opt, what, names):  # a moment: a dict, or a list in the parameters' order at init
        x = what(opt) if callable(what) else get_path(opt, what)
        return x if isinstance(x, Mapping) else dict(zip(names, x))

    def state_of(opt, names, model=None, done=0):
        t_value = done if outside else get_path(opt, t)
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
        extra = {}  # the step call's keywords
        for keys, path in hyper.items():
            got = tuple(kw.get(k, defaults.get(k)) for k in keys) if isinstance(keys, tuple) \
                else kw.get(keys, defaults.get(keys))
            if _keyword(path) is not None:
                extra[_keyword(path)] = got
            else:
                set_path(opt, path, got)
        done = state["step"] if outside else 0  # steps taken, as the loop counts them
        if outside and "t" not in each_args:
            extra[_keyword(t)] = first_t + done
        new_params = {k: np.array(p, copy=True) for k, p in ps.items()}
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
            if not outside:
                set_path(opt, t, get_path(opt, t) + 1)
            update = getattr(opt, each)
            for k in names:
                given = {"param": new_params[k], "grad": g[k], "name": k,
                         "t": first_t + done if outside else None}
                r = update(*(given[a] for a in each_args), **extra)
                if isinstance(r, np.ndarray) and r.shape == new_params[k].shape:
                    new_params[k] = r
        else:
            getattr(opt, step)(new_params, grads, **extra)
        return new_params, state_of(opt, names, model, done + 1)

    P = inspect.Parameter
    adam_step.__signature__ = inspect.Signature(
        [P("params", P.POSITIONAL_OR_KEYWORD), P("grads", P.POSITIONAL_OR_KEYWORD),
         P("state", P.POSITIONAL_OR_KEYWORD), P("lr", P.KEYWORD_ONLY)]
        + [P(k, P.KEYWORD_ONLY, default=d) for k, d in defaults.items() if k in flat]
        + ([P("no_decay", P.KEYWORD_ONLY, default=None)] if no_decay is not None else []))
    return adam_init, adam_step
