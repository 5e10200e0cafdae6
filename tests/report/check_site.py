"""A real `minibert check` run and its HTML page, once per test process, for
tests/report/test_check_html*.py: the deliberately broken LayerNorm (tests/examples/broken_impl.py)
on a few ops, the quick run (every check on its fixed-seed cases: a failure carries its
reproduction, the explicit example), the oracle off (its columns say so).  ~4 s."""

from __future__ import annotations

from functools import cache
from pathlib import Path

IMPL = "tests.examples.broken_impl"
OPS = ("linear", "layernorm", "softmax", "relu", "cross_entropy")
QUICK = ["--quick"]  # the run's selection, as `minibert check` arguments


@cache
def check_report():
    """The :class:`minibert_spec.suite.report.CheckReport` of the run, with its provenance."""
    from minibert_spec.cli._provenance import provenance
    from minibert_spec.suite import check_implementation

    report = check_implementation(IMPL, ops=OPS, quick=True, oracle="off")
    report.provenance = provenance()
    return report


def as_json(report) -> dict:
    """The dict `minibert check --format json` writes (through JSON text, as a reader gets it)."""
    import json

    return json.loads(json.dumps(report.to_json()))


@cache
def check_data() -> dict:
    return as_json(check_report())


@cache
def check_site(base: Path) -> Path:
    """The page written from :func:`check_data` into ``base`` (one per test process)."""
    from minibert_spec.report.check import write_check_site

    out = Path(base) / "check-site"
    write_check_site(check_data(), out)
    return out
