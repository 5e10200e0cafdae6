"""The registry of checks that judge an implementation: one :class:`Check` per stable id.

A check is a function of the implementation and some fixed arguments, optionally driven by
Hypothesis strategies; it passes by returning, fails by raising (``AssertionError`` naming the
tensor, the index and both values), and is *not applicable* by raising :class:`NotApplicable`
(the implementation lacks a name, or does not claim a capability).  Checks are registered with
:func:`check` beside the maths they exercise (``spec/suite/checks/*.py``) and selected by id,
kind or op; :func:`all_checks` imports every check module once and returns the registry.

The id grammar, one for every check: ``kind[subject]`` or ``kind[subject.property]``, then
optional ``-case`` labels::

    fd[linear_nobias]                        oracle.backward[layernorm-f32]
    invariant[layernorm.zero_upstream]       invariant[layernorm.eps_inside_sqrt-1e-05]
    bad_input[layernorm.gamma_shape]         fd[model-mini_bert-B2-T1-sum]

* ``kind`` is a key of :data:`KINDS` (the report column it fills);
* ``subject`` (``[a-z0-9_]+``) is a case family (``linear_nobias``, spec/suite/strategies/)
  or a row of the op table (``layernorm``, ``model``); for ``sympy`` checks the bracket holds
  the equation ID itself (``sympy[layernorm.backward.dx]``: subject = its file in
  spec/equations);
* ``property`` (letters, digits, ``_``; dotted only in equation IDs) names what is checked;
* ``case`` labels (letters, digits, ``_``, ``.``) tell apart the cases of one check: the dtype
  (``f64``/``f32``), a preset, a value (``1e-05``; a negative one written ``neg1``).

Ids are stable: a user's ``expected_failed_checks``, ``pytest -k`` and the mutation matrix refer
to them.  An id that changed keeps its old name for one release (:data:`ALIASES`, the frozen
file spec/results/check_id_aliases.json, docs/check-id-renames.md): selecting or expecting a
check by the old name still works and warns (``DeprecationWarning``) naming the new one.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from minibert_spec.paths import RESULTS
from minibert_spec.protocol import EQUATION_OPS, OPS, NotApplicable, op_of_equation

__all__ = ["Blame", "Check", "KINDS", "COLUMNS", "check", "grid", "all_checks", "select", "get",
           "NotApplicable", "CHECK_MODULES", "lazy_module", "resolve_expected_failures",
           "ALIASES", "renamed"]

# kind -> the report column it fills (minibert_spec.suite.report); the columns in table order
COLUMNS = (("forward", "forward vs oracle"), ("oracle_backward", "backward vs oracle"),
           ("fd", "backward vs FD"), ("sympy", "vs SymPy"), ("invariants", "invariants"),
           ("bad_input", "bad input"))
KINDS = {"oracle.forward": "forward", "oracle.backward": "oracle_backward", "fd": "fd",
         "sympy": "sympy", "invariant": "invariants", "bad_input": "bad_input"}
# the extras a check needs beyond the core install, by the module it imports
EXTRAS = {"torch": "oracle", "transformers": "oracle"}

_ID = re.compile(r"^(?P<kind>[a-z_]+(\.[a-z_]+)?)\[(?P<subject>[a-z0-9_]+)"
                 r"(\.(?P<property>[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*))?"
                 r"(?P<cases>(-[A-Za-z0-9_.]+)*)\]$")


class Blame(AssertionError):
    """A check's failure that names the ops at fault among the check's ops (a pipeline of
    several ops that found which one breaks it): the result counts for those ops alone."""

    def __init__(self, ops, message: str):
        super().__init__(message)
        self.ops = tuple(ops)


@dataclass(frozen=True)
class Check:
    """One registered check.

    id:        ``kind[name]``, stable across releases (``pytest -k`` and xfail lists use it)
    kind:      a key of :data:`KINDS`
    ops:       the op-table rows (minibert_spec.protocol.OPS) whose verdict it counts for
    equations: the equation IDs it is evidence for (the audit and mutation matrix read them)
    func:      ``func(impl, **kwargs, **drawn)``
    kwargs:    its fixed arguments
    given:     Hypothesis strategies by keyword (drawn per example), or a function of the
               implementation's CAPABILITIES returning them (a case family's strategy follows
               the variant the implementation declares), or None: run once
    examples:  ``caps -> [{keyword: value}]``: explicit examples, run before anything is drawn
               (by :meth:`hypothesis_test` itself, as Hypothesis's explicit phase would, without
               its eager printing) -- the case families' fixed-seed cases
    quick:     a check without ``given`` that belongs to the quick run (see :func:`quick`)
    deep:      a check of the deep tier alone (``minibert check --deep``): the whole model at
               the mini_bert preset's own size, seconds each whatever the examples drawn
    requires:  modules it imports beyond the core install (torch, transformers)
    """

    id: str
    kind: str
    ops: tuple[str, ...]
    equations: tuple[str, ...]
    func: Callable = field(compare=False, repr=False)
    kwargs: Mapping = field(default_factory=dict, compare=False, repr=False)
    given: Mapping | None = field(default=None, compare=False, repr=False)
    requires: tuple[str, ...] = ()
    doc: str = field(default="", compare=False, repr=False)
    # the suite's own set-up (building SymPy expressions), run before the time limit starts:
    # its cost is not the implementation's
    prepare: Callable | None = field(default=None, compare=False, repr=False)
    # what the implementation must declare for the check to apply ({"key_mask": True,
    # "layernorm.affine": False, ...}, minibert_spec.protocol.capabilities.unmet): decided before
    # the check runs or draws anything, so no check is skipped by the chance of a draw
    needs: Mapping = field(default_factory=dict, compare=False, repr=False)
    examples: Callable | None = field(default=None, compare=False, repr=False)
    quick: bool = field(default=False, compare=False, repr=False)
    deep: bool = field(default=False, compare=False, repr=False)

    @property
    def in_quick_run(self) -> bool:
        """The quick run (``minibert check --quick``) runs this check: its explicit examples
        alone, or its one fixed run."""
        return self.examples is not None if self.given is not None else self.quick

    @property
    def column(self) -> str:
        return KINDS[self.kind]

    @property
    def name(self) -> str:
        """The part of the id inside the brackets."""
        return self.id[len(self.kind) + 1:-1]

    @property
    def oracle(self) -> bool:
        return self.kind.startswith("oracle.")

    @property
    def source(self) -> tuple[str, int]:
        """(file, line) of the check's function: its ``def`` line (below its decorators)."""
        fn = inspect.unwrap(self.func)
        lines, start = inspect.getsourcelines(fn)
        offset = next((i for i, line in enumerate(lines) if line.lstrip().startswith("def ")), 0)
        return inspect.getsourcefile(fn) or "?", start + offset

    def missing_requirements(self) -> list[str]:
        """The modules of :attr:`requires` that cannot be imported here."""
        import importlib.util

        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    def call(self, impl, drawn: Mapping | None = None):
        """Run the body once: ``func(impl, **kwargs, **drawn)``."""
        return self.func(impl, **self.kwargs, **(drawn or {}))

    def hypothesis_test(self, impl, settings=None, each_call=None, seed: int | None = None):
        """The check as a zero-argument callable: for a check with strategies, a fresh
        ``@given`` test over them (with ``settings`` applied, and a database key of its own:
        the id), else a plain call.  ``each_call()``, a context manager, wraps every call of
        the body (each example): the time limit is per example, so it bounds a hang without
        limiting how many examples a profile asks for.  ``seed``: draw from this seed (combined
        with the id) instead of the settings' own choice."""
        completed = []

        def run(drawn):
            if each_call is None:
                out = self.call(impl, drawn)
            else:
                with each_call():
                    out = self.call(impl, drawn)
            completed.append(True)  # not rejected by assume(): a quick run counts these
            return out

        if self.given is None:
            test = functools.partial(run, None)
            test.completed = completed
            return test
        from hypothesis import given

        caps = None
        if callable(self.given) or self.examples is not None:
            from minibert_spec.protocol import capabilities

            caps = capabilities(impl)
        strategies = self.given(caps) if callable(self.given) else self.given
        explicit = self.examples(caps) if self.examples is not None else []
        if settings is not None and is_quick(settings) and not explicit:
            raise NotApplicable(f"not applicable: {self.id} has no fixed example for this "
                                "implementation (the quick run draws nothing)")

        def body(**drawn):
            return run(drawn)

        body.__name__ = body.__qualname__ = re.sub(r"\W+", "_", self.id).strip("_")
        body.__module__ = self.func.__module__
        body.__signature__ = inspect.Signature(
            [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY) for k in strategies])
        # Hypothesis keys its database and derandomized seed by a digest of the function:
        # add the id, so every check (and every parametrization of one function) has its own
        body._hypothesis_internal_add_digest = self.id.encode()

        def fixed_examples():
            # the fixed examples, run here rather than as Hypothesis @example()s: Hypothesis
            # pretty-prints an explicit example's arguments before running it, failing or not
            # (every array to text: ~8% of a whole run in one process, 46.9 -> 43.3 s on the
            # reference); the text is built on a failure alone
            from hypothesis.control import BuildContext
            from hypothesis.errors import UnsatisfiedAssumption
            from hypothesis.internal.conjecture.data import ConjectureData
            from hypothesis.internal.entropy import deterministic_PRNG

            from minibert_spec.suite.shrink import is_failure

            for kw in explicit:  # in the order given
                try:
                    # what Hypothesis sets up around an explicit example: the seeded global
                    # random state, and a build context (assume() inside a test case)
                    with deterministic_PRNG(), BuildContext(ConjectureData.for_choices([]),
                                                            is_final=True, wrapped_test=body):
                        run(kw)
                except UnsatisfiedAssumption:  # as Hypothesis does: an explicit example
                    continue  # that assume() rejects is not run, and not counted
                except BaseException as e:
                    if is_failure(e):  # not Hypothesis's control flow, not a Ctrl-C
                        e.add_note("Failing explicit example: " + call_text(body.__name__, kw))
                    raise

        if settings is not None and is_quick(settings):
            fixed_examples.completed = completed
            return fixed_examples
        test = given(**strategies)(body)
        if seed is not None:
            import hashlib

            from hypothesis import seed as use_seed

            digest = hashlib.sha256(f"{seed}:{self.id}".encode()).digest()
            test = use_seed(int.from_bytes(digest[:8], "big"))(test)
        fixed_first = True
        if settings is not None:
            from hypothesis import Phase

            # a profile without the explicit phase (phases=[Phase.generate]) runs no fixed one
            fixed_first = Phase.explicit in settings.phases
            test = settings.__class__(settings, phases=[p for p in settings.phases
                                                        if p is not Phase.explicit])(test)
            if settings.database is None:
                # no database, no database key: as hypothesis.find() does, so that Hypothesis
                # does not digest the test's source a second time (~0.3 ms a check) for a key
                # nothing reads; the derandomized seed still comes from that digest
                test._hypothesis_internal_database_key = None

        def fixed_then_drawn():
            if fixed_first:
                fixed_examples()
            test()

        fixed_then_drawn.completed = completed
        return fixed_then_drawn


def call_text(name: str, kwargs: Mapping) -> str:
    """``name(k=v, ...)`` as Hypothesis prints a falsifying example (its pretty-printer)."""
    from hypothesis.vendor.pretty import RepresentationPrinter

    printer = RepresentationPrinter()
    printer.repr_call(name, (), dict(kwargs), force_split=True)
    return printer.getvalue()


def is_quick(settings) -> bool:
    """Settings of a quick run: the explicit phase alone (``check_settings(max_examples=0)``)."""
    from hypothesis import Phase

    return tuple(settings.phases) == (Phase.explicit,)


def lazy_module(name: str):
    """A stand-in for ``import name`` that imports on first attribute access: check modules
    that need an optional extra (torch) still load, and register their checks, without it."""
    import importlib
    import types

    class _Lazy(types.ModuleType):
        def __getattr__(self, attr):
            return getattr(importlib.import_module(name), attr)

    return _Lazy(name)


# --------------------------------------------------------------------------- registration
_REGISTRY: dict[str, Check] = {}


def grid(**axes) -> list[tuple[str, dict]]:
    """The cartesian product of named axes as ``(id suffix, kwargs)`` pairs.  An axis is a
    sequence of values or of ``(label, value)`` pairs; labels default to ``str(value)``
    (``np.float32`` -> ``f32``)."""
    columns = [[v if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str)
                else (_label(v), v) for v in values] for values in axes.values()]
    return [("-".join(lbl for lbl, _ in combo), {n: v for n, (_, v) in zip(axes, combo)})
            for combo in itertools.product(*columns)]


def _label(value) -> str:
    import numpy as np

    if isinstance(value, type) and issubclass(value, np.generic):
        return {np.float32: "f32", np.float64: "f64"}.get(value, np.dtype(value).name)
    if value is True or value is False:
        return str(value).lower()
    return str(value)


def check(kind: str, name: str | Callable | None = None, *, cases: Iterable | None = None,
          ops: Iterable[str] | Callable | None = None,
          equations: Iterable[str] | Callable | None = None, given: Mapping | None = None,
          requires: Iterable[str] | Callable = (), kinds_arg: str | None = None,
          prepare: Callable | None = None, needs: Mapping | Callable | None = None,
          examples: Callable | None = None, quick: bool | Callable = False,
          deep: bool | Callable = False):
    """Register the decorated function as one check, or one per case.

    ``kind`` is a key of :data:`KINDS`, or several separated by ``|`` (``"oracle.forward|
    oracle.backward"``): one check per kind, the kind's last component passed as the keyword
    ``kinds_arg`` (e.g. ``side="forward"``).  ``name`` is the id's bracket part (default: the
    function's name); with ``cases`` (``(suffix, kwargs)`` pairs, see :func:`grid`) each case
    is a check named ``name-suffix`` (or ``suffix`` when name is ""), called with its kwargs.
    ``ops``, ``equations`` and ``requires`` may be callables of the case's kwargs; ``ops``
    defaults to the rows of ``equations`` (every ID belongs to one op of the table).
    ``prepare(**case kwargs)`` runs before the check's time limit starts (the suite's own
    set-up).  ``needs`` (a mapping, or a callable of the case's kwargs) is what the
    implementation must declare (:attr:`Check.needs`).  ``given`` and ``examples`` may be
    callables of the case's kwargs returning what :class:`Check` takes (a function of the
    CAPABILITIES); ``quick`` (or a callable of the case's kwargs) puts a check without
    ``given`` in the quick run; ``deep`` (or a callable of the case's kwargs) keeps a check
    out of every tier but the deep one (:attr:`Check.deep`).
    """
    kinds = kind.split("|")
    for k in kinds:
        if k not in KINDS:
            raise ValueError(f"check: kind {k!r} is not one of {sorted(KINDS)}")
    if len(kinds) > 1 and kinds_arg is None:
        raise ValueError("check: several kinds need kinds_arg (the keyword that receives "
                         "the kind's last component)")

    def register(fn):
        base = fn.__name__ if name is None else name
        for k in kinds:
            for suffix, kwargs in (cases if cases is not None else [("", {})]):
                label = "-".join(p for p in (base, suffix) if p)
                kw = dict(kwargs)
                if kinds_arg is not None:
                    kw[kinds_arg] = k.rsplit(".", 1)[-1]
                eqs = tuple(equations(kwargs) if callable(equations) else equations or ())
                rows = tuple(ops(kwargs) if callable(ops) else ops or ())
                if not rows:
                    rows = tuple(dict.fromkeys(r for r in map(op_of_equation, eqs) if r))
                unknown = [r for r in rows if r not in OPS]
                if unknown:
                    raise ValueError(f"check {label}: ops {unknown} are not rows of the op table")
                c = Check(f"{k}[{label}]", k, rows, eqs, fn, kw,
                          _per_case(given, kwargs, "given"),
                          tuple(requires(kwargs) if callable(requires) else requires),
                          inspect.getdoc(fn) or "",
                          None if prepare is None else functools.partial(prepare, **kwargs),
                          dict(needs(kwargs) if callable(needs) else needs or {}),
                          _per_case(examples, kwargs, "examples"),
                          bool(quick(kwargs) if callable(quick) else quick),
                          bool(deep(kwargs) if callable(deep) else deep))
                _validate_id(c.id)
                if c.id in _REGISTRY and _REGISTRY[c.id].func is not fn:
                    raise ValueError(f"check: id {c.id!r} registered twice")
                _REGISTRY[c.id] = c
        return fn

    return register


def _validate_id(check_id: str) -> None:
    """The id follows the grammar of this module's docstring (its subject a case family, an op
    of the table, or for ``sympy`` an equation ID's file)."""
    m = _ID.match(check_id)
    if m is None:
        raise ValueError(f"check: malformed id {check_id!r} (expected kind[subject.property-"
                         "case], see spec/suite/registry.py)")
    from minibert_spec.suite.strategies import FAMILIES

    subject = m["subject"]
    known = (set(OPS) | {f.name for f in FAMILIES} if m["kind"] != "sympy" else
             {e.split(".")[0] for e in EQUATION_OPS})
    if subject not in known:
        raise ValueError(f"check: {check_id!r}: subject {subject!r} is not "
                         + ("an equation file" if m["kind"] == "sympy"
                            else "a case family or an op of the table"))


# old id -> new id, for one release: the 750 renames of the one id grammar (issue 27), frozen
# in one data file when the ``was=`` beside each check went (issue 38); the file goes next release
ALIASES: dict[str, str] = json.loads((RESULTS / "check_id_aliases.json").read_text())


def renamed(check_id: str, *, stacklevel: int = 2) -> str:
    """The current id of ``check_id``: itself, or the new name of a renamed check (with a
    DeprecationWarning naming it)."""
    all_checks()
    new = ALIASES.get(check_id)
    if new is None:
        return check_id
    import warnings

    warnings.warn(f"check id {check_id!r} is now {new!r}: the old name goes in the next "
                  "release", DeprecationWarning, stacklevel=stacklevel + 1)
    return new


def _per_case(value, kwargs: dict, what: str):
    """``given`` / ``examples`` of one case: a mapping as it is, a callable taking ``kwargs``
    (the case's) called with them -- it returns the mapping, or a function of the
    CAPABILITIES."""
    if value is None or not callable(value):
        return value
    return value(kwargs)


# the modules that register checks (imported by all_checks, in this order: the report lists
# checks in registration order)
CHECK_MODULES = (
    "minibert_spec.suite.checks.fd", "minibert_spec.suite.checks.invariants",
    "minibert_spec.suite.checks.model", "minibert_spec.suite.checks.losses",
    "minibert_spec.suite.checks.optim",
    "minibert_spec.suite.checks.sympy_code", "minibert_spec.suite.checks.bad_input",
    "minibert_spec.suite.checks.oracle_ops", "minibert_spec.suite.checks.oracle_model",
    "minibert_spec.suite.checks.oracle_optim", "minibert_spec.suite.checks.oracle_bert",
    "minibert_spec.suite.checks.decoder", "minibert_spec.suite.checks.oracle_decoder",
    "minibert_spec.suite.checks.adapters", "minibert_spec.suite.checks.wholemodel",
)


@functools.cache
def all_checks() -> tuple[Check, ...]:
    """Every registered check, in registration order.  A check module whose optional
    requirement (torch, transformers) is missing still registers its checks: they import it
    lazily, and report the missing extra when run."""
    import importlib

    for module in CHECK_MODULES:
        importlib.import_module(module)
    return tuple(_REGISTRY.values())


def get(check_id: str, extra: Iterable[Check] = ()) -> Check:
    """The check of ``check_id`` among the registered ones and ``extra`` (an implementation's
    declared ops' checks, minibert_spec.suite.declared)."""
    checks = {c.id: c for c in (*all_checks(), *extra)}
    check_id = renamed(check_id)
    if check_id not in checks:
        raise KeyError(f"no check {check_id!r}")
    return checks[check_id]


def select(checks: Iterable[Check] | None = None, *, ids: Iterable[str] | None = None,
           kinds: Iterable[str] | None = None, ops: Iterable[str] | None = None,
           match: str | None = None, extra: Iterable[Check] = ()) -> list[Check]:
    """Checks filtered by exact ids, kinds (``oracle`` matches both oracle kinds), ops, or a
    regular expression searched in the id.  An old id (:data:`ALIASES`) selects its check and
    warns; so does a pattern that matches no current id but old ones.  ``extra``: checks
    selected with the registered ones (an implementation's declared ops')."""
    extra = tuple(extra)
    out = [*(all_checks() if checks is None else checks), *extra]
    if ids is not None:
        wanted = [renamed(i, stacklevel=3) for i in ids]
        known = {c.id for c in out}
        unknown = [i for i in wanted if i not in known]
        if unknown:
            raise ValueError(f"checks: unknown ids {unknown[:5]}")
        out = [c for c in out if c.id in set(wanted)]
    if kinds is not None:
        ks = set(kinds)
        out = [c for c in out if c.kind in ks or c.kind.split(".")[0] in ks]
    if ops is not None:
        os_ = set(ops)
        out = [c for c in out if os_ & set(c.ops)]
    if match is not None:
        rx = re.compile(match)
        found = {c.id for c in out if rx.search(c.id)}
        if not any(rx.search(c.id) for c in (*all_checks(), *extra)):  # old ids, if any
            found = {renamed(old, stacklevel=3) for old in ALIASES if rx.search(old)}
        out = [c for c in out if c.id in found]
    return out


def resolve_expected_failures(expected: Mapping[str, str] | None,
                              what: str = "expected_failed_checks", *,
                              stacklevel: int = 2, extra: Iterable[Check] = ()
                              ) -> dict[str, str]:
    """A user's expected failures (check id -> reason) with every id resolved to a registered
    check; the one rule for ``parametrize_with_checks``, ``check_implementation``, the pytest
    plugin (``--minibert-xfail``) and ``minibert check --xfail``.  An id that names no check is
    refused -- ValueError naming ``what``, each unknown id and its closest known ids -- because
    an expectation that can never match would let a typo pass silently.  ``extra``: the
    implementation's declared ops' checks, known too."""
    import difflib

    known = {c.id for c in (*all_checks(), *extra)}
    out: dict[str, str] = {}
    unknown = []
    for check_id, reason in dict(expected or {}).items():
        # an id renamed since the last release resolves through the alias map (warning with
        # its new name) before it counts as unknown
        current = renamed(check_id, stacklevel=stacklevel + 1)
        if current in known:
            out[current] = reason
            continue
        unknown.append(check_id)
    if unknown:
        def hint(check_id) -> str:
            close = difflib.get_close_matches(str(check_id), sorted(known), n=3, cutoff=0.5)
            return f"{check_id!r} (closest: {', '.join(close) if close else 'none'})"

        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise ValueError(f"{what}: no check {'; '.join(hint(u) for u in unknown[:5])}{more} "
                         "(`minibert check --list` lists the ids)")
    return out
