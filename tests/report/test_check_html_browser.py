"""`minibert check --format html` as a reader sees it: the page of a real run (the broken
LayerNorm, tests/report/check_site.py) opened in headless Chromium (tests/report/cdp.py),
asserted from the rendered page: the grid laid out, every red cell's link landing on its
failures, each cell's colour the one its JSON status has, no console error, nothing loaded
from outside the folder.  A screenshot ``grid.png`` (also into ``$MINIBERT_SCREENSHOTS``:
docs/check/grid.png)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from minibert_spec.report import STATUS
from tests.report.cdp import open_page, rgb, save_shot, site_fixtures
from tests.report.check_site import check_data, check_site

browser, built = site_fixtures("the conformance page's browser checks", check_site)


CELLS_JS = """[...document.querySelectorAll('td.cell')].map(td => {
  const b = td.querySelector('.badge'), r = td.getBoundingClientRect();
  return [td.dataset.op, td.dataset.col, td.dataset.status, b.textContent.trim(),
          getComputedStyle(b).backgroundColor, r.width, r.height,
          b.tagName === 'A' ? b.href : ''];
})"""


def test_the_grid_renders_in_the_json_colours_without_errors(browser, built):
    since = open_page(browser, built / "index.html")
    data = check_data()
    expected = {(row["op"], k): c["status"] for row in data["ops"]
                for k, c in row["cells"].items()}
    seen = {}
    for op, col, status, word, colour, w, h, _ in browser.evaluate(CELLS_JS):
        assert w > 40 and h > 15, (op, col, w, h)  # laid out, not collapsed
        assert word == status == expected[op, col]
        assert colour == rgb(STATUS[status].colour), (op, col, status, colour)
        seen[op, col] = status
    assert seen == expected
    verdicts = browser.evaluate("""[...document.querySelectorAll('tr[data-op]')].map(tr =>
        [tr.dataset.op, getComputedStyle(tr.querySelector('td:last-child .badge'))
         .backgroundColor])""")
    assert verdicts == [[row["op"], rgb(STATUS[row["verdict"]].colour)] for row in data["ops"]]
    outside = browser.evaluate("""[...document.querySelectorAll('a[href], link[href]')]
        .map(e => e.href).filter(u => !u.startsWith('file:'))""")
    assert outside == []
    for href in browser.evaluate("[...document.querySelectorAll('a[href], link[href]')]"
                                 ".map(e => e.href)"):
        assert Path(unquote(urlparse(href).path)).is_file(), href
    assert browser.errors(since) == []


def test_every_red_cell_lands_on_its_failures(browser, built):
    """Follow each red cell's link in the browser: the page scrolls to a section of that op
    and column, listing exactly the check ids the JSON names for the cell."""
    data = check_data()
    red = {(row["op"], k): c["checks"] for row in data["ops"]
           for k, c in row["cells"].items() if c["status"] in ("FAIL", "error")}
    assert red  # the broken LayerNorm has red cells
    open_page(browser, built / "index.html")
    links = [(op, col, href) for op, col, status, *_, href in browser.evaluate(CELLS_JS)
             if href]
    assert {(op, col) for op, col, _ in links} == set(red)
    for i, (op, col, href) in enumerate(links):
        since = len(browser.events)
        browser.evaluate("window.scrollTo(0, 0); "
                         f"document.querySelectorAll('td.cell a.badge')[{i}].click()")
        landed = browser.evaluate("""(() => {
            const t = document.getElementById(decodeURIComponent(location.hash.slice(1)));
            if (!t) return null;
            return [location.href, t.dataset.op, t.dataset.col,
                    t.getBoundingClientRect().top, window.innerHeight, window.scrollY,
                    [...t.querySelectorAll('article')].map(a => a.dataset.check)];
        })()""")
        assert landed is not None, href
        url, t_op, t_col, top, height, scrolled, checks = landed
        assert url == href and (t_op, t_col) == (op, col) and checks == red[op, col], landed
        assert scrolled > 0 and 0 <= top < height - 100, f"{href}: not scrolled into view"
        assert browser.errors(since) == []


def test_screenshot(browser, built, tmp_path):
    shot = save_shot(browser, built / "index.html", "grid.png", tmp_path, 1100)
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == \
        (1280, 1100)
