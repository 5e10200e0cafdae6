"""The class table of ``minibert check --many DIR --format html -o DIR``: one row per
implementation, one column per op, each cell the op's verdict
(minibert_spec.suite.many.class_table),
rendered from the very JSON ``--format json`` writes (copied into the site as ``many.json``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from minibert_spec.report import CHECK_STATUSES, Site, Stats


def first_failure(impl: dict, op: str) -> str:
    """A red cell's tooltip: its first failed check and the first line of its message."""
    for f in impl["failed"]:
        if op in f["ops"]:
            return f"{f['id']}: {f['message']}"
    return ""


def write_many_site(data: dict, out: Path, provenance: dict | None = None) -> Stats:
    """Write the class table for ``data`` into ``out`` (atomically)."""
    start = time.perf_counter()
    codes = [i["exit_code"] for i in data["implementations"]]
    counts = {"ok": codes.count(0), "fail": codes.count(1),
              "other": len(codes) - codes.count(0) - codes.count(1)}
    with Site(out, title="minibert check --many", provenance=provenance,
              nav=[("Class table", "index.html")], legend=CHECK_STATUSES) as site:
        site.write("many.json", json.dumps(data, indent=1))
        site.render("many.html", "index.html", data=data, counts=counts,
                    first_failure=first_failure)
        files = list(site.files)
    size = sum((Path(out) / f).stat().st_size for f in files)
    return Stats(len(files), size, time.perf_counter() - start)
