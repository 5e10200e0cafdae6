"""How much of an adapter does ``minibert adapter infer`` write (issue 39: "<= 30 hand-written
adapter lines each, infer writing at least 70% of the rows")?  For each realistic example of
user code with a hand-written adapter -- every ``tests/examples/realstyle_*.py``, plus
``classy_bert`` (its adapter is the separate module ``classy_adapter``) and ``wm_decoder`` (its
decoder row's adapter ``DECODER``) -- it reports:

* **lines**: the hand-written adapter's lines of code.  The rule, applied to every example: the
  adapter is the region that starts at a comment line ``# ---... <title with "adapter">`` and
  ends at the next ``# ---...`` comment line (or the end of the file); an adapter module without
  such a marker (``classy_adapter``) is its adapter throughout.  Counted there: every line
  holding code (no blank, comment or docstring lines), plus, outside the region, the module's
  top-level ``CAPABILITIES = ...`` statement and its ``minibert_spec`` imports (written for the
  suite alone).  What the region holds besides the protocol lines (a mask converter, a name
  map) is counted: the user writes it;
* **hand rows**: the protocol rows (ops) the hand adapter provides (every protocol name of the
  row present, as ``minibert check`` decides n/a);
* **infer rows**: the rows of the adapter ``python -m minibert_spec.cli adapter infer MODULE``
  writes for the user's module (its exit status when it writes nothing), and for each hand row
  it misses, infer's own reason: its "not mapped" lines naming that row, else that the row is
  not among the ops infer probes;
* **share**: infer rows that the hand adapter also maps / hand rows;
* **check**: the exit status of ``minibert check <infer's adapter> --ops <its rows> --quick``
  (0: accepted and green; "-" when infer wrote no adapter).

    python tests/benchmarks/adapter_share.py [-k NAME] [--no-check] [--json FILE]

A benchmark, not a test (each example costs two infer runs and a quick check, seconds each).
Exit status 0 when every example meets issue 39's bar (lines <= 30 and share >= 70%), 1
otherwise.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from minibert_spec.protocol.loading import load_impl  # noqa: E402 (after ROOT is importable)
from minibert_spec.protocol.proxy import provides  # noqa: E402
from minibert_spec.protocol.table import OPS  # noqa: E402
from minibert_spec.suite.infer import PROBES, infer_isolated  # noqa: E402

EXAMPLES_DIR = ROOT / "tests" / "examples"
# the examples whose adapter is not in the user's module's own marker region: (the user's
# module, the hand adapter as minibert check takes it)
EXTRA = {"classy_bert": "tests.examples.classy_adapter",
         "wm_decoder": "tests.examples.wm_decoder:DECODER"}
MARKER = re.compile(r"\s*# -{3,}")
ADAPTER_MARKER = re.compile(r"\s*# -{3,} .*\badapter\b")
MAX_LINES, MIN_SHARE = 30, 0.70  # issue 39's bar
INFER_TIMEOUT = 60


def examples() -> dict[str, str]:
    """The user's module -> its hand adapter (``module[:object]``): a realstyle module whose
    ``correct`` is its correct build is checked as ``module:correct``."""
    out = {}
    for p in sorted(EXAMPLES_DIR.glob("realstyle_*.py")):
        tree = ast.parse(p.read_text())
        built = any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "correct"
                                                       for t in n.targets) for n in tree.body)
        out[p.stem] = f"tests.examples.{p.stem}" + (":correct" if built else "")
    return {**out, **EXTRA}


def code_lines(source: str) -> set[int]:
    """The line numbers holding code: no blank, comment-only or docstring line."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
            lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value,
                                                                           str):
            lines -= set(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def adapter_lines(source: str) -> int:
    """The hand adapter's lines of code in ``source`` (the module docstring's rule)."""
    text = source.splitlines()
    region, inside = set(), False
    for i, line in enumerate(text, 1):
        if MARKER.match(line):
            inside = bool(ADAPTER_MARKER.match(line))
        elif inside:
            region.add(i)
    if not any(ADAPTER_MARKER.match(line) for line in text):
        region = set(range(1, len(text) + 1))
    for node in ast.parse(source).body:
        declared = isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "CAPABILITIES" for t in node.targets)
        imported = isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "minibert_spec")
        if declared or imported:
            region.update(range(node.lineno, node.end_lineno + 1))
    return len(region & code_lines(source))


def rows_of(impl) -> list[str]:
    """The protocol rows ``impl`` provides (every name of the row present)."""
    return [op.name for op in OPS.values() if op.names and provides(impl, *op.names)]


def run_infer(module: str, out: Path) -> tuple[int, str]:
    """``minibert adapter infer MODULE -o OUT``: its exit status and its last stderr line."""
    proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "adapter", "infer", module,
                           "-o", str(out), "--timeout", str(INFER_TIMEOUT)], cwd=ROOT,
                          capture_output=True, text=True, env=_env())
    return proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]


def _env(*paths: str) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)])}


def load_written(path: Path):
    """The module infer wrote, imported from its file."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def miss_reason(row: str, missing: list[str]) -> str:
    """infer's reason for not writing ``row``: its not-mapped lines naming the row, and those of
    the classes/functions whose name holds the row's (``class Linear: ...`` for linear); else
    that it has no probe for that op."""
    said = [m.split(": ", 1)[1] for m in missing if m.startswith(f"{row}: ")]
    key = row.replace("_", "")
    said += [m for m in missing if m.startswith(("class ", "functions "))
             and key in m.split(":", 1)[0].lower().replace("_", "")]
    if said:
        return "; ".join(said)
    if row in OTHER_ROWS:
        return f"nothing in the module reads as one ({OTHER_ROWS[row]})"
    return f"no probe for {row} (infer probes: {', '.join(PROBES)}; and {', '.join(OTHER_ROWS)})"


# the rows infer writes by other means than a probe of PROBES, and what it looks for
OTHER_ROWS = {"adam": "an optimizer class whose step(params, grads) updates the dict, or "
                      "whose update(name, param, grad, t) updates each parameter",
              "schedule": "a function of the step and three numbers, or a class",
              "clip": "a function named like clipping",
              "block": "a block class, or a function pair block_forward(x, p, *, n_heads, ...)"}


def measure(module: str, hand: str, tmp: Path, check: bool) -> dict:
    path = EXAMPLES_DIR / f"{hand.split(':')[0].rsplit('.', 1)[1]}.py"
    hand_rows = rows_of(load_impl(hand))
    user = f"tests.examples.{module}"
    written = tmp / f"inferred_{module}.py"
    rc, said = run_infer(user, written)
    inf_rows = rows_of(load_written(written)) if rc == 0 else []
    got = infer_isolated(user, INFER_TIMEOUT, paths=[str(ROOT)])
    missing = list(got.missing) if got.reason is None else [got.reason]
    check_rc = None
    if check and inf_rows:
        check_rc = subprocess.run(
            [sys.executable, "-m", "minibert_spec.cli", "check", written.stem, "--ops", *inf_rows,
             "--quick", "-j", "1"], cwd=ROOT, capture_output=True, text=True,
            env=_env(str(tmp))).returncode
    both = [r for r in hand_rows if r in inf_rows]
    return {"example": module, "adapter": hand, "lines": adapter_lines(path.read_text()),
            "hand_rows": hand_rows, "infer_exit": rc, "infer_said": said if rc else "",
            "infer_rows": inf_rows, "extra_rows": [r for r in inf_rows if r not in hand_rows],
            "share": len(both) / len(hand_rows) if hand_rows else None,
            "missed": {r: miss_reason(r, missing) for r in hand_rows if r not in inf_rows},
            "not_mapped": missing, "check_exit": check_rc}


def meets(r: dict) -> bool:
    return r["lines"] <= MAX_LINES and (r["share"] or 0) >= MIN_SHARE


def print_table(results: list[dict]) -> None:
    print(f"{'example':28} {'lines':>5} {'hand':>4} {'infer':>5} {'both':>4} {'share':>5} "
          f"{'check':>5}  rows (hand | infer)")
    for r in results:
        share = "-" if r["share"] is None else f"{r['share']:.0%}"
        check = "-" if r["check_exit"] is None else str(r["check_exit"])
        both = len(r["hand_rows"]) - len(r["missed"])
        infer = ", ".join(r["infer_rows"]) or f"none (exit {r['infer_exit']})"
        print(f"{r['example']:28} {r['lines']:>5} {len(r['hand_rows']):>4} "
              f"{len(r['infer_rows']):>5} {both:>4} {share:>5} {check:>5}  "
              f"{', '.join(r['hand_rows'])} | {infer}")
    hand = sum(len(r["hand_rows"]) for r in results)
    both = sum(len(r["hand_rows"]) - len(r["missed"]) for r in results)
    lines = sorted(r["lines"] for r in results)
    print(f"\n{len(results)} examples; hand-written adapter lines: median "
          f"{lines[len(lines) // 2]}, max {lines[-1]}, {sum(n <= MAX_LINES for n in lines)} within "
          f"{MAX_LINES}; infer writes {both} of the {hand} hand rows ({both / max(hand, 1):.0%}); "
          f"{sum(meets(r) for r in results)} of {len(results)} meet issue 39's bar")
    print("\nrows infer misses, with its reason:")
    for r in results:
        for row, why in r["missed"].items():
            print(f"  {r['example']}: {row}: {why}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", "--match", default="", help="only the examples whose name has this")
    ap.add_argument("--no-check", action="store_true",
                    help="skip minibert check of infer's adapters (the slowest part)")
    ap.add_argument("--json", help="also write the measurements to this file")
    args = ap.parse_args()
    chosen = {m: h for m, h in examples().items() if args.match in m}
    if not chosen:
        raise SystemExit(f"-k: expected a part of an example's name, got {args.match!r}")
    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(m, h, Path(tmp), not args.no_check) for m, h in chosen.items()]
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(map(meets, results)) else 1


if __name__ == "__main__":
    sys.exit(main())
