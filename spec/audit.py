"""The audit: equations x implementations x tests, joined by equation ID.

* equations: ``minibert_spec.equations`` (ID, sources, SymPy proof/refutation, SymPy <-> code
  check);
* implementations: functions of the implementation under test that carry ``__equations__``
  (``minibert_reference.registry.implements``), found by walking the package -- no registry
  object is needed, so another implementation only has to tag its functions;
* tests: ``pytest --collect-only`` of ``tests/`` (``minibert_spec.evidence.collect_items``): every
  collected case and the IDs of its ``equation`` markers; a collection error fails the audit
  loudly.  A tagged case is oracle evidence if it carries ``oracle``, finite-difference evidence
  if not and its function reaches the FD machinery (:class:`_Reach`).

A *gap* is missing evidence; a *regression* is evidence that contradicts the record (a proof
whose outcome differs from the recorded verdict, a claim whose verdict changed).  Both fail the
audit.  NumPy/stdlib only; SymPy is imported by the proofs and pytest by the collection
subprocess.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from minibert_spec.evidence import collect_items, fingerprint, read_matrix
from minibert_spec.paths import HOME

FD_NAMES = frozenset({"directional_check", "elementwise_check", "check_gradients",
                      "model_gradcheck"})
ROOT = HOME


# --------------------------------------------------------------------------- tests (pytest)
@dataclass(frozen=True)
class TaggedTest:
    """One collected test case and the equation IDs its markers declare."""

    nodeid: str  # tests/suite/test_suite_reference.py::test_conformance[fd[layernorm]]
    file: str  # relative to the tests directory's parent
    function: str  # Class.test_name or test_name (the definition the case comes from)
    line: int
    ids: tuple[str, ...]
    oracle: bool
    fd: bool

    @property
    def function_id(self) -> str:
        """The nodeid without the parametrization: file::Class::test_name."""
        return f"{self.file}::{self.function.replace('.', '::')}"


class _Module:
    """One parsed test-side module: its top-level functions, classes and imports."""

    def __init__(self, path: Path):
        self.path = path
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        self.functions: dict[str, ast.AST] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)

    def definition(self, qualname: str) -> ast.AST | None:
        """test_x or Class.test_x (nested classes too) -> its FunctionDef."""
        *classes, name = qualname.split(".")
        body = self.tree.body
        for cls in classes:
            node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
            if node is None:
                return None
            body = node.body
        return next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == name), None)


class _Reach:
    """Does a test function reach the FD machinery (FD_NAMES) through its body or the helpers
    it calls (same module, or a module beside the tests imported by name)?"""

    def __init__(self, tests_dir: Path):
        self.tests_dir = tests_dir
        self.modules: dict[Path, _Module | None] = {}
        self.memo: dict[tuple[Path, str], bool] = {}

    def module(self, path: Path) -> _Module | None:
        if path not in self.modules:
            try:
                self.modules[path] = _Module(path)
            except (OSError, SyntaxError):
                self.modules[path] = None
        return self.modules[path]

    def helper_path(self, dotted: str) -> Path | None:
        """A ``tests.x`` / ``x`` module beside the tests -> its file."""
        parts = dotted.split(".")
        if parts[0] == self.tests_dir.name:
            parts = parts[1:]
        candidate = self.tests_dir.joinpath(*parts).with_suffix(".py") if parts else None
        return candidate if candidate is not None and candidate.is_file() else None

    def test(self, path: Path, qualname: str) -> bool:
        key = (path, qualname)
        if key not in self.memo:
            mod = self.module(path)
            fn = mod.definition(qualname) if mod is not None else None
            self.memo[key] = fn is not None and self.reaches_fd(mod, fn)
        return self.memo[key]

    def reaches_fd(self, mod: _Module, fn: ast.AST, seen=None) -> bool:
        seen = set() if seen is None else seen
        names = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
        if names & FD_NAMES:
            return True
        for name in names:
            key = (mod.path, name)
            if key in seen:
                continue
            seen.add(key)
            if name in mod.functions and mod.functions[name] is not fn:
                if self.reaches_fd(mod, mod.functions[name], seen):
                    return True
            elif name in mod.imports:
                module, real = mod.imports[name]
                path = self.helper_path(module)
                other = self.module(path) if path else None
                if other is not None and real in other.functions \
                        and self.reaches_fd(other, other.functions[real], seen):
                    return True
        return False


def tagged_tests(records: Iterable[Mapping], tests_dir: Path | str = ROOT / "tests") \
        -> list[TaggedTest]:
    """The collected items that declare equation IDs, each with its FD flag (not an oracle
    test, and its function reaches the FD machinery)."""
    tests_dir = Path(tests_dir).resolve()
    reach = _Reach(tests_dir)
    out = []
    for r in records:
        if not r["ids"]:
            continue
        if "kind" in r:  # a judging-suite check declares its kind
            fd = r["kind"] == "fd"
        else:
            fd = not r["oracle"] and reach.test(tests_dir.parent / r["file"], r["function"])
        out.append(TaggedTest(r["nodeid"], r["file"], r["function"], r["line"],
                              tuple(r["ids"]), bool(r["oracle"]), fd))
    return out


def scan_tests(tests_dir: Path | str = ROOT / "tests", *, impl_spec: str | None = None) \
        -> list[TaggedTest]:
    """Every tagged test case under ``tests_dir``, as pytest collects it."""
    return tagged_tests(collect_items(tests_dir, impl_spec=impl_spec), tests_dir)


# --------------------------------------------------------------------------- implementations
@dataclass(frozen=True)
class ImplRef:
    name: str  # module.qualname
    file: str
    line: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _rel(path: str) -> str:
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path


def _ref(fn) -> ImplRef:
    fn = inspect.unwrap(fn)
    try:
        file, line = inspect.getsourcefile(fn) or "?", inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        file, line = "?", 0
    return ImplRef(f"{fn.__module__}.{fn.__qualname__}", _rel(file), line)


def collect_implementations(impl) -> dict[str, list[ImplRef]]:
    """Equation ID -> functions tagged with it, from the implementation object: a package is
    walked (every submodule except the CLI), a module or object is searched attribute by
    attribute."""
    try:  # the conformance proxy (conftest's impl fixture): search what it wraps
        impl = object.__getattribute__(impl, "_impl_obj")
    except AttributeError:
        pass
    objects = [impl]
    if inspect.ismodule(impl) and hasattr(impl, "__path__"):
        for info in pkgutil.walk_packages(impl.__path__, impl.__name__ + "."):
            if ".commands" in info.name or info.name.endswith(".cli"):
                continue
            try:
                objects.append(importlib.import_module(info.name))
            except Exception:  # noqa: BLE001 -- a broken optional module is not our concern
                continue
    found: dict[str, dict[str, ImplRef]] = {}
    for obj in objects:
        for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
            for eq in getattr(value, "__equations__", ()) or ():
                ref = _ref(value)
                found.setdefault(eq, {})[ref.name] = ref
    return {eq: sorted(refs.values(), key=lambda r: r.name) for eq, refs in found.items()}


def proof_sites(proof) -> list[str]:
    """The functions holding an equation's SymPy derivation, as 'name (file:line)': the proof
    function, or for a lambda (``lambda: _prove("dx", closed_dx)``) the module's functions it
    names (the comparison and the closed form)."""
    fn = inspect.unwrap(proof)
    fns = [fn]
    if getattr(fn, "__name__", "") == "<lambda>":
        named = [fn.__globals__.get(n) for n in fn.__code__.co_names]
        fns = [c for c in named if inspect.isfunction(c) and c.__module__ == fn.__module__]
    return [f"{r.name} ({r.where})" for r in map(_ref, fns)]


def resolve_hint(hint: str) -> ImplRef | None:
    """'module:attr' -> its ImplRef, or None if it does not import."""
    module, _, attr = hint.partition(":")
    try:
        return _ref(getattr(importlib.import_module(module), attr))
    except (ImportError, AttributeError):
        return None


# --------------------------------------------------------------------------- the join
@dataclass
class Row:
    id: str
    kind: str
    title: str
    sources: list[str]
    sympy: str  # proven / refuted / convention / missing / error
    expected: str
    detail: str
    implementations: list[str]  # "name (file:line)"
    fd_tests: list[str]
    oracle_tests: list[str]
    oracle_needed: bool
    fd_needed: bool
    numeric: str  # "yes" / "n/a: why" / "missing"
    target: str | None
    where: str = ""  # file:line of the equation's register(...) call
    tests: list[str] = field(default_factory=list)  # every test case tagged with it (nodeids)
    gaps: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # mutation-verified evidence: per catalog mutant of this equation, whether the tests tagged
    # with it kill it (spec/results/mutation_matrix.json, `minibert mutate --matrix`)
    mutants: list[dict] = field(default_factory=list)
    mutation: str = ""  # one-line summary: "2/2 mutants killed by 5 of 44 tagged tests", ...
    # for readers (the HTML report): the statement, what it is built from, notes
    latex: str = ""
    uses: list[str] = field(default_factory=list)
    note: str = ""
    proof: list[str] = field(default_factory=list)  # the SymPy derivation, "name (file:line)"

    @property
    def status(self) -> str:
        """One word for the row's colour: regression, gap, the SymPy outcome of a document's
        statement (proven / refuted / convention), or verified."""
        if self.regressions:
            return "regression"
        if self.gaps:
            return "gap"
        if self.kind == "document":
            return self.sympy
        return "verified"

    @property
    def verdict(self) -> str:
        if self.regressions:
            return "REGRESSION"
        if self.gaps:
            return "gap"
        if self.kind == "document":
            return {"proven": "proven", "refuted": f"refuted (code: {self.target})",
                    "convention": f"convention (code: {self.target})"}.get(self.sympy, self.sympy)
        return "verified"


def mutation_evidence(row: Row, equation, tagged: list[str], matrix: Mapping | None,
                      root: Path = ROOT) -> None:
    """Does the row's evidence see a bug?  Fills ``row.mutants`` / ``row.mutation`` and adds
    gaps: a derivation with a gradient and FD/oracle evidence but no catalog mutant; a mutant
    without a current matrix record (missing, or its fingerprint -- edits, tagged node ids,
    their files -- changed); tagged tests that kill none of the equation's mutants."""
    from minibert_spec.mutants import CATALOG

    names = sorted(n for n, m in CATALOG.items() if m.equation == row.id)
    if not names:
        row.mutation = "no mutant"
        if getattr(equation, "gradient", False):
            row.gaps.append("gradient evidence but no catalog mutant breaks it "
                            "(add one to spec/mutants.py)")
        return
    if matrix is None:
        row.mutation = "no matrix"
        row.gaps.append(f"no mutation matrix records its mutants {names} "
                        "(run `minibert mutate --matrix`)")
        return
    current = set(tagged)
    stale, killed_by = [], set()
    for name in names:
        rec = matrix["rows"].get(name)
        fresh = bool(rec) and rec.get("fingerprint") == fingerprint(name, tagged, root)
        killers = sorted(set(rec.get("killers", ())) & current) if rec else []
        row.mutants.append({"mutant": name, "description": CATALOG[name].description,
                            "edits": [{"target": e.target, "old": e.old, "new": e.new}
                                      for e in CATALOG[name].edits],
                            "status": rec["status"] if rec else "missing",
                            "fresh": fresh, "killers": killers})
        if not fresh:
            stale.append(name)
        killed_by.update(killers)
    killed = [m["mutant"] for m in row.mutants if m["killers"]]
    row.mutation = (f"{len(killed)}/{len(names)} mutants killed by {len(killed_by)} of "
                    f"{len(tagged)} tagged tests" + (f"; stale: {', '.join(stale)}" if stale
                                                     else ""))
    if stale:
        row.gaps.append(f"mutation matrix stale or missing for {stale} (the catalog or the "
                        "tagged tests changed): run `minibert mutate --matrix`")
    if not killed:
        row.gaps.append(f"its tagged tests kill none of its mutants {names}: the tags claim "
                        "evidence no test shows")


def join(equations: Mapping, impls: Mapping[str, list[ImplRef]], tests: list[TaggedTest], *,
         impl=None, run_proofs: bool = True, matrix: Mapping | None = None,
         mutation: bool = False, root: Path = ROOT,
         components: Mapping | None = None) -> list[Row]:
    """One row per equation (plus a row per component of ``components`` -- spec/components.py
    -- and a row per unknown ID found in tags).  With ``mutation``, each derivation with FD or
    oracle evidence must also be seen to kill a mutant of its equation (``matrix``: the
    recorded mutation matrix, None when absent)."""
    by_id: dict[str, list[TaggedTest]] = {}
    for t in tests:
        for i in t.ids:
            by_id.setdefault(i, []).append(t)
    rows = []
    for eq in equations.values():
        row = Row(eq.id, eq.kind, eq.title, list(eq.sources), "missing", eq.expected, "", [], [],
                  [], bool(eq.torch_op), bool(eq.gradient), "", eq.target,
                  where=f"{_rel(eq.file)}:{eq.line}" if eq.file else "",
                  latex=eq.latex, uses=list(eq.uses), note=eq.note,
                  proof=proof_sites(eq.proof) if eq.proof is not None else [])
        # SymPy
        if eq.proof is None:
            row.gaps.append("no SymPy proof or refutation")
        elif run_proofs:
            try:
                proof = eq.run_proof()
                row.sympy, row.detail, row.seconds = proof.status, proof.detail, proof.seconds
                if proof.status != eq.expected:
                    row.regressions.append(f"SymPy gives {proof.status}, recorded "
                                           f"{eq.expected}")
            except Exception as e:  # noqa: BLE001 -- reported, fails the audit
                row.sympy = "error"
                row.regressions.append(f"proof raised {type(e).__name__}: {e}")
        else:
            row.sympy = "not run"
        # evidence: a document entry shows (and relies on) its target's
        evidence_id = eq.target if eq.kind == "document" else eq.id
        if eq.kind == "document" and eq.target not in equations:
            row.gaps.append(f"target {eq.target!r} is not an equation")
        refs = list(impls.get(evidence_id, []))
        target_eq = equations.get(evidence_id, eq)
        if target_eq.impl_hint:
            hinted = resolve_hint(target_eq.impl_hint)
            if hinted is not None:
                refs.append(hinted)
        row.implementations = [f"{r.name} ({r.where})" for r in refs]
        tagged = by_id.get(evidence_id, [])
        row.tests = sorted(t.nodeid for t in tagged)
        row.fd_tests = sorted(t.nodeid for t in tagged if t.fd)
        row.oracle_tests = sorted(t.nodeid for t in tagged if t.oracle)
        if eq.kind == "derivation":
            if not refs:
                row.gaps.append("no implementing function")
            if eq.gradient and not row.fd_tests:
                row.gaps.append("no finite-difference test")
            if eq.torch_op and not row.oracle_tests:
                row.gaps.append(f"no oracle test ({eq.torch_op})")
            if eq.numeric is not None:
                missing = [n for n in eq.numeric.needs if impl is not None
                           and not hasattr(impl, n)]
                row.numeric = f"missing impl.{', impl.'.join(missing)}" if missing else "yes"
                if missing:
                    row.gaps.append(f"SymPy <-> code check cannot run: impl lacks {missing}")
            elif eq.numeric_na:
                row.numeric = f"n/a: {eq.numeric_na}"
            else:
                row.numeric = "missing"
                row.gaps.append("no SymPy <-> code check")
            if mutation and (row.fd_tests or row.oracle_tests):
                mutation_evidence(row, eq, row.tests, matrix, root)
        else:
            row.numeric = "(target's)"
        rows.append(row)
    components = components or {}
    rows += component_rows(components, by_id, matrix=matrix, mutation=mutation, root=root)
    for unknown in sorted((set(impls) | set(by_id)) - set(equations) - set(components)):
        where = [r.where for r in impls.get(unknown, [])] + [t.nodeid
                                                             for t in by_id.get(unknown, [])]
        rows.append(Row(unknown, "unknown", "(not in spec/equations)", [], "missing", "", "",
                        [], [], [], False, False, "", None,
                        gaps=[f"ID used by {', '.join(where)} but not defined in spec"]))
    return rows


def component_rows(components: Mapping, by_id: Mapping[str, list[TaggedTest]], *,
                   matrix: Mapping | None = None, mutation: bool = False,
                   root: Path = ROOT) -> list[Row]:
    """One row per component (spec/components.py): its implementation, its tagged tests, and
    with ``mutation`` its mutants and the tagged tests that kill them.  Gaps: no tagged test;
    a mutant no tagged test kills (or without a current matrix record)."""
    rows = []
    for c in components.values():
        ref = resolve_hint(c.implementation)
        row = Row(c.id, "component", c.statement, [], "n/a", "", "",
                  [f"{ref.name} ({ref.where})"] if ref else [], [], [], False, False, "n/a",
                  None, where=f"{_rel(c.file)}:{c.line}")
        if ref is None:
            row.gaps.append(f"implementation {c.implementation!r} does not import")
        row.tests = sorted(t.nodeid for t in by_id.get(c.id, []))
        if not row.tests:
            row.gaps.append("no test is tagged with it")
        elif mutation:
            mutation_evidence(row, c, row.tests, matrix, root)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- the report
@dataclass
class AuditReport:
    rows: list[Row]
    claims: list  # minibert_spec.claims.Outcome
    seconds: float
    tests_collected: int  # items pytest collected
    tests_tagged: int  # of which declare equation IDs

    @property
    def gaps(self) -> list[str]:
        out = [f"{r.id}: {g}" for r in self.rows for g in r.gaps]
        out += [f"claim {c.id}: {c.gap}" for c in self.claims if c.gap]
        return out

    @property
    def regressions(self) -> list[str]:
        out = [f"{r.id}: {g}" for r in self.rows for g in r.regressions]
        out += [f"claim {c.id}: {c.regression}" for c in self.claims if c.regression]
        return out

    @property
    def ok(self) -> bool:
        return not self.gaps and not self.regressions

    def counts(self) -> dict:
        from collections import Counter
        eq = Counter((r.kind, r.sympy) for r in self.rows)
        return {"equations": len([r for r in self.rows
                                  if r.kind not in ("unknown", "component")]),
                "components": len([r for r in self.rows if r.kind == "component"]),
                "sympy": {f"{k}/{s}": n for (k, s), n in sorted(eq.items())},
                "claims": dict(Counter(c.verdict for c in self.claims)),
                "tests_collected": self.tests_collected, "tests_tagged": self.tests_tagged,
                "gaps": len(self.gaps), "regressions": len(self.regressions)}

    def to_json(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 2), "counts": self.counts(),
                "equations": [{**asdict(r), "verdict": r.verdict, "status": r.status}
                              for r in self.rows],
                "claims": [c.to_json() for c in self.claims],
                "gaps": self.gaps, "regressions": self.regressions}


def run_audit(impl=None, *, impl_spec: str | None = None,
              tests_dir: Path | str = ROOT / "tests", run_proofs: bool = True,
              claims: bool = True, measure: bool = True) -> AuditReport:
    """The whole audit: proofs, implementation tags, test tags (pytest collection, run in a
    subprocess while the proofs run; ``impl_spec`` is passed on as the tests' ``--impl``),
    claims ledger.  A collection error raises ``minibert_spec.evidence.CollectionError``."""
    from concurrent.futures import ThreadPoolExecutor

    from minibert_spec.equations import load
    start = time.perf_counter()
    if impl is None:
        impl = importlib.import_module("minibert_reference")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(collect_items, tests_dir, impl_spec=impl_spec)
        equations = load()
        if run_proofs:  # while pytest collects; failures are reported by join()
            for eq in equations.values():
                try:
                    if eq.proof is not None:
                        eq.run_proof()
                except Exception:  # noqa: BLE001
                    pass
        records = pending.result()  # before the claims: their timings want a quiet machine
    tests = tagged_tests(records, tests_dir)
    # mutation evidence: the catalog mutates the bundled reference, checked by these tests
    mutation = getattr(impl, "__name__", None) == "minibert_reference" and \
        Path(tests_dir).resolve() == (ROOT / "tests").resolve()
    matrix = read_matrix() if mutation else None
    from minibert_spec.components import COMPONENTS

    rows = join(equations, collect_implementations(impl), tests, impl=impl,
                run_proofs=run_proofs, matrix=matrix, mutation=mutation, components=COMPONENTS)
    outcomes = []
    if claims:
        from minibert_spec.claims import evaluate_all
        outcomes = evaluate_all(impl, measure=measure, impl_spec=impl_spec)
    return AuditReport(rows, outcomes, time.perf_counter() - start, len(records), len(tests))
