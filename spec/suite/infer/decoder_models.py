"""The parts of a user's module the decoder row (:mod:`~minibert_spec.suite.infer.decoder`)
runs: the parameter source (:func:`param_source`), the model -- a builder function
(:class:`Builder`) or a class over the parameter dict (:class:`ClassModel`) -- each with the
source of the adapter's ``decoder_model`` and backward written for it, and the loss
(:func:`find_loss`: a module function, or the model's own loss method)."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import numpy as np

from minibert_reference.ops import IGNORE_INDEX
from minibert_spec.suite.adapter_decoder import _loss_arguments
from minibert_spec.suite.infer.probes import BACKWARDS, FORWARDS, deviation
from minibert_spec.suite.infer.subjects import _method, own_functions

# the config's fields a builder's or a model class's argument may name (its spelling -> the
# field's expression in the adapter)
CONFIG_KEYWORDS = {"config.n_heads": ("n_heads", "n_head", "num_heads", "nhead", "heads"),
                   "config.rope_base": ("rope_base", "rope_theta", "theta", "base"),
                   "config.ln_eps": ("eps", "ln_eps", "norm_eps", "epsilon", "layer_norm_eps"),
                   "config.n_layers": ("n_layers", "n_layer", "num_layers"),
                   "config.tie_embeddings": ("tied", "tie_embeddings", "tie_weights", "tie")}
# a RoPE base defaulting to None (no RoPE): the config's where it has RoPE, else None
ROPE_OR_NONE = "config.rope_base if config.rope else None"
# a model class's argument taking the parameter dict
PARAMS_ARGS = ("weights", "params", "parameters", "param_dict", "state_dict", "state", "w", "p")
# the names of a function without arguments that may return the parameters (the others are
# called only once a decoder's parameters were found: a builder)
PARAM_SOURCE = re.compile(r"init|param|weight", re.IGNORECASE)
# the names of a function without arguments that may build the model (called only in a module
# with a parameter source; a main() or a train() is never called)
BUILDER = re.compile(r"make|build|create|model|new|gpt|decoder|llama|net", re.IGNORECASE)
# a model's loss method's arguments by their names -> the protocol's
LOSS_METHODS = ("loss", "compute_loss", "loss_fn", "lm_loss")
LOSS_ROLES = {"input_ids": ("input_ids", "ids", "idx", "tokens", "x"),
              "labels": ("labels", "targets", "target", "y"), "ignore_index": ("ignore_index",)}


def no_arg_functions(mod) -> list:
    """(name, function) of the module's own public functions callable without arguments."""
    out = []
    for name, f in own_functions(mod):
        try:
            sig = inspect.signature(f)
        except (TypeError, ValueError):
            continue
        if all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in sig.parameters.values()):
            out.append((name, f))
    return out


def _is_param_dict(value) -> bool:
    return isinstance(value, dict) and len(value) >= 3 and all(
        isinstance(k, str) and isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)
        for k, v in value.items())


def param_source(mod, functions) -> tuple[str, dict] | None:
    """(its expression, the dict) of the model's parameters: a function without arguments
    returning them (``init_params()``), else a module-level dict of arrays."""
    for name, f in functions:
        if not PARAM_SOURCE.search(name):
            continue  # a function called unasked is one named as a parameter source only
        try:
            value = f()
        except Exception:  # noqa: BLE001 -- not a parameter source
            continue
        if _is_param_dict(value):
            return f"{name}()", value
    for name, value in vars(mod).items():
        if not name.startswith("_") and _is_param_dict(value):
            return name, value
    return None


def _keywords(params) -> dict:
    """{argument: config expression} of the arguments naming a config field."""
    out = {}
    for p in params:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        for expr, spellings in CONFIG_KEYWORDS.items():
            if p.name in spellings:
                out[p.name] = ROPE_OR_NONE if expr == "config.rope_base" and \
                    p.default is None else expr
    return out


@dataclass
class Builder:
    """A function building the model, ``(forward, backward)``, from the config's keywords."""

    name: str
    keywords: dict  # its keyword -> the config's expression
    logits: bool  # the pair's .logits functions (the pair itself ends in the loss)
    backward_source = "lambda dlogits, cache: cache[0](dlogits, cache[1])"

    @property
    def label(self) -> str:
        return f"impl.{self.name}({', '.join(f'{k}={v}' for k, v in self.keywords.items())})" \
            + (".logits" if self.logits else "")

    def source(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.keywords.items())
        dot = ".logits" if self.logits else ""
        return (f"def decoder_model(params, config, input_ids):  # impl.{self.name}'s model of "
                "the config\n"
                f"    forward, backward = impl.{self.name}({args})\n"
                f"    logits, cache = forward{dot}(params, input_ids)\n"
                f"    return logits, (backward{dot}, cache)\n")

    def losses(self, mod) -> list:
        return module_losses(mod)


@dataclass
class ClassModel:
    """A model class built on the parameter dict and the config's arguments, its forward
    ``(ids) -> logits``, its backward ``(dlogits) -> grads``."""

    cls: type
    params_arg: str
    keywords: dict
    forward: str
    backward: str

    @property
    def name(self) -> str:
        return self.cls.__name__

    @property
    def args(self) -> str:
        return ", ".join([f"{self.params_arg}=params",
                          *(f"{k}={v}" for k, v in self.keywords.items())])

    @property
    def label(self) -> str:
        return f"impl.{self.name}({self.args}).{self.forward}"

    @property
    def backward_source(self) -> str:
        return f"lambda dlogits, model: model.{self.backward}(dlogits)"

    def source(self) -> str:
        return (f"def decoder_model(params, config, input_ids):  # impl.{self.name} of the "
                "config\n"
                f"    model = impl.{self.name}({self.args})\n"
                f"    return model.{self.forward}(input_ids), model\n")

    def losses(self, mod) -> list:
        """The model's loss method, called as its arguments' names say, its dlogits the
        attribute it leaves of the logits' name (``dlogits``) -- and the module's functions."""
        out = []
        for name in LOSS_METHODS:
            method = getattr(self.cls, name, None)
            if not callable(method):
                continue
            args = list(inspect.signature(method).parameters.values())[1:]
            roles = {p.name: next((r for r, s in LOSS_ROLES.items() if p.name in s), None)
                     for p in args}
            if any(r is None for p, r in zip(args, roles.values()) if p.default is p.empty):
                continue
            call = ", ".join(f"{a}={r}" for a, r in roles.items() if r)
            given = ", ".join(r for r in LOSS_ROLES if r in roles.values())
            dlogits = next((a for a in ("dlogits", "dlogits_", "grad_logits", "dz")
                            if a in _assigned(self.cls)), None)
            if dlogits is None:
                continue
            out.append(f"lambda cache, {given}: (cache.{name}({call}), cache.{dlogits})")
        return out + module_losses(mod)


def _assigned(cls) -> set:
    """The attributes the methods of ``cls`` and its bases assign (``self.dlogits = ...``)."""
    out = set()
    for klass in cls.__mro__[:-1]:  # not object
        try:
            text = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        out |= set(re.findall(r"self\.(\w+)\s*(?:\[[^\]]*\])?\s*=", text))
    return out


def builders(functions) -> list[Builder]:
    """The functions named like a builder that return two functions (a forward and its
    backward), the pair's ``.logits`` first where both have them."""
    out = []
    for name, f in functions:
        if not BUILDER.search(name):
            continue
        try:
            pair = f()
        except Exception:  # noqa: BLE001 -- not a builder
            continue
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(map(callable, pair))):
            continue
        keywords = _keywords(inspect.signature(f).parameters.values())
        if all(callable(getattr(g, "logits", None)) for g in pair):
            out.append(Builder(name, keywords, True))
        out.append(Builder(name, keywords, False))
    return out


def class_models(mod) -> list[ClassModel]:
    """The module's classes with a forward and a backward method whose constructor takes the
    parameter dict (an argument named so) and, besides, only arguments naming the config's
    fields (or with defaults)."""
    out = []
    for _, cls in inspect.getmembers(mod, inspect.isclass):
        if cls.__module__ != mod.__name__:
            continue
        forward, backward = _method(cls, FORWARDS), _method(cls, BACKWARDS)
        try:
            params = list(inspect.signature(cls).parameters.values())
        except (TypeError, ValueError):
            continue
        taking = next((p.name for p in params if p.name in PARAMS_ARGS), None)
        if forward is None or backward is None or taking is None:
            continue
        keywords = _keywords(p for p in params if p.name != taking)
        if all(p.default is not p.empty or p.name in keywords or p.name == taking
               for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)):
            out.append(ClassModel(cls, taking, keywords, forward, backward))
    return out


def module_losses(mod) -> list:
    """``impl.<name>`` of the module's functions that take the logits (and some of the
    labels, the ids, ignore_index) as ``decoder()`` calls a loss."""
    out = []
    for name, f in own_functions(mod):
        try:
            wants = _loss_arguments(f)
        except (ValueError, TypeError):
            continue
        if "logits" in wants and "cache" not in wants:
            out.append(f"impl.{name}")
    return out


def find_loss(candidates, mod, logits, cache, ids, want_loss, rtol: float):
    """(expression, evidence) of the first of ``candidates`` (adapter source) whose loss, called
    as ``decoder()`` calls it, equals ``want_loss(labels)`` (labels with ``ignore_index`` where
    it takes labels), or None.  Its dlogits is never compared."""
    labels = ids.copy()
    labels[0, 2] = IGNORE_INDEX
    for expr in candidates:
        try:
            fn = eval(expr, {"impl": mod})  # noqa: S307 -- our own text, as it is written
            wants = _loss_arguments(fn)
        except Exception:  # noqa: BLE001 -- not a loss decoder() takes
            continue
        lab = labels if "labels" in wants else ids
        given = {"logits": np.array(logits), "labels": lab, "input_ids": ids,
                 "ignore_index": IGNORE_INDEX, "cache": cache}
        try:
            value = fn(**{n: given[n] for n in wants})
        except Exception:  # noqa: BLE001 -- not this model's loss
            continue
        if not (isinstance(value, tuple) and len(value) == 2):
            continue
        dev = deviation(value[0], want_loss(lab))
        if dev <= rtol:
            return expr, (f"loss: {expr} equals the reference's decoder_loss to {dev:.1e} "
                          f"(relative) on labels "
                          f"{'with ignore_index positions' if lab is labels else '= the ids'}; "
                          "its dlogits is never compared (minibert check judges it)")
    return None
