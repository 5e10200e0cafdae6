"""Compare two ``minibert check --format json`` reports: the same check ids, the same outcome
per check, the same verdict per op, and for every failed check the same failing tensor (the
part of its message that names what failed, before the index and values: those follow the
example Hypothesis shrank to, which may change with the shrink budget while the failure does
not).  Checks that one report did not run (``not run``: stopped at the first red) are counted apart
("not compared"): neither a difference nor an agreement.

    python tests/benchmarks/compare_verdicts.py BEFORE.json AFTER.json [--messages]

Exit status 0 when they agree, 1 otherwise (each difference on a line).  ``--messages`` also
requires every failed check's first message line to be identical.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minibert_spec.suite.compare import compare, load, not_compared  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--messages", action="store_true",
                   help="also require identical first message lines of failed checks")
    args = p.parse_args(argv)
    before, after = load(args.before), load(args.after)
    diffs = compare(before, after, messages=args.messages)
    n = len({r["id"] for r in before["results"]} | {r["id"] for r in after["results"]})
    for line in diffs:
        print(line)
    failed = sum(r["outcome"] == "failed" for r in after["results"])
    skipped = not_compared(before, after)
    print(f"{n} checks, {failed} failed in the second report"
          + (f", {len(skipped)} not run in one of them (not compared)" if skipped else "")
          + ": " + ("the verdicts agree" if not diffs else f"{len(diffs)} difference(s)"))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
