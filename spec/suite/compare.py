"""Whether two ``minibert check --format json`` reports give one verdict: the same check ids,
the same outcome per check, the same verdict per op, and for every failed check the same failing
tensor (the part of its message that names what failed, before the index and values: those
follow the example Hypothesis shrank to, which may change with the shrink budget while the
failure does not).  Checks that one report did not run (``not run``: stopped at the first red)
are counted apart ("not compared"): neither a difference nor an agreement.

Used by ``minibert bench --verdict`` (a timing of runs that disagree is no timing), the shard
merge's tests and ``tests/benchmarks/compare_verdicts.py`` (the command-line form).  Reads
JSON only.
"""

from __future__ import annotations

import json
import re

from minibert_spec.suite.run import NOT_RUN

# the start of the part of a failure's first line that follows the example, not the failure
_EXAMPLE_DETAIL = re.compile(
    r"\s*(?:\(worst\b|worst\b|:?\s*error\s+\d|at index\b|at size\b|\(localised\b|:\s*got\b)")


def failing_tensor(message: str) -> str:
    """What a failure names: its first line up to the index, values or example it found,
    each ``;``-separated finding kept (an invariant reports several)."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    parts = []
    for finding in re.split(r";\s+(?=[a-z_.]+:)", first):
        m = _EXAMPLE_DETAIL.search(finding)
        parts.append((finding[:m.start()] if m else finding).strip(" :;,("))
    return "; ".join(parts)


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def not_compared(before: dict, after: dict) -> list[str]:
    """The checks one report did not run (``not run``: it stopped at its first red): listed,
    neither a difference nor an agreement."""
    b = {r["id"]: r["outcome"] for r in before["results"]}
    a = {r["id"]: r["outcome"] for r in after["results"]}
    return sorted(i for i in set(a) & set(b) if NOT_RUN in (a[i], b[i]))


def compare(before: dict, after: dict, *, messages: bool = False) -> list[str]:
    """Every difference, one line each (empty: the verdicts agree on every check both ran)."""
    out = []
    b = {r["id"]: r for r in before["results"]}
    a = {r["id"]: r for r in after["results"]}
    skipped = set(not_compared(before, after))
    for i in sorted(set(b) - set(a)):
        out.append(f"{i}: only in the first report ({b[i]['outcome']})")
    for i in sorted(set(a) - set(b)):
        out.append(f"{i}: only in the second report ({a[i]['outcome']})")
    for i in sorted(set(a) & set(b) - skipped):
        ob, oa = b[i]["outcome"], a[i]["outcome"]
        if ob != oa:
            out.append(f"{i}: {ob} -> {oa}")
        elif ob == "failed":
            tb, ta = failing_tensor(b[i]["message"]), failing_tensor(a[i]["message"])
            if tb != ta:
                out.append(f"{i}: fails on {tb!r} -> {ta!r}")
            elif messages and b[i]["message"].splitlines()[0] != a[i]["message"].splitlines()[0]:
                out.append(f"{i}: message {b[i]['message'].splitlines()[0]!r} -> "
                           f"{a[i]['message'].splitlines()[0]!r}")
    vb = {o["op"]: o["verdict"] for o in before["ops"]}
    va = {o["op"]: o["verdict"] for o in after["ops"]}
    for op in sorted(set(vb) | set(va)):
        if vb.get(op) != va.get(op) and NOT_RUN not in (vb.get(op), va.get(op)):
            out.append(f"op {op}: verdict {vb.get(op)} -> {va.get(op)}")
    if before.get("exit_code") != after.get("exit_code") and not skipped:
        out.append(f"exit code {before.get('exit_code')} -> {after.get('exit_code')}")
    return out
