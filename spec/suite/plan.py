"""One run plan behind the four entry points (``minibert check``, ``parametrize_with_checks``,
``check_implementation``, the pytest plugin): :func:`plan_run` builds a :class:`RunPlan` once
from an entry point's arguments -- each refusal a ValueError naming the argument as that entry
point spells it; the implementation probed, its declared ops read, the checks selected, the
expectations resolved, the depth decided -- and :func:`execute` runs it, in this process or in
worker processes (minibert_spec.suite.pool).  An entry point only translates and presents."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from minibert_spec.protocol import label_of
from minibert_spec.suite.registry import Check, all_checks, resolve_expected_failures, select
from minibert_spec.suite.report import CheckReport, apply_expectations, check_thin
from minibert_spec.suite.run import DEFAULT_TIMEOUT, ORACLE_MODES, Result, depth, tier_of

# ``max_examples`` of the quick run: every check's explicit examples (the case families'
# fixed-seed cases) and the fixed checks marked quick, nothing drawn -- seconds, the first
# evidence on a new implementation and what a mutant trips first
QUICK = 0


def selected_checks(*, ids: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
                    ops: Iterable[str] | None = None, match: str | None = None,
                    bad_input: bool = False, quick: bool = False,
                    extra: Iterable[Check] = (), deep: bool = False) -> list[Check]:
    """The checks a run covers: everything (bad-input checks only with ``bad_input``),
    narrowed by ids, kinds, ops or a regular expression on the id; ``quick``: the checks with
    fixed examples (run on those alone, :data:`QUICK`); the checks of the deep tier alone
    (:attr:`Check.deep`) only with ``deep`` or when ``ids`` names them.  ``extra``: the checks
    of the ops the implementation declares (minibert_spec.suite.declared.checks_of), selected
    alike."""
    tier_of(quick, deep)  # both: refused
    checks = select(ids=ids, kinds=kinds, ops=ops, match=match, extra=extra)
    if not bad_input and ids is None:
        checks = [c for c in checks if c.kind != "bad_input"]
    if quick:
        checks = [c for c in checks if c.in_quick_run]
    if not deep and ids is None:
        checks = [c for c in checks if not c.deep]
    return checks


@dataclass(frozen=True)
class RunPlan:
    """Everything a run is, decided before any check runs."""

    impl: object  # "pkg.mod[:obj]", a module, an object, a proxy (None: --list)
    label: str
    checks: tuple[Check, ...]
    expected: dict  # check id -> reason, resolved (minibert_spec.suite.registry)
    thin: dict  # op -> reason (minibert_spec.suite.report.check_thin)
    oracle: str
    bad_input: bool
    timeout: float | None
    tier: str
    settings: object  # the Hypothesis settings the checks run under here
    depth: dict  # minibert_spec.suite.run.depth, said by the report
    first_red: bool = False
    seed: int | None = None
    model: bool = False
    load_error: Exception | None = None  # why it cannot be checked: refused, never judged
    proxy: object = None  # the implementation loaded here (None when the workers load it)
    isolated: bool = False  # run in worker processes (minibert_spec.suite.pool)
    paths: tuple[str, ...] = ()  # what the workers append to sys.path
    database: object = None  # in process: a database or None; isolated: a directory
    replay: tuple[str, ...] = ()
    workers: int = 1
    total_timeout: float | None = None
    shard: dict | None = None  # minibert_spec.suite.shard.shard_plan, or None
    # the selection as asked (the record of minibert check's settings)
    kinds: tuple[str, ...] | None = None
    ops: tuple[str, ...] | None = None
    match: str | None = None
    max_examples: int | None = None


def plan_run(impl, *, ids: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
             ops: Iterable[str] | None = None, match: str | None = None,
             bad_input: bool = False, oracle: str = "require",
             timeout: float | None = DEFAULT_TIMEOUT, total_timeout: float | None = None,
             workers: int = 1, expected_failed_checks: Mapping[str, str] | None = None,
             thin_rows: Mapping[str, str] | None = None, quick: bool = False,
             deep: bool = False, max_examples: int | None = None, settings=None,
             first_red: bool = False, seed: int | None = None, database=None,
             replay: Iterable[str] = (), model: bool = False, shard: str | None = None,
             durations: str | None = None, isolated: bool = False,
             flag: Callable[[str], str] = str, stacklevel: int = 2) -> RunPlan:
    """The :class:`RunPlan` of these arguments (the entry points' own, by their Python names).
    ``flag``: how the entry point spells an argument in its refusals (the command line's
    ``--max-examples`` for ``max_examples``).  ``isolated``: the checks run in worker
    processes, which load the implementation; it is then imported here only when it declares
    ops of its own (``OPS``), and ``database``/``replay`` are directories.  ``database``
    "auto" (in process): each implementation's examples kept apart under ``.hypothesis``.
    ``model`` (isolated): the whole_model row alone, of the model the workers compose of the
    implementation's rows where it declares none.
    An implementation that does not load is the plan's ``load_error``, not a refusal."""
    for name, value in (("timeout", timeout), ("total_timeout", total_timeout)):
        if value is not None and value <= 0:
            raise ValueError(f"{flag(name)}: expected a positive number of seconds, got {value}")
    for name, value in (("workers", workers), ("max_examples", max_examples)):
        if value is not None and value < 1:
            raise ValueError(f"{flag(name)}: expected a positive integer, got {value}")
    if quick and max_examples is not None:
        raise ValueError(f"{flag('quick')} runs the fixed examples alone: "
                         f"{flag('max_examples')} does not apply")
    if model and ops:
        raise ValueError(f"{flag('model')}: runs the whole_model row alone; not with "
                         f"{flag('ops')}")
    if quick and deep:
        raise ValueError(f"{flag('quick')} and {flag('deep')}: expected one tier, got both")
    if oracle not in ORACLE_MODES:
        raise ValueError(f"{flag('oracle')}: expected one of {ORACLE_MODES}, got {oracle!r}")
    module = impl.partition(":")[0] if isinstance(impl, str) else None
    if module is not None and not (module and all(p.isidentifier() for p in module.split("."))):
        raise ValueError(f"{flag('impl')}: expected package.module[:object], got {impl!r}")
    ops = ("whole_model",) if model else ops
    kinds, ops = (None if v is None else tuple(v) for v in (kinds, ops))
    paths = tuple(p for p in dict.fromkeys([os.getcwd(), import_root(module, os.getcwd())])
                  if p) if isolated and module else ()
    # the suite's checks first: the fork server imports the suite meanwhile, and a probe
    # beside both missed a --timeout of 1 s on a loaded machine
    all_checks()
    load_error, proxy, declared = _load(impl, timeout, paths, isolated) if impl is not None \
        else (None, None, ())
    try:
        checks = selected_checks(ids=ids, kinds=kinds, ops=_model_ops(proxy, ops, ids),
                                 match=match, bad_input=bad_input, quick=quick, extra=declared,
                                 deep=deep)
    except Exception as e:  # noqa: BLE001 -- a bad regular expression (re.error), an unknown id
        raise ValueError(f"selection: {e}") from None
    if load_error is None:
        _check_selection(ops, kinds, {op for c in declared for op in c.ops}, flag)
    expected = resolve_expected_failures(expected_failed_checks, flag("expected_failed_checks"),
                                         extra=declared, stacklevel=stacklevel + 1)
    thin = check_thin(thin_rows, flag("thin_rows"))
    planned = _shard(shard, durations, checks, first_red, flag)
    if planned is not None:
        mine = set(planned["items"])
        checks = [c for c in checks if c.id in mine]
    needed = sorted({m for c in checks if c.oracle for m in c.missing_requirements()})
    if isolated and impl is not None and oracle == "require" and needed:
        raise ValueError(f"the PyTorch oracle is required but {' and '.join(needed)} "
                         f"{'is' if len(needed) == 1 else 'are'} not installed: "
                         "pip install 'minibert-spec[oracle]' (the CPU wheel "
                         "torch==2.13.0), or pass --oracle off to check without it")
    tier = tier_of(quick, deep)
    if settings is None:
        from minibert_spec.suite.run import check_settings

        settings = check_settings(max_examples=QUICK if quick else max_examples, tier=tier)
    label = impl if isinstance(impl, str) or impl is None else \
        proxy._impl_label if proxy is not None else label_of(impl)
    return RunPlan(impl=impl, label=label, checks=tuple(checks), expected=expected, thin=thin,
                   oracle=oracle, bad_input=bad_input, timeout=timeout, tier=tier,
                   settings=settings, depth=depth(tier, settings=settings),
                   first_red=first_red, seed=seed, model=model, load_error=load_error,
                   proxy=proxy, isolated=isolated, paths=paths,
                   database=_database(database, replay, label, isolated),
                   replay=tuple(os.path.abspath(d) for d in replay), workers=workers,
                   total_timeout=total_timeout, shard=planned, kinds=kinds, ops=ops,
                   match=match, max_examples=max_examples)


def execute(plan: RunPlan, *, progress: Callable[[Result], object] | None = None,
            server=None) -> CheckReport:
    """Run the plan: in worker processes when it is ``isolated`` (``server``: a fork server
    from minibert_spec.suite.pool.launch_server, closed at the end), else here.  ``progress``
    is called with each result.  The report holds the results with the expected failures
    applied, the thin rows and the depth; one that could not load the implementation holds its
    ``load_error`` alone."""
    if plan.load_error is not None:
        return CheckReport(plan.label, [], plan.oracle, plan.bad_input,
                           load_error=str(plan.load_error), depth=plan.depth,
                           shard=plan.shard)
    if plan.isolated:
        from minibert_spec.suite.pool import run_isolated

        report = run_isolated(plan.label, plan.checks, workers=plan.workers,
                              timeout=plan.timeout, total_timeout=plan.total_timeout,
                              oracle=plan.oracle, paths=plan.paths, seed=plan.seed,
                              max_examples=plan.depth["drawn_per_check"],
                              first_red=plan.first_red, on_result=progress, server=server,
                              database=plan.database, replay=plan.replay, model=plan.model)
    else:
        report = _run_here(plan, progress)
    report.bad_input, report.thin, report.depth = plan.bad_input, plan.thin, plan.depth
    report.shard = plan.shard
    report.results = apply_expectations(report.results, plan.expected)
    return report


def _run_here(plan: RunPlan, progress) -> CheckReport:
    """The plan's checks one after the other in this process (the first red ends the run
    with ``first_red``: the rest are ``not run``)."""
    import time

    from minibert_spec.suite.run import first_red_order, run_check, stopped_results
    from minibert_spec.suite.shrink import ShrinkBudget

    start = time.perf_counter()
    budget = ShrinkBudget()  # one for the run
    done: dict[str, Result] = {}
    for c in first_red_order(plan.checks) if plan.first_red else plan.checks:
        r = run_check(c, plan.proxy, timeout=plan.timeout, oracle=plan.oracle,
                      settings=plan.settings, shrink=budget, seed=plan.seed)
        done[c.id] = r
        if progress is not None:
            progress(r)
        if plan.first_red and r.outcome == "failed" and c.id not in plan.expected:
            break
    results = [done.get(c.id) or stopped_results([c])[0] for c in plan.checks]
    return CheckReport(plan.label, results, plan.oracle, seconds=time.perf_counter() - start)


def _load(impl, timeout, paths, isolated) -> tuple[Exception | None, object, tuple]:
    """(why the implementation cannot be checked, or None; the implementation loaded here, or
    None; the checks of the ops it declares).  A ``"pkg.mod[:obj]"`` is imported in a child
    process first (minibert_spec.suite.probe): an import that exits, crashes or hangs is
    refused.  ``isolated``: imported here only when it has an ``OPS`` (the workers import it
    anyway), and an import that raises is left to the workers, which name it."""
    from minibert_spec.protocol import DeclarationError, ImplLoadError, load_impl
    from minibert_spec.suite.declared import checks_of
    from minibert_spec.suite.probe import probe

    has_ops = True
    if isinstance(impl, str):
        reason, has_ops = probe(impl, timeout, paths=paths)
        if reason is not None:
            return ImplLoadError(reason), None, ()
    if isolated and not has_ops:  # nothing of its own to read: not imported here
        return None, None, ()
    added = [p for p in paths if p not in sys.path]
    sys.path[:0] = added
    try:
        if isolated:
            return None, None, checks_of(load_impl(impl))
        from minibert_spec.suite.run import as_proxy

        proxy = as_proxy(impl)  # reads and validates its CAPABILITIES
        return None, proxy, checks_of(proxy)
    except ImplLoadError as e:
        return (None if isolated else e), None, ()
    except DeclarationError as e:
        return e, None, ()
    finally:
        for p in added:
            if p in sys.path:
                sys.path.remove(p)


def _model_ops(proxy, ops, ids):
    """``ops``; for a whole model (a WholeModel, or a bare function) with neither ops nor ids
    given, its own row alone: every op row would be n/a."""
    from minibert_spec.protocol import unwrap
    from minibert_spec.protocol.wholemodel import WholeModel

    if proxy is not None and ops is None and ids is None and isinstance(unwrap(proxy),
                                                                        WholeModel):
        return ("whole_model",)
    return ops


def _check_selection(ops, kinds, declared_ops, flag) -> None:
    from minibert_spec.protocol import OPS
    from minibert_spec.suite.registry import KINDS

    unknown = sorted(set(ops or ()) - set(OPS) - set(declared_ops))
    if unknown:
        raise ValueError(f"{flag('ops')}: unknown {unknown}; expected some of "
                         f"{[*OPS, *sorted(declared_ops)]}")
    known = set(KINDS) | {k.split(".")[0] for k in KINDS}
    unknown = sorted(set(kinds or ()) - known)
    if unknown:
        raise ValueError(f"{flag('kinds')}: unknown {unknown}; expected some of {sorted(known)}")


def _shard(shard, durations, checks, first_red, flag) -> dict | None:
    """The shard's part of the checks (minibert_spec.suite.shard.shard_plan), or None without
    one."""
    from minibert_spec.suite.shard import (
        default_check_durations,
        parse_shard,
        read_durations,
        shard_plan,
    )

    if shard is None:
        if durations:
            raise ValueError(f"{flag('durations')}: applies to {flag('shard')} only")
        return None
    k, n = parse_shard(shard, flag("shard"))
    if first_red:
        raise ValueError(f"{flag('shard')}: not with {flag('first_red')} (where a run stops "
                         "depends on the checks run before: the shards would not make the one "
                         "run's report)")
    if n > len(checks):
        raise ValueError(f"{flag('shard')} {shard}: {n} shards for {len(checks)} selected "
                         "checks; expected at most one shard per check")
    found = read_durations(durations, flag("durations")) if durations \
        else default_check_durations()
    return shard_plan([c.id for c in checks], found, k, n)


def _database(database, replay, label, isolated):
    """``database`` as the run uses it: a directory's absolute path for the workers; in
    process, "auto": this implementation's own (none where Hypothesis keeps none)."""
    if isolated:
        return os.path.abspath(database) if database else None
    if database == "auto":
        from hypothesis import settings

        from minibert_spec.suite.run import database_for

        return None if settings.default.database is None else database_for(label)
    return database


def import_root(module_name: str, cwd: str) -> str | None:
    """The sys.path entry the implementation's top-level module comes from (found without
    importing it: its code runs only in the workers)."""
    from minibert_spec.suite.shard import top_level_spec

    found = top_level_spec(module_name, [cwd])
    if found is None:
        return None
    p = Path(found.origin).resolve().parent
    return str(p.parent if found.submodule_search_locations else p)  # a package: its parent
