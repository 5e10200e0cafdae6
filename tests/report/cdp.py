"""A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe``, for the browser
tests of the HTML reports.

Drives the system's Chromium (the Debian ``chromium`` package; ``$MINIBERT_CHROMIUM`` names
another binary) with no library and no port: Chromium reads JSON commands, each ended by a NUL
byte, from its file descriptor 3 and writes replies and events to descriptor 4.  Nothing is
downloaded and nothing listens on the network.  Flags: headless, no sandbox (CI runs as root),
and no background networking, component updates or sync -- the machine has no network and
Chromium would otherwise try to reach Google at every start.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--hide-scrollbars",
         "--mute-audio", "--remote-debugging-pipe")


def chromium_binary() -> str | None:
    """$MINIBERT_CHROMIUM, else chromium / chromium-browser on PATH, else None."""
    env = os.environ.get("MINIBERT_CHROMIUM")
    if env:
        return env
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _above_4(fd: int) -> int:
    """The same pipe end on a descriptor >= 10 (the original is closed), so the launcher's
    3<&N 4>&M cannot clobber it."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page (a flat session on a new target)."""

    def __init__(self, binary: str, *, width: int = 1280, height: int = 900,
                 timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="minibert-chromium-")
        cmd_r, self._cmd_w = os.pipe()  # we write commands, Chromium reads them on fd 3
        self._out_r, out_w = os.pipe()  # Chromium writes on fd 4, we read
        cmd_r, out_w = _above_4(cmd_r), _above_4(out_w)  # never 3 or 4 themselves
        launcher = f'exec "$0" "$@" 3<&{cmd_r} 4>&{out_w} {cmd_r}<&- {out_w}>&-'
        self.proc = subprocess.Popen(
            ["bash", "-c", launcher, binary, *FLAGS, f"--user-data-dir={self.profile}",
             "about:blank"],
            pass_fds=(cmd_r, out_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=None if os.environ.get("MINIBERT_CDP_DEBUG") else subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(out_w)
        self._next = 0
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.send("Target.attachToTarget",
                                     {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable", session=self.session)
            self.resize(width, height)
        except Exception:
            self.close()
            raise

    # ------------------------------------------------------------------ protocol
    def _read(self) -> None:
        buf = b""
        with os.fdopen(self._out_r, "rb", buffering=0) as f:
            while True:
                chunk = f.read(1 << 16)
                if not chunk:
                    break
                buf += chunk
                *messages, buf = buf.split(b"\0")
                with self._cv:
                    for raw in messages:
                        msg = json.loads(raw)
                        if "id" in msg:
                            self._replies[msg["id"]] = msg
                        else:
                            self.events.append(msg)
                    self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def send(self, method: str, params: dict | None = None, *, session: str | None = None):
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while self._next not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or not self._reader.is_alive():
                    raise CDPError(f"{method}: no reply from Chromium in {self.timeout} s "
                                   f"(alive: {self.proc.poll() is None})")
                self._cv.wait(min(left, 0.5))
            reply = self._replies.pop(self._next)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def wait_event(self, name: str, since: int) -> dict:
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while True:
                for ev in self.events[since:]:
                    if ev.get("method") == name:
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CDPError(f"no {name} event in {self.timeout} s")
                self._cv.wait(min(left, 0.5))

    # ------------------------------------------------------------------ page
    def goto(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        since = len(self.events)
        result = self.send("Page.navigate", {"url": url}, session=self.session)
        if result.get("errorText"):
            raise CDPError(f"navigate {url}: {result['errorText']}")
        self.wait_event("Page.loadEventFired", since)

    def resize(self, width: int, height: int) -> None:
        """The viewport's size in CSS pixels (what a screenshot captures)."""
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                  session=self.session)

    def evaluate(self, expression: str):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                      session=self.session)
        if "exceptionDetails" in r:
            raise CDPError(f"evaluate: {r['exceptionDetails']}")
        return r["result"].get("value")

    def errors(self, since: int = 0) -> list[str]:
        """Console errors, uncaught exceptions and failed loads seen since event ``since``."""
        out = []
        for ev in self.events[since:]:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails'].get('text')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + " ".join(str(a.get("value", a.get(
                    "description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return out

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"}, session=self.session)
        Path(path).write_bytes(base64.b64decode(data["data"]))

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    os.write(self._cmd_w, json.dumps({"id": 10 ** 9, "method": "Browser.close",
                                                      "params": {}}).encode() + b"\0")
                except OSError:
                    pass
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
        finally:
            try:
                os.close(self._cmd_w)
            except OSError:
                pass
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------- for the tests
def rgb(colour: str) -> str:
    """'#15803d' -> 'rgb(21, 128, 61)', as getComputedStyle reports it."""
    c = colour.lstrip("#")
    return "rgb({}, {}, {})".format(*(int(c[i:i + 2], 16) for i in (0, 2, 4)))


@contextmanager
def open_browser(what: str, *, width: int = 1280, height: int = 900):
    """A Browser for a test module's fixture; skips when no Chromium is installed -- and
    fails instead under CI (``$CI`` set), where .ci/run installs it, so CI can never pass
    without running ``what``."""
    import pytest

    binary = chromium_binary()
    if binary is None:
        reason = ("no chromium on PATH (apt-get install chromium, or set MINIBERT_CHROMIUM): "
                  f"{what} did not run")
        if os.environ.get("CI"):
            pytest.fail(reason + " -- and CI must run them (.ci/run installs chromium)")
        pytest.skip(reason)
    with Browser(binary, width=width, height=height) as b:
        yield b


def site_fixtures(what: str, build):
    """A browser test module's two module-scoped fixtures, assigned as
    ``browser, built = site_fixtures(what, build)``: ``browser`` (:func:`open_browser` for
    ``what``) and ``built`` (the folder ``build(folder)`` returns, given the session's
    temporary folder)."""
    import pytest

    @pytest.fixture(scope="module")
    def browser():
        with open_browser(what) as b:
            yield b

    @pytest.fixture(scope="module")
    def built(tmp_path_factory):
        return build(tmp_path_factory.getbasetemp())

    return browser, built


def open_page(b: Browser, page: Path) -> int:
    """Load a file of a report; returns the event index to read its errors from."""
    since = len(b.events)
    b.goto(page.resolve().as_uri())
    return since


def save_shot(browser: Browser, page: Path, name: str, folder: Path,
              height: int = 900) -> Path:
    """A screenshot of ``page`` at 1280 x ``height`` into ``folder``, and a small copy into
    ``$MINIBERT_SCREENSHOTS`` when set (how docs/*/*.png are made)."""
    browser.resize(1280, height)
    try:
        open_page(browser, page)
        path = folder / name
        browser.screenshot(path)
    finally:
        browser.resize(1280, 900)
    target = os.environ.get("MINIBERT_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        try:
            small_png(path, Path(target) / name)
        except ImportError:
            shutil.copy(path, Path(target) / name)
    return path


def small_png(src: Path, dest: Path) -> None:
    """A palette PNG (a third of the size, text still crisp) whose palette holds every status
    colour exactly (a plain median cut turned the amber of 'refuted' into pink)."""
    from PIL import Image

    from minibert_spec.report import STATUS

    colours = list(dict.fromkeys(st.colour for st in STATUS.values()))
    img = Image.open(src).convert("RGB")
    rest = img.quantize(colors=256 - len(colours), method=Image.Quantize.FASTOCTREE)
    exact = [int(c[i:i + 2], 16) for c in colours for i in (1, 3, 5)]
    palette = Image.new("P", (1, 1))
    palette.putpalette(exact + rest.getpalette()[:3 * (256 - len(colours))])
    img.quantize(palette=palette, dither=Image.Dither.NONE).save(dest, optimize=True)
