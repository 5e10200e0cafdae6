"""The verdict on one implementation: every check's :class:`~minibert_spec.suite.run.Result`, folded
into a grid of op x column cells, an exit status, and the JSON that CI keeps as an artifact (the
table and any HTML rendering are drawn from that JSON: one source of truth).

A cell is ``FAIL`` when any of its checks failed, ``error`` when one could not run (a required
extra missing, a worker that died, the run's time limit), ``not run`` when the run stopped at
its first red before some of its checks (``--first-red``: never counted as passed), ``ok``
when at least one passed and none failed, ``n/a`` (with the reason) otherwise.  A column
that was not run at all (the oracle turned off, bad input not asked for) says so in every
cell: nothing is silently absent.

A row is ``ok`` only on evidence (:func:`unjudged`): its backward judged against finite
differences by at least one check, and its forward against the oracle or by an identity (an
invariant or the SymPy derivation).  A row whose cells pass but whose selected FD checks were
all n/a is ``not judged`` with the reason, and the run exits 2 -- unless the row is named as
knowingly thin (``thin``: op -> reason; ``minibert check --thin OP=REASON``), then ``thin``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from minibert_spec.protocol import OPS
from minibert_spec.suite.registry import COLUMNS, KINDS, renamed
from minibert_spec.suite.run import NOT_RUN, Result, is_absent, one_line

EXIT_OK, EXIT_FAIL, EXIT_NOT_RUN = 0, 1, 2
# a row whose cells passed on too little evidence (unjudged), and one named knowingly so
NOT_JUDGED, THIN = "not judged", "thin"
# the kinds that compare the implementation with something outside it (torch, the derivation):
# the only ones that can show a declared form or value wrong -- finite differences and the
# generic invariants agree with any self-consistent code, whatever eps it fixes
VERIFYING_KINDS = ("oracle.forward", "oracle.backward", "sympy")
# the convention line minibert_spec.protocol.capabilities.declared_variants gives a declaration
_DECLARED = re.compile(r"^variant (?P<declaration>[a-z_]+\.[A-Za-z_]+=[^:]+):")
_RAN = ("passed", "failed", "xfailed", "xpassed")
UNVERIFIED_HINT = ("finite differences and the invariants agree with any self-consistent "
                   "code: run the oracle, or without --quick, to verify it")
# a number in a convention line (1e-06, -3.2, 0.000120): lines equal but for these are one
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
SCHEMA = "minibert-check/1"


def in_table_order(ops: Iterable[str]) -> list[str]:
    """The distinct ``ops`` in the op table's order, then the ops an implementation declares
    (minibert_spec.ops: not rows of the table) in the order first seen."""
    seen = dict.fromkeys(ops)
    return [op for op in OPS if op in seen] + [op for op in seen if op not in OPS]


@dataclass
class Cell:
    status: str  # ok | FAIL | error | not run | n/a
    detail: str = ""
    checks: list[str] = field(default_factory=list)  # the ids that decided it
    ran: int = 0  # checks that passed or failed

    def to_json(self) -> dict:
        return {"status": self.status, "detail": self.detail, "checks": self.checks,
                "ran": self.ran}


def _cell(results: list[Result], off_reason: str | None) -> Cell:
    if off_reason is not None and all(r.outcome == "n/a" for r in results):
        return Cell("n/a", off_reason, [r.id for r in results])
    failed = [r for r in results if r.outcome in ("failed", "xpassed")]
    ran = [r for r in results if r.outcome in ("passed", "failed", "xfailed", "xpassed")]
    if failed:
        first = failed[0]
        return Cell("FAIL", f"{len(failed)}/{len(ran)} check{'s' if len(ran) != 1 else ''} "
                            f"failed; first {first.id}: "
                            f"{one_line(first.message)}", [r.id for r in failed], len(ran))
    errors = [r for r in results if r.outcome == "error"]
    if errors:
        return Cell("error", f"{len(errors)} check{'s' if len(errors) != 1 else ''} could not run: "
                             f"{one_line(errors[0].message)}",
                    [r.id for r in errors], len(ran))
    stopped = [r for r in results if r.outcome == NOT_RUN]
    if stopped:
        return Cell(NOT_RUN, f"{len(stopped)} check{'s' if len(stopped) != 1 else ''} not run "
                             f"({len(ran)} ran): {one_line(stopped[0].message)}",
                    [r.id for r in stopped], len(ran))
    if ran:
        na = len(results) - len(ran)
        xf = sum(r.outcome == "xfailed" for r in results)
        return Cell("ok", f"{len(ran)} check{'s' if len(ran) != 1 else ''}"
                    + (f" ({xf} expected failures)" if xf else "")
                    + (f", {na} n/a" if na else ""), [r.id for r in ran], len(ran))
    if results:
        return Cell("n/a", one_line(results[0].message), [r.id for r in results])
    return Cell("n/a", off_reason or "no check of this kind for this op")


def unjudged(cells: Mapping[str, Cell]) -> str | None:
    """Why a row whose cells passed is not judged (None: it is).  Its backward must have met
    finite differences -- a selected FD check that ran (one n/a for every case the family draws
    is no evidence: the FD cell ran nothing) -- and its forward the oracle or an identity (an
    invariant or the SymPy derivation).  A column the selection left out (``--kinds``, ``-k``)
    asks nothing of the row."""
    fd = cells["fd"]
    if fd.checks and not fd.ran:
        return (f"its backward met no finite-difference check (all {len(fd.checks)} n/a; "
                f"the first: {fd.detail})")
    forward, identities = cells["forward"], (cells["invariants"], cells["sympy"])
    asked = forward.checks or any(c.checks for c in identities)
    if asked and not forward.ran and not any(c.ran for c in identities):
        return (f"its forward met neither the oracle nor an identity "
                f"({forward.detail or 'no oracle check'})")
    return None


def thin_from_args(values: Iterable[str]) -> dict[str, str]:
    """``OP`` or ``OP=REASON`` strings (``minibert check --thin``) as rows named knowingly thin
    (op -> reason), as :func:`expectations_from_args` reads ``--xfail``; an op the protocol
    does not have is a ValueError naming it and the ops."""
    out = {}
    for value in values:
        op, _, reason = value.partition("=")
        out[op.strip()] = reason.strip() or "named thin on the command line"
    return check_thin(out)


def check_thin(thin: Mapping[str, str] | None, argument: str = "--thin") -> dict[str, str]:
    """The rows named knowingly thin, validated: each key an op of the protocol, each reason a
    string."""
    thin = dict(thin or {})
    unknown = sorted(op for op in thin if op not in OPS)
    if unknown:
        raise ValueError(f"{argument}: unknown op {', '.join(map(repr, unknown))}; expected "
                         f"ops of the protocol ({', '.join(OPS)})")
    bad = {op: r for op, r in thin.items() if not isinstance(r, str)}
    if bad:
        raise ValueError(f"{argument}: expected a reason (a string) per op, got {bad}")
    return thin


@dataclass
class CheckReport:
    """Everything one run found: the results, what was not run and why, and the run's own
    failures (a worker that crashed the process, the time limit)."""

    impl: str
    results: list[Result]
    oracle: str = "require"
    bad_input: bool = False
    notes: list[str] = field(default_factory=list)  # run-level problems (one line each)
    seconds: float = 0.0
    load_error: str | None = None
    provenance: dict = field(default_factory=dict)
    # what decides the verdict besides the implementation (minibert check's options: oracle,
    # examples, seed, selection, expectations...), the implementation's source digest and the
    # suite's version: what the shards of one run must share (minibert_spec.suite.shard)
    settings: dict = field(default_factory=dict)
    # a shard's plan (minibert_spec.suite.shard.shard_plan), or None; a merged report: its shards
    shard: dict | None = None
    merged_from: list = field(default_factory=list)
    # rows named knowingly thin (op -> reason): not judged, and said so, without exit 2
    thin: dict = field(default_factory=dict)
    # how deep the run went (minibert_spec.suite.run.depth: the tier, the examples each check
    # drew after its fixed-seed ones); {} when not said (a report read from an older JSON)
    depth: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ folding
    def off_reasons(self) -> dict[str, str | None]:
        """column -> why it was not run at all (None: it ran)."""
        return {"forward": "oracle off (--oracle off)" if self.oracle == "off" else None,
                "oracle_backward": "oracle off (--oracle off)" if self.oracle == "off" else None,
                "bad_input": None if self.bad_input else "not run (pass --bad-input)",
                "fd": None, "sympy": None, "invariants": None}

    def grid(self) -> dict[str, dict[str, Cell]]:
        by: dict[tuple[str, str], list[Result]] = {}
        for r in self.results:
            for op in r.ops:
                by.setdefault((op, KINDS[r.kind]), []).append(r)
        off = self.off_reasons()
        return {op: {col: _cell(by.get((op, col), []), off[col]) for col, _ in COLUMNS}
                for op in self.ops()}

    def ops(self) -> list[str]:
        return in_table_order(op for r in self.results for op in r.ops)

    def not_provided(self) -> list[str]:
        """The ops the implementation provides no name of (every check of theirs n/a for that
        reason, the columns not run aside), in the op table's order: the table and the page
        show them as one line after the provided ops."""
        off = self.off_reasons()
        by: dict[str, list[Result]] = {}
        for r in self.results:
            if off[KINDS[r.kind]] is None:
                for op in r.ops:
                    by.setdefault(op, []).append(r)
        return [op for op in self.ops()
                if by.get(op) and all(r.outcome == "n/a" and is_absent(r.message)
                                      for r in by[op])]

    def verdicts(self) -> dict[str, str]:
        """op -> its row's verdict (:meth:`verdict` of its cells), in the op table's order."""
        return {op: self.verdict(cells, self.thin.get(op)) for op, cells in self.grid().items()}

    @staticmethod
    def verdict(cells: Mapping[str, Cell], thin: str | None = None) -> str:
        """The row's verdict: its worst cell, and an ``ok`` on too little evidence
        (:func:`unjudged`) ``not judged`` -- ``thin`` when the row was named so (``thin``: the
        reason)."""
        statuses = {c.status for c in cells.values()}
        for s in ("FAIL", "error", NOT_RUN):
            if s in statuses:
                return s
        if "ok" in statuses:
            if unjudged(cells) is None:
                return "ok"
            return NOT_JUDGED if thin is None else THIN
        return "n/a"

    def unjudged(self) -> dict[str, str]:
        """op -> why its row is not judged (thin rows too, their reason given after)."""
        out = {}
        for op, cells in self.grid().items():
            why = unjudged(cells) if self.verdict(cells) in (NOT_JUDGED, THIN) else None
            if why is not None:
                out[op] = why + (f"; named thin: {self.thin[op]}" if op in self.thin else "")
        return out

    def conventions(self) -> dict[str, list[str]]:
        """op -> its convention lines, each once: lines that differ only in their numbers
        (the same float64 loss seen by 55 checks, each with its own value) collapse to the
        first one with a count, "(x55 checks, values differ)"."""
        seen: dict[str, dict[str, list[str]]] = {}  # op -> shape -> the lines of that shape
        for r in self.results:
            for c in r.conventions:
                for op in r.ops:
                    seen.setdefault(op, {}).setdefault(_NUMBER.sub("#", c), []).append(c)
        out: dict[str, list[str]] = {}
        for op, shapes in seen.items():
            for lines in shapes.values():
                n, distinct = len(lines), len(set(lines))
                out.setdefault(op, []).append(
                    lines[0] if n == 1 else
                    f"{lines[0]} (x{n} checks" + (", values differ)" if distinct > 1 else ")"))
        return out

    def unverified(self) -> list[dict]:
        """The declarations (``layernorm.eps=1e-05``, ``attention.W_o=False``) some check ran
        under but no check of :data:`VERIFYING_KINDS` did: ``{"declaration", "ops",
        "checks"}`` (the checks that ran under it), in the order first seen.  Under ``--quick
        --oracle off`` a wrong eps declaration is green on FD and the invariants alone; the
        report says the declaration went unverified."""
        seen: dict[str, dict] = {}
        for r in self.results:
            if r.outcome not in _RAN:
                continue
            for line in r.conventions:
                m = _DECLARED.match(line)
                if m is None:
                    continue
                d = seen.setdefault(m["declaration"], {"ops": [], "checks": 0, "by": False})
                d["ops"] += [op for op in r.ops if op not in d["ops"]]
                d["checks"] += 1
                d["by"] |= r.kind in VERIFYING_KINDS
        return [{"declaration": k, "ops": d["ops"], "checks": d["checks"]}
                for k, d in seen.items() if not d["by"]]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[r.outcome] = out.get(r.outcome, 0) + 1
        return out

    # ------------------------------------------------------------------ the verdict
    def exit_code(self) -> int:
        """0 every provided op conforms; 1 a check failed; 2 the implementation could not be
        checked (it does not load, provides nothing, a check could not run)."""
        if self.load_error is not None:
            return EXIT_NOT_RUN
        verdicts = self.verdicts()
        if any(v == "FAIL" for v in verdicts.values()):
            return EXIT_FAIL
        if not any(v in ("ok", "error", NOT_JUDGED, THIN) for v in verdicts.values()):
            return EXIT_NOT_RUN
        if self.notes or any(v in ("error", NOT_RUN, NOT_JUDGED) for v in verdicts.values()):
            return EXIT_NOT_RUN
        return EXIT_OK

    def summary(self) -> str:
        """One line: the verdict and why."""
        code = self.exit_code()
        if self.load_error is not None:
            return f"could not run: {self.load_error}"
        verdicts = self.verdicts()
        failed = [op for op, v in verdicts.items() if v == "FAIL"]
        if failed:
            return f"{len(failed)} op(s) fail: {', '.join(failed)}"
        if code == EXIT_NOT_RUN:
            errors = [op for op, v in verdicts.items() if v == "error"]
            if self.notes:
                return f"could not run: {self.notes[0]}"
            if errors:
                return (f"could not run every check of: {', '.join(errors)} "
                        "(see the cells marked error)")
            thin = {op: why for op, why in self.unjudged().items() if op not in self.thin}
            if thin:
                op, why = next(iter(thin.items()))
                return (f"not judged: {', '.join(thin)} ({op}: {why}); name a row knowingly "
                        f"thin with --thin {op}=REASON")
            return ("could not run: the implementation provides no protocol name of the "
                    "selected ops: nothing to check (the names: python -m minibert_spec.protocol)")
        ok = [op for op, v in verdicts.items() if v == "ok"]
        thin = [op for op, v in verdicts.items() if v == THIN]
        unverified = [d["declaration"] for d in self.unverified()]
        return (f"{len(ok)} op(s) conform"
                + (f", {len(thin)} named thin: {', '.join(thin)}" if thin else "")
                + (f"; declaration(s) no oracle or SymPy check verified: "
                   f"{', '.join(unverified)}" if unverified else ""))

    def groups(self) -> list[dict]:
        """The reds that share a cause (minibert_spec.suite.shrink.cause_of: an exception raised on
        one line of the implementation, one dtype promotion), largest first: ``{"cause", "count",
        "checks": [every id], "ops": [...]}``.  Only how the report reads: each check keeps
        its own result and every op its verdict."""
        by: dict[str, list[Result]] = {}
        for r in self.failures():
            if r.cause:
                by.setdefault(r.cause, []).append(r)
        out = [{"cause": cause, "count": len(rs), "checks": [r.id for r in rs],
                "ops": in_table_order(op for r in rs for op in r.ops)}
               for cause, rs in by.items() if len(rs) > 1]
        return sorted(out, key=lambda g: -g["count"])

    def not_run(self) -> list[Result]:
        """The checks the run did not reach (it stopped at its first red)."""
        return [r for r in self.results if r.outcome == NOT_RUN]

    def failures(self) -> list[Result]:
        return [r for r in self.results if r.outcome in ("failed", "xpassed")]

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        grid, why = self.grid(), self.unjudged()
        return {
            "schema": SCHEMA, "impl": self.impl, "exit_code": self.exit_code(),
            "summary": self.summary(), "oracle": self.oracle, "bad_input": self.bad_input,
            "seconds": round(self.seconds, 2), "depth": self.depth, "notes": self.notes,
            "load_error": self.load_error, "provenance": self.provenance,
            "columns": [{"key": k, "heading": h} for k, h in COLUMNS],
            "counts": self.counts(), "groups": self.groups(),
            "ops": [{"op": op, "verdict": self.verdict(cells, self.thin.get(op)),
                     **({"not_judged": why[op]} if op in why else {}),
                     "cells": {k: c.to_json() for k, c in cells.items()},
                     "conventions": self.conventions().get(op, [])}
                    for op, cells in grid.items()],
            "results": [r.to_json() for r in self.results],
            **({"settings": self.settings} if self.settings else {}),
            **({"shard": self.shard} if self.shard is not None else {}),
            **({"merged_from": self.merged_from} if self.merged_from else {}),
            **({"thin": self.thin} if self.thin else {}),
            "not_provided": self.not_provided(),
            "unverified_declarations": self.unverified(),
        }

    @classmethod
    def from_json(cls, data: Mapping) -> CheckReport:
        """The report a :meth:`to_json` document holds (its results, run notes and settings;
        the grid, verdicts and exit status are recomputed from them, never read)."""
        fields = Result.__dataclass_fields__
        results = [Result(**{**{k: v for k, v in r.items() if k in fields},
                             "ops": tuple(r["ops"])}) for r in data["results"]]
        return cls(data["impl"], results, data.get("oracle", "require"),
                   bool(data.get("bad_input")), list(data.get("notes") or []),
                   float(data.get("seconds") or 0.0), data.get("load_error"),
                   dict(data.get("provenance") or {}), dict(data.get("settings") or {}),
                   data.get("shard"), list(data.get("merged_from") or []),
                   check_thin(data.get("thin"), "thin"),
                   dict(data.get("depth") or {}))


def first_rows(data: dict) -> list[dict]:
    """The rows of the ops the implementation provides, those with a verdict first, then the
    n/a ones (the ops not provided are one line after them: ``data["not_provided"]``)."""
    absent = set(data.get("not_provided", ()))
    rows = [r for r in data["ops"] if r["op"] not in absent]
    return sorted(rows, key=lambda r: r["verdict"] == "n/a")  # stable: table order kept


def apply_expectations(results: Iterable[Result], expected: Mapping[str, str] | None
                       ) -> list[Result]:
    """Expected failures (id -> reason; a former id names its renamed check, with a
    DeprecationWarning), strict: a failure becomes ``xfailed`` (reason kept), a pass becomes
    ``xpassed`` (a failure of the expectation)."""
    if not expected:
        return list(results)
    expected = {renamed(k, stacklevel=3): v for k, v in expected.items()}
    out = []
    for r in results:
        reason = expected.get(r.id)
        if reason is not None and r.outcome == "failed":
            r.outcome, r.message = "xfailed", f"expected: {reason} -- {r.message}"
        elif reason is not None and r.outcome == "passed":
            r.outcome, r.message = "xpassed", (f"expected to fail ({reason}) but passed: "
                                               "remove it from expected_failed_checks")
        out.append(r)
    return out


def expectations_from_args(values: Iterable[str]) -> dict[str, str]:
    """``ID`` or ``ID=REASON`` strings (``minibert check --xfail``, ``--minibert-xfail``) as
    expected failures (id -> reason).  An id ends at its closing bracket, so a reason may hold
    ``=``; without one the reason says where the expectation came from."""
    out = {}
    for value in values:
        check_id, sep, reason = value.partition("]=")
        if sep:
            check_id += "]"
        out[check_id.strip()] = reason.strip() or "expected to fail (given on the command line)"
    return out
