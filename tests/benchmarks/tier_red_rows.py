"""Does the standard tier keep every red row of ``--deep`` (issue 40)?  For each implementation
(default: every module of tests/examples), ``minibert check IMPL`` and ``minibert check IMPL
--deep``, each in a fresh process, and their red rows compared: the ops whose verdict is FAIL or
error, and the exit status.

    python tests/benchmarks/tier_red_rows.py [IMPL ...] [-o table.json] [--oracle off]

A benchmark, not a test (each implementation costs two whole runs).  Exit status 0 when every
implementation has the same red rows and exit status in both tiers, 1 otherwise (each
difference printed).  The wall seconds are printed beside the rows: quote ``uptime`` with them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RED = ("FAIL", "error")


def examples() -> list[str]:
    """Every module of tests/examples, as ``tests.examples.<name>``."""
    return sorted(f"tests.examples.{p.stem}" for p in (ROOT / "tests" / "examples").glob("*.py")
                  if p.stem != "__init__")


def run(impl: str, tier: list[str], out: Path, oracle: str) -> dict:
    """One ``minibert check`` in a fresh process: exit status, red rows, wall seconds."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", impl, *tier,
                           "--oracle", oracle, "--format", "json", "-o", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    row = {"exit": proc.returncode, "wall_s": round(time.perf_counter() - start, 1)}
    if out.exists():
        data = json.loads(out.read_text(encoding="utf-8"))
        row["red"] = sorted(o["op"] for o in data["ops"] if o["verdict"] in RED)
        row["failed_checks"] = sum(r["outcome"] == "failed" for r in data["results"])
        row["load_error"] = data.get("load_error")
    else:
        row["red"], row["failed_checks"] = None, None
        row["load_error"] = (proc.stderr.strip().splitlines() or ["no report"])[-1]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("impls", nargs="*", help="implementations (default: tests/examples/*)")
    p.add_argument("--oracle", choices=("require", "off"), default="require")
    p.add_argument("-o", "--output", help="also write the table as JSON here")
    args = p.parse_args(argv)
    rows, differ = {}, []
    with tempfile.TemporaryDirectory(prefix="tier-red-rows-") as tmp:
        for impl in args.impls or examples():
            std = run(impl, [], Path(tmp) / f"{impl}-standard.json", args.oracle)
            deep = run(impl, ["--deep"], Path(tmp) / f"{impl}-deep.json", args.oracle)
            same = std["red"] == deep["red"] and std["exit"] == deep["exit"]
            rows[impl] = {"standard": std, "deep": deep, "same": same}
            print(f"{impl:45} exit {std['exit']}/{deep['exit']}  red rows standard "
                  f"{std['red']} deep {deep['red']}  failed checks {std['failed_checks']}/"
                  f"{deep['failed_checks']}  wall {std['wall_s']}/{deep['wall_s']} s  "
                  f"{'same' if same else 'DIFFER'}", flush=True)
            if not same:
                differ.append(impl)
    if args.output:
        Path(args.output).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    reds = [i for i, r in rows.items() if r["deep"]["red"]]
    print(f"{len(rows)} implementations, {len(reds)} with red rows under --deep; "
          + (f"DIFFER: {', '.join(differ)}" if differ else "the standard tier's red rows and "
             "exit statuses are --deep's on every one"))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
