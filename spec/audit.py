"""The audit: equations x implementations x tests, joined by equation ID.

* equations: ``spec.equations`` (ID, sources, SymPy proof/refutation, SymPy <-> code check);
* implementations: functions of the implementation under test that carry ``__equations__``
  (set by ``reference.registry.implements``), found by walking the package -- no registry
  object is needed, so another implementation only has to tag its functions;
* tests: a static AST scan of ``tests/`` for ``pytest.mark.equation(...)`` and
  ``pytest.mark.oracle`` (function, class, module ``pytestmark``, ``pytest.param(marks=...)``,
  and marks built by a helper in another ``tests/`` module).  A tagged test is oracle evidence
  if it carries ``oracle``; finite-difference evidence if it reaches the FD machinery
  (``spec.gradcheck``'s checks) through its own body or the helpers it calls.

A *gap* is missing evidence; a *regression* is evidence that contradicts the record (a proof
whose outcome differs from the recorded verdict, a claim whose verdict changed).  Both fail the
audit.  NumPy/stdlib only; SymPy is imported by the proofs.
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

FD_NAMES = frozenset({"directional_check", "elementwise_check", "check_gradients",
                      "model_gradcheck"})
ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- tests (AST)
@dataclass(frozen=True)
class TaggedTest:
    file: str  # relative to the scanned root's parent
    name: str  # Class.test_name or test_name
    line: int
    ids: tuple[str, ...]
    oracle: bool
    fd: bool

    @property
    def nodeid(self) -> str:
        return f"{self.file}::{self.name.replace('.', '::')}"


def _mark_name(node: ast.AST) -> str | None:
    """'equation' for pytest.mark.equation / mark.equation (called or not), else None."""
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute) \
            and target.value.attr == "mark":
        return target.attr
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
            and target.value.id == "mark":
        return target.attr
    return None


class _Module:
    """One parsed test-side module: constants, imports, top-level functions."""

    def __init__(self, path: Path, tests_dir: Path):
        self.path = path
        self.tests_dir = tests_dir
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        self.constants: dict[str, tuple[str, ...]] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                strings = _literal_strings(node.value)
                if strings is not None:
                    self.constants[node.targets[0].id] = strings
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)

    def string_literals(self) -> set[str]:
        return {n.value for n in ast.walk(self.tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _literal_strings(node) -> tuple[str, ...] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, (ast.Tuple, ast.List)) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return tuple(e.value for e in node.elts)
    return None


class _Scanner:
    def __init__(self, tests_dir: Path, known_ids: Iterable[str]):
        self.tests_dir = tests_dir
        self.known = set(known_ids)
        self.modules: dict[Path, _Module] = {}

    def module(self, path: Path) -> _Module | None:
        if path not in self.modules:
            try:
                self.modules[path] = _Module(path, self.tests_dir)
            except (OSError, SyntaxError):
                return None
        return self.modules[path]

    def helper_path(self, mod: _Module, dotted: str) -> Path | None:
        """A ``tests.x`` / ``x`` module beside the tests -> its file."""
        parts = dotted.split(".")
        if parts[0] == self.tests_dir.name:
            parts = parts[1:]
        candidate = self.tests_dir.joinpath(*parts).with_suffix(".py")
        return candidate if parts and candidate.is_file() else None

    # ----------------------------------------------------------------- marks
    def marks(self, mod: _Module, exprs: Iterable[ast.AST], seen=None) -> tuple[set, bool]:
        """Equation IDs and the oracle flag in decorator/pytestmark expressions."""
        ids: set[str] = set()
        oracle = False
        seen = set() if seen is None else seen
        for expr in exprs:
            for node in ast.walk(expr):
                name = _mark_name(node) if isinstance(node, (ast.Call, ast.Attribute)) else None
                if name == "oracle":
                    oracle = True
                elif name == "equation" and isinstance(node, ast.Call):
                    ids |= self.equation_args(mod, node)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    # marks built by a helper, e.g. parametrize("op", op_params())
                    more, orc = self.helper_marks(mod, node.func.id, seen)
                    ids |= more
                    oracle |= orc
        return ids, oracle

    def equation_args(self, mod: _Module, call: ast.Call) -> set[str]:
        ids: set[str] = set()
        for arg in call.args:
            strings = _literal_strings(arg)
            if strings is not None:
                ids |= set(strings)
            elif isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name) \
                    and arg.value.id in mod.constants:
                ids |= set(mod.constants[arg.value.id])
            else:  # dynamic (e.g. *op.equations): every known ID spelled out in this module
                ids |= mod.string_literals() & self.known
        return ids

    def helper_marks(self, mod: _Module, name: str, seen: set) -> tuple[set, bool]:
        key = (mod.path, name)
        if key in seen:
            return set(), False
        seen.add(key)
        if name in mod.functions:
            return self.marks(mod, [mod.functions[name]], seen)
        if name in mod.imports:
            module, real = mod.imports[name]
            path = self.helper_path(mod, module)
            other = self.module(path) if path else None
            if other is not None and real in other.functions:
                return self.marks(other, [other.functions[real]], seen)
        return set(), False

    # ----------------------------------------------------------------- FD reachability
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
                path = self.helper_path(mod, module)
                other = self.module(path) if path else None
                if other is not None and real in other.functions \
                        and self.reaches_fd(other, other.functions[real], seen):
                    return True
        return False

    # ----------------------------------------------------------------- tests
    def scan_file(self, path: Path) -> list[TaggedTest]:
        mod = self.module(path)
        if mod is None:
            return []
        module_marks = [n.value for n in mod.tree.body if isinstance(n, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                for t in n.targets)]
        rel = path.relative_to(self.tests_dir.parent).as_posix()
        out = []

        def add(fn, qual, class_decorators=()):
            ids, oracle = self.marks(mod, list(fn.decorator_list) + list(class_decorators)
                                     + module_marks)
            if ids:
                fd = not oracle and self.reaches_fd(mod, fn)
                out.append(TaggedTest(rel, qual, fn.lineno, tuple(sorted(ids)), oracle, fd))

        for node in mod.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and node.name.startswith("test"):
                add(node, node.name)
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                            and item.name.startswith("test"):
                        add(item, f"{node.name}.{item.name}", node.decorator_list)
        return out


def scan_tests(tests_dir: Path | str = ROOT / "tests", known_ids: Iterable[str] = ()) \
        -> list[TaggedTest]:
    """Every tagged test under ``tests_dir`` (files test_*.py / *_test.py), statically."""
    tests_dir = Path(tests_dir)
    scanner = _Scanner(tests_dir, known_ids)
    files = sorted(set(tests_dir.rglob("test_*.py")) | set(tests_dir.rglob("*_test.py")))
    return [ref for f in files for ref in scanner.scan_file(f)]


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
    gaps: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    seconds: float = 0.0

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


def join(equations: Mapping, impls: Mapping[str, list[ImplRef]], tests: list[TaggedTest], *,
         impl=None, run_proofs: bool = True) -> list[Row]:
    """One row per equation (plus a row per unknown ID found in tags)."""
    by_id: dict[str, list[TaggedTest]] = {}
    for t in tests:
        for i in t.ids:
            by_id.setdefault(i, []).append(t)
    rows = []
    for eq in equations.values():
        row = Row(eq.id, eq.kind, eq.title, list(eq.sources), "missing", eq.expected, "", [], [],
                  [], bool(eq.torch_op), bool(eq.gradient), "", eq.target)
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
        row.fd_tests = sorted(t.nodeid for t in by_id.get(evidence_id, []) if t.fd)
        row.oracle_tests = sorted(t.nodeid for t in by_id.get(evidence_id, []) if t.oracle)
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
        else:
            row.numeric = "(target's)"
        rows.append(row)
    for unknown in sorted((set(impls) | set(by_id)) - set(equations)):
        where = [r.where for r in impls.get(unknown, [])] + [t.nodeid
                                                             for t in by_id.get(unknown, [])]
        rows.append(Row(unknown, "unknown", "(not in spec/equations)", [], "missing", "", "",
                        [], [], [], False, False, "", None,
                        gaps=[f"ID used by {', '.join(where)} but not defined in spec"]))
    return rows


# --------------------------------------------------------------------------- the report
@dataclass
class Report:
    rows: list[Row]
    claims: list  # spec.claims.Outcome
    seconds: float
    tests_scanned: int

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
        return {"equations": len([r for r in self.rows if r.kind != "unknown"]),
                "sympy": {f"{k}/{s}": n for (k, s), n in sorted(eq.items())},
                "claims": dict(Counter(c.verdict for c in self.claims)),
                "gaps": len(self.gaps), "regressions": len(self.regressions)}

    def to_json(self) -> dict:
        return {"ok": self.ok, "seconds": round(self.seconds, 2), "counts": self.counts(),
                "equations": [{**asdict(r), "verdict": r.verdict} for r in self.rows],
                "claims": [c.to_json() for c in self.claims],
                "gaps": self.gaps, "regressions": self.regressions}


def run_audit(impl=None, *, tests_dir: Path | str = ROOT / "tests", run_proofs: bool = True,
              claims: bool = True, measure: bool = True) -> Report:
    """The whole audit: proofs, implementation tags, test tags, claims ledger."""
    from spec.equations import load
    start = time.perf_counter()
    if impl is None:
        impl = importlib.import_module("reference")
    equations = load()
    tests = scan_tests(tests_dir, equations)
    rows = join(equations, collect_implementations(impl), tests, impl=impl,
                run_proofs=run_proofs)
    outcomes = []
    if claims:
        from spec.claims import evaluate_all
        outcomes = evaluate_all(impl, measure=measure)
    return Report(rows, outcomes, time.perf_counter() - start, len(tests))
