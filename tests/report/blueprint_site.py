"""The audit's data and the blueprint site built from it, once per test process (the audit
collects the tests with pytest and runs the SymPy proofs: ~10 s), for
tests/report/test_blueprint*.py."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def audit_data() -> dict:
    """The dict `minibert audit --format json` writes, for the bundled reference and tests/
    (timings not measured)."""
    from minibert_spec.audit import run_audit
    from minibert_spec.cli._provenance import provenance
    from minibert_spec.cli.audit import report_data

    return report_data(run_audit(measure=False), provenance())


@cache
def site(base: Path) -> Path:
    """The blueprint written from :func:`audit_data` into ``base`` (pytest's basetemp: one
    site per test process)."""
    from minibert_spec.report.blueprint import write_blueprint

    out = Path(base) / "blueprint-site"
    write_blueprint(audit_data(), out)
    return out


# --------------------------------------------------------------------------- reading pages
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Element:
    def __init__(self, tag: str, attrs: dict, parent=None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list = []  # Element or str

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Element):
                yield from c.iter()

    def find_all(self, tag: str | None = None, **attrs) -> list[Element]:
        """Elements with this tag (any if None) whose attributes equal ``attrs``
        (``class_`` matches one class among several; ``True`` matches any value)."""
        out = []
        for el in self.iter():
            if tag is not None and el.tag != tag:
                continue
            ok = True
            for k, v in attrs.items():
                if k == "class_":
                    ok = v in el.attrs.get("class", "").split()
                elif v is True:
                    ok = k.replace("_", "-") in el.attrs
                else:
                    ok = el.attrs.get(k.replace("_", "-")) == v
                if not ok:
                    break
            if ok:
                out.append(el)
        return out

    def find(self, tag: str | None = None, **attrs) -> Element | None:
        found = self.find_all(tag, **attrs)
        return found[0] if found else None


def parse(path: Path) -> Element:
    """A page as a tree of elements (html.parser; void and self-closed elements handled)."""
    from html.parser import HTMLParser

    root = Element("#document", {})

    class Builder(HTMLParser):
        cur = root

        def handle_starttag(self, tag, attrs):
            el = Element(tag, {k: v or "" for k, v in attrs}, self.cur)
            self.cur.children.append(el)
            if tag not in VOID:
                self.cur = el

        def handle_startendtag(self, tag, attrs):
            self.cur.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.cur))

        def handle_endtag(self, tag):
            el = self.cur
            while el is not root and el.tag != tag:
                el = el.parent
            if el is not root:
                self.cur = el.parent

        def handle_data(self, data):
            self.cur.children.append(data)

    b = Builder(convert_charrefs=True)
    b.feed(Path(path).read_text(encoding="utf-8"))
    b.close()
    return root


# --------------------------------------------------------------------------- a broken copy
BROKEN_ID = "layernorm.backward.dx"
# the closed form of dx with one sign flipped: SymPy now refutes what was recorded as proven
CLOSED_DX = "return np.array([(g[i] - mg - xh[i] * mgx) / S for i in range(N)], dtype=object)"
WRONG_DX = "return np.array([(g[i] - mg + xh[i] * mgx) / S for i in range(N)], dtype=object)"


@cache
def broken_site(base: Path):
    """`minibert audit --format html` run on a scratch copy of the project whose LayerNorm dx
    closed form is wrong: (the finished process, the site folder)."""
    import os
    import shutil
    import subprocess
    import sys

    from minibert_spec.audit import ROOT

    scratch = Path(base) / "broken-project"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in ("spec", "reference", "tests"):
        shutil.copytree(ROOT / name, scratch / name, ignore=ignore)
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy(ROOT / name, scratch / name)
    # the import names of the copy's folders (package-dir in pyproject), first on its path, ahead
    # of the checkout's editable install
    for folder, package in (("spec", "minibert_spec"), ("reference", "minibert_reference")):
        (scratch / package).symlink_to(folder, target_is_directory=True)
    eq_file = scratch / "spec" / "equations" / "layernorm.py"
    text = eq_file.read_text(encoding="utf-8")
    assert text.count(CLOSED_DX) == 1, "the closed form to break moved: update blueprint_site"
    eq_file.write_text(text.replace(CLOSED_DX, WRONG_DX), encoding="utf-8")
    out = Path(base) / "broken-site"
    env = {**os.environ, "PYTHONPATH": str(scratch)}
    proc = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "audit", "--no-measure",
                           "--format", "html", "-o", str(out)], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc, out
