"""The blueprint as a reader sees it: every page of the site opened in headless Chromium (the
Debian package; tests/report/cdp.py drives it over a pipe), asserted from the rendered page.

Skips only when no Chromium is installed -- and fails instead under CI (``$CI`` set), where
.ci/run installs it, so CI can never pass without running these checks.  Screenshots of the
index, an equation page and the graph are saved in the test's folder, and also in
``$MINIBERT_SCREENSHOTS`` when set (how docs/blueprint/*.png are made).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from minibert_spec.report import STATUS
from tests.report.blueprint_site import BROKEN_ID, audit_data, broken_site, parse, site
from tests.report.cdp import open_page, rgb, save_shot, site_fixtures

SHOT_PAGE = "layernorm.backward.dx.gamma_outside"  # a refuted statement: counterexample shown


browser, built = site_fixtures("the blueprint's browser checks", site)


@cache
def _ids(path: Path) -> frozenset[str]:
    return frozenset(el.attrs["id"] for el in parse(path).iter() if "id" in el.attrs)


LINKS_JS = """[...document.querySelectorAll('a[href], link[href], img[src]')].map(e => {
  const raw = e.getAttribute(e.tagName === 'IMG' ? 'src' : 'href');
  return [e.tagName, new URL(raw, document.baseURI).href,
          e.tagName === 'IMG' ? (e.complete && e.naturalWidth > 0) : true];
})"""
MATH_JS = """[...document.querySelectorAll('math')].map(m => {
  const r = m.getBoundingClientRect();
  return [m.closest('[id]') ? m.closest('[id]').id : '', r.width, r.height];
})"""


@pytest.mark.slow  # the slow tier (conftest.py): every page in a browser
def test_every_page_renders_math_without_errors_and_every_link_resolves(browser, built):
    pages = sorted(built.rglob("*.html"))
    assert len(pages) == len(audit_data()["equations"]) + 3  # index, graph, claims
    components = {f"eq/{r['id']}.html" for r in audit_data()["equations"]
                  if r["kind"] == "component"}  # stated in words: no MathML
    problems = []
    for page in pages:
        since = open_page(browser, page)
        rel = page.relative_to(built).as_posix()
        maths = browser.evaluate(MATH_JS)
        if rel.startswith("eq/") and rel not in components:
            statement = [m for m in maths if m[0] == "statement"]
            if len(statement) != 1 or statement[0][1] < 20 or statement[0][2] < 10:
                problems.append(f"{rel}: statement MathML laid out as {statement}")
        problems += [f"{rel}: MathML of size {m[1]}x{m[2]}" for m in maths
                     if m[1] <= 0 or m[2] <= 0]
        for tag, url, loaded in browser.evaluate(LINKS_JS):
            u = urlparse(url)
            if u.scheme != "file":
                problems.append(f"{rel}: {tag} leaves the site: {url}")
                continue
            target = Path(unquote(u.path))
            if not target.is_file() or built.resolve() not in target.resolve().parents:
                problems.append(f"{rel}: {tag} {url} does not resolve inside the site")
            elif u.fragment and target.suffix == ".html" and u.fragment not in _ids(target):
                problems.append(f"{rel}: {url}: no element #{u.fragment}")
            elif not loaded:
                problems.append(f"{rel}: image {url} did not load")
        problems += [f"{rel}: {e}" for e in browser.errors(since)]
    assert not problems, "\n".join(problems[:40])


def test_status_colours_on_screen_match_the_json(browser, built):
    data = audit_data()
    eq_status = {r["id"]: r["status"] for r in data["equations"]}
    claim_status = {c["id"]: c["status"] for c in data["claims"]}
    open_page(browser, built / "index.html")
    dots = browser.evaluate("""[...document.querySelectorAll('li[data-id]')].map(li =>
        [li.className, li.dataset.id,
         getComputedStyle(li.querySelector('.dot')).backgroundColor])""")
    assert len(dots) > len(eq_status)
    for cls, i, colour in dots:
        word = eq_status[i] if cls == "eq-item" else claim_status[i]
        assert colour == rgb(STATUS[word].colour), (i, word, colour)
    open_page(browser, built / "graph.html")
    nodes = browser.evaluate("""[...document.querySelectorAll('svg a.node')].map(a =>
        [a.dataset.id, getComputedStyle(a.querySelector('rect')).fill])""")
    assert sorted(i for i, _ in nodes) == sorted(eq_status)
    for i, fill in nodes:
        assert fill == rgb(STATUS[eq_status[i]].colour), (i, fill)
    open_page(browser, built / "claims.html")
    rows = browser.evaluate("""[...document.querySelectorAll('tr[data-id]')].map(tr =>
        [tr.dataset.id, getComputedStyle(tr.querySelector('.badge')).backgroundColor])""")
    assert {i for i, _ in rows} == set(claim_status)
    for i, colour in rows:
        assert colour == rgb(STATUS[claim_status[i]].colour), (i, colour)


def test_graph_nodes_open_their_pages(browser, built):
    open_page(browser, built / "graph.html")
    hrefs = browser.evaluate("""[...document.querySelectorAll('svg a.node')].map(a =>
        [a.dataset.id, new URL(a.getAttribute('href'), document.baseURI).href])""")
    assert len(hrefs) == len(audit_data()["equations"])
    for eq_id, url in hrefs:
        assert Path(unquote(urlparse(url).path)) == (built / "eq" / f"{eq_id}.html").resolve()
    eq_id, url = hrefs[len(hrefs) // 2]
    browser.goto(url)
    assert browser.evaluate("document.querySelector('h1 code').textContent") == eq_id


def test_screenshots(browser, built, tmp_path):
    for page, name, height in ((built / "index.html", "index.png", 1100),
                               (built / "eq" / f"{SHOT_PAGE}.html", "equation.png", 1400),
                               (built / "graph.html", "graph.png", 1400)):
        shot = save_shot(browser, page, name, tmp_path, height)
        head = shot.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == \
            (1280, height)  # the viewport


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_a_broken_derivation_is_red_on_screen(browser, tmp_path_factory):
    """The scratch project with a wrong LayerNorm dx closed form (tests/report/blueprint_site.py):
    in the browser its page's badge, its index entries and its graph node are red, and the
    nodes resting on it are outlined in red."""
    proc, out = broken_site(tmp_path_factory.getbasetemp())
    assert proc.returncode == 1, proc.stderr[-2000:]
    red = rgb(STATUS["regression"].colour)
    open_page(browser, out / "eq" / f"{BROKEN_ID}.html")
    assert browser.evaluate(
        "getComputedStyle(document.getElementById('status')).backgroundColor") == red
    open_page(browser, out / "index.html")
    colours = browser.evaluate(f"""[...document.querySelectorAll('li[data-id="{BROKEN_ID}"] .dot')]
        .map(d => getComputedStyle(d).backgroundColor)""")
    assert colours and set(colours) == {red}
    open_page(browser, out / "graph.html")
    fill, outline = browser.evaluate(f"""[
        getComputedStyle(document.querySelector('a.node[data-id="{BROKEN_ID}"] rect')).fill,
        getComputedStyle(document.querySelector('a.node[data-id="embedding_ln.backward"] rect'))
            .stroke]""")
    assert fill == red and outline == rgb("#dc2626")
    save_shot(browser, out / "eq" / f"{BROKEN_ID}.html", "broken.png",
               tmp_path_factory.mktemp("shots"), 1000)
