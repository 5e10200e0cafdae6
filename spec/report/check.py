"""The conformance grid of one implementation as a page: ``minibert check MODULE --format html
-o DIR``.

Rendered from the check's JSON data alone (:meth:`minibert_spec.suite.report.CheckReport.to_json`,
the very dict ``--format json`` writes, copied into the site as ``check.json``), so the page and the
JSON cannot disagree: every cell's status, reason and check ids come from ``ops[].cells``,
every failure's text from ``results[].message``.  What the renderer adds is presentation: the
op x column grid with each red cell linking to its failures (the check id, the message that
names the tensor, the index and both values, and Hypothesis's reproduction set apart), the
n/a reasons, the run's notes and provenance, and the conventions per op.

One page, ``index.html``: anchors ``cell-<op>-<column>`` (a red cell's failures) and
``check-<id>`` (one failed check inside it), ``conv-<op>``.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

from minibert_spec.report import CHECK_STATUSES, Site, Stats
from minibert_spec.suite.report import UNVERIFIED_HINT, first_rows

RED_CELLS = ("FAIL", "error")  # the cells that link to their failures
# minibert_spec.suite.run.failure_message puts the reproduction after it
REPRODUCE = "\nreproduce: "
# a check's outcome (minibert_spec.suite.run.Result) -> the cell word whose colour shows it
OUTCOME_STATUS = {"passed": "ok", "xfailed": "ok", "failed": "FAIL", "xpassed": "FAIL",
                  "error": "error", "n/a": "n/a", "not run": "not run"}


def anchor(*parts: str) -> str:
    """An element id from op names, column keys and check ids ('invariant[layernorm.normalises]' ->
    'invariant-layernorm.normalises-'): no space, bracket or slash in a URL fragment."""
    return "-".join(re.sub(r"[^A-Za-z0-9_.]+", "-", p) for p in parts)


def split_message(message: str) -> dict:
    """A result's message -> {headline, body, reproduce}: the first line (what failed and
    where), the rest of the explanation (arrays, further findings) and the reproduction."""
    text, _, repro = message.partition(REPRODUCE)
    head, _, body = text.strip().partition("\n")
    return {"headline": head, "body": body.strip("\n"), "reproduce": repro.strip()}


def _grid(data: dict, results: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    """The grid's rows (the provided ops first; those not provided are one line of the
    template, ``data["not_provided"]``) and, per red cell, its failures (in grid order)."""
    rows, failures = [], []
    for row in first_rows(data):
        op, cells = row["op"], []
        for col in data["columns"]:
            c, here = row["cells"][col["key"]], anchor("cell", op, col["key"])
            red = c["status"] in RED_CELLS
            cells.append({"key": col["key"], "heading": col["heading"], **c,
                          "href": f"#{here}" if red else ""})
            if red:
                failures.append({
                    "anchor": here, "op": op, "column": col["heading"],
                    "key": col["key"], "status": c["status"], "detail": c["detail"],
                    "ran": c["ran"],
                    "checks": [{"id": i, "anchor": anchor("check", op, col["key"], i),
                                **_result(results, i)} for i in c["checks"]]})
                for k in failures[-1]["checks"]:
                    k["rerun"] = rerun_command(data["impl"], k["id"], k["kind"],
                                               (data.get("settings") or {}).get("model", False))
        rows.append({"op": op, "verdict": row["verdict"], "cells": cells,
                     "conventions": row["conventions"], "not_judged": row.get("not_judged")})
    return rows, failures


def _result(results: dict[str, dict], check_id: str) -> dict:
    r = results.get(check_id)
    if r is None:  # a cell naming a check the results lack: say so, never hide the cell
        return {"outcome": "missing", "kind": "", "ops": [], "seconds": 0.0,
                "message": "(no result of this id in the report)", "conventions": [],
                **split_message("(no result of this id in the report)")}
    return {**r, **split_message(r["message"])}


def rerun_command(impl: str, check_id: str, kind: str, model: bool = False) -> str:
    """The command that runs this one check again (its id as an anchored regular expression;
    a bad-input check only runs with --bad-input; a run of ``--model`` -- the model the suite
    built of the implementation's rows, the run's settings say -- with --model again)."""
    exact = re.sub(r"([][.\\^$*+?(){}|])", r"\\\1", check_id)  # re.escape, minus '-' and ','
    argv = ["minibert", "check", impl, *(["--model"] if model else []), "-k", f"^{exact}$"]
    if kind == "bad_input":
        argv.append("--bad-input")
    return shlex.join(argv)


def _notes(data: dict) -> tuple[list[str], list[str]]:
    """(problems, remarks): what went wrong with the run itself (red), and what was not run
    on purpose (said, never silently absent)."""
    problems = ([f"could not run: {data['load_error']}"] if data.get("load_error") else [])
    problems += list(data["notes"])
    remarks = []
    if data["oracle"] == "off":
        remarks.append("oracle off (--oracle off): the PyTorch columns were not run")
    if not data["bad_input"]:
        remarks.append("bad input not run (pass --bad-input for the named-error checks)")
    for d in data.get("unverified_declarations", ()):
        remarks.append(f"unverified declaration {d['declaration']} ({', '.join(d['ops'])}): "
                       f"{d['checks']} check(s) ran under it, none against the oracle or SymPy "
                       f"({UNVERIFIED_HINT})")
    return problems, remarks


def write_check_site(data: dict, out: Path) -> Stats:
    """Write the conformance page for the check JSON ``data`` into ``out`` (atomically)."""
    start = time.perf_counter()
    results = {r["id"]: r for r in data["results"]}
    rows, failures = _grid(data, results)
    problems, remarks = _notes(data)
    with Site(out, title="minibert check", provenance=data.get("provenance"),
              nav=[("Conformance grid", "index.html")], legend=CHECK_STATUSES) as site:
        site.write("check.json", json.dumps(data, indent=1))
        site.render("check.html", "index.html", data=data, rows=rows, failures=failures,
                    problems=problems, remarks=remarks,
                    conventions=[r for r in rows if r["conventions"]],
                    conv_anchor=lambda op: anchor("conv", op),
                    results=[{**r, "status": OUTCOME_STATUS.get(r["outcome"], "error")}
                             for r in data["results"]])
        files = list(site.files)
    size = sum((Path(out) / f).stat().st_size for f in files)
    return Stats(len(files), size, time.perf_counter() - start)
