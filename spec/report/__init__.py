"""Static HTML reports: one layout, one set of status colours, written atomically.

A report is a folder of HTML pages that opens from the file system -- no server, no network,
no JavaScript, every asset inside the folder.  Pages come from Jinja2 templates
(``spec/report/templates``) that extend ``base.html`` (header with the provenance, navigation,
legend); the colours of every status word live in :data:`STATUS` alone and reach the pages as
the generated ``assets/style.css`` classes ``st-<status>``.

A report kind (the audit's blueprint, :mod:`minibert_spec.report.blueprint`; the conformance grid of
``minibert check``, :mod:`minibert_spec.report.check`) opens a :class:`Site`, renders its pages into
it, and the folder is swapped into place only when every page was written: an interruption or an
error leaves the previous report whole.  Needs the ``report`` extra (jinja2, latex2mathml,
pygments).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = ".minibert-report"  # a folder holding this file may be replaced by a new report


@dataclass(frozen=True)
class Status:
    colour: str  # the background of badges, dots and graph nodes (white text on it)
    meaning: str


# One colour per status word of every report.  Green: it holds; amber: a document's statement
# is wrong (recorded, the code does the right thing); blue: it holds under one reading; violet:
# nothing can reproduce it; red: the project itself is missing evidence or contradicts its
# record -- the only colours that fail the audit.
STATUS: dict[str, Status] = {
    "verified": Status("#15803d", "derivation proven in SymPy, implemented, checked by tests "
                                  "that kill its mutants"),
    "proven": Status("#15803d", "the document's statement is proven in SymPy"),
    "confirmed": Status("#15803d", "the claimed value is reproduced"),
    "refuted": Status("#d97706", "the document is wrong: a counterexample or the correct "
                                 "value is shown; the reference implements the correct form"),
    "convention": Status("#1d4ed8", "right under one reading of an ambiguous statement, wrong "
                                    "under another; the reference's reading is named"),
    "not reproducible": Status("#6d28d9", "nothing in the project can produce the value"),
    "gap": Status("#dc2626", "evidence is missing (fails the audit)"),
    "regression": Status("#991b1b", "an outcome contradicts the recorded verdict (fails the "
                                    "audit)"),
    # the cells of `minibert check` (minibert_spec.suite.report.Cell.status): the same green and
    # red, a magenta for a check that could not run (exit 2, never a pass), grey for nothing to
    # check
    "ok": Status("#15803d", "every check of this op and column that ran passed"),
    "FAIL": Status("#dc2626", "a check failed: its link shows the check id, the tensor, the "
                              "index, both values and the reproduction"),
    "error": Status("#9d174d", "a check could not run here (a missing extra, a worker that "
                               "died, the time limit): never a pass"),
    "n/a": Status("#6b7280", "nothing was checked here, for the reason given (a name the "
                             "implementation lacks, a column that was not run)"),
    "not run": Status("#a16207", "checks here were not run: the run stopped at its first red "
                                 "(--first-red); never a pass"),
    # a row's verdict only (minibert_spec.suite.report.unjudged)
    "not judged": Status("#9d174d", "the row's checks passed on too little evidence: its "
                                    "backward met no finite differences, or its forward "
                                    "neither the oracle nor an identity (exit 2)"),
    "thin": Status("#a16207", "not judged, and named so knowingly (--thin OP=REASON)"),
}
RED = frozenset({"gap", "regression"})
# the words each report's legend explains
AUDIT_STATUSES = ("verified", "proven", "confirmed", "refuted", "convention",
                  "not reproducible", "gap", "regression")
CHECK_STATUSES = ("ok", "FAIL", "error", "not run", "n/a", "not judged", "thin")


def slug(status: str) -> str:
    """The CSS class suffix of a status word: 'not reproducible' -> 'not-reproducible',
    'n/a' -> 'n-a' (a class name holds no space or slash)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", status)


@dataclass
class Stats:
    """What a report writer wrote: files, bytes, seconds."""

    files: int
    bytes: int
    seconds: float


class MissingExtra(ValueError):
    """The report extra is not installed (a user's setup, reported in one line)."""


def require() -> None:
    """Import what HTML reports need, or say in one line which package is missing."""
    import importlib
    for name in ("jinja2", "latex2mathml", "pygments"):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise MissingExtra(f"HTML reports need {name}: pip install "
                               "'minibert-spec[report]' (jinja2, latex2mathml, pygments)") from e


def environment():
    """The Jinja2 environment of every report (autoescaping on)."""
    require()
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["slug"] = slug
    env.globals["STATUS"] = STATUS
    return env


def check_output(out: Path) -> None:
    """Refuse, before any work, a destination a report must not replace: a file, or a
    non-empty folder that is not a report of ours."""
    out = Path(out)
    if out.is_file():
        raise ValueError(f"-o {out}: expected a folder for the HTML report, got a file")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(f"-o {out}: the folder exists, is not empty and holds no earlier "
                         f"report ({MARKER} missing); pass a new or empty folder")


def _umask() -> int:
    """This process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class Site:
    """A report folder under construction: pages render into a hidden staging folder beside
    ``out``; leaving the ``with`` block without an error swaps it into place (the old report
    is removed only after the new one is in place)."""

    def __init__(self, out: Path, *, title: str, provenance: dict | None,
                 nav: list[tuple[str, str]], legend: tuple[str, ...] = AUDIT_STATUSES):
        self.out = Path(out)
        check_output(self.out)
        self.title, self.provenance, self.nav = title, provenance or {}, nav
        self.legend = legend  # the STATUS words the footer explains
        self.env = environment()
        self.files: list[str] = []
        self.staging: Path | None = None

    def __enter__(self) -> Site:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", dir=self.out.parent))
        # mkdtemp makes it 0700 (private); the report folder it becomes gets the mode mkdir
        # would give it (0755 under the usual umask): a report is for reading
        os.chmod(self.staging, 0o777 & ~_umask())
        (self.staging / "assets").mkdir()
        self.write("assets/style.css", self.env.get_template("style.css").render())
        (self.staging / MARKER).write_text("written by minibert; safe to replace\n")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        old = None
        if self.out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.old.", dir=self.out.parent))
            os.rename(self.out, old / "site")
        os.rename(self.staging, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def write(self, path: str, text: str | bytes) -> None:
        dest = self.staging / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            dest.write_bytes(text)
        else:
            dest.write_text(text, encoding="utf-8")
        self.files.append(path)

    def render(self, template: str, path: str, **context) -> None:
        """Render ``template`` to ``path`` (relative to the site); ``root`` (the way back to
        the site's top, e.g. '../') and the layout's variables are supplied."""
        root = "../" * path.count("/")
        page = self.env.get_template(template).render(
            root=root, site_title=self.title, provenance=self.provenance, nav=self.nav,
            here=path, legend=self.legend, **context)
        self.write(path, page)
