"""Many implementations at once: ``minibert check --many DIR_OR_GLOB [--cluster ADDRESS]``.

Who needs it: a course checking every submission of a hand-written-backprop assignment, a team
checking every branch.  Each submission (one module, or one package) is checked by its own
``minibert check`` process, in a fresh temporary directory holding a copy of its files alone:
whatever it does -- crash, hang, exit at import, write files, print -- touches no other
submission, and its row is red with the reason (never a pass).  The rows make one class table,
implementation x op (each cell the op's verdict), in JSON and HTML.

The same function checks one submission whether it runs here, in a loop, or on a Dask worker
(``client.map``): ``--cluster ADDRESS`` sends the submissions to a Dask scheduler (the
``cluster`` extra: ``dask[distributed]``), ``--cluster local[:N]`` starts a ``LocalCluster`` of
N single-threaded worker processes on this machine, through the same code path.  A task carries
the submission's files (the workers need no shared file system, only minibert-spec of the same
version: a worker with another version makes that row red), and every check's examples come
from seeds derived from its id: the table is the same whatever the number of workers.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

SCHEMA = "minibert-many/1"
MAX_SUBMISSION_BYTES = 16 * 2**20  # a submission's files, all together
SLACK_SECONDS = 180.0  # beyond the run's --total-timeout before a submission's process is killed
_SKIP = re.compile(r"^(_|test_|conftest\.py$|setup\.py$)")


def find_submissions(where: str) -> list[dict]:
    """The submissions under ``where`` (:func:`survey`'s first half)."""
    return survey(where)[0]


def survey(where: str) -> tuple[list[dict], list[dict]]:
    """(the submissions, the entries not checked) under ``where``: a directory (each ``*.py``
    module and each package directly inside it) or a glob (each matching module file or
    package directory).  Each submission is ``{"name": what the table shows, "module": the
    module the check imports, "files": {path: bytes}}``, plus ``"refused"``, the one-line
    reason, for one too large to check (a red row of its own, never a refusal of the class); a
    single-file submission is imported under a name of its own (``sub_<stem>``: a file named
    ``random.py`` or ``my-bert.py`` is checked too).  Every other entry of the directory (or
    match of the glob) is ``{"name", "reason"}`` in the second list: a folder without
    ``__init__.py``, a ``.PY`` or ``.py.txt`` file, a test file -- named, so that no submission
    is left out unsaid.  A ValueError naming ``--many`` when no submission is found."""
    base = Path(where)
    entries = sorted(base.iterdir()) if base.is_dir() else \
        sorted(Path(p) for p in glob.glob(where, recursive=True))
    paths, skipped = [], []
    for p in entries:
        reason = _not_a_submission(p, named=base.is_dir())
        if reason is None:
            paths.append(p)
        else:
            skipped.append({"name": str(p.relative_to(base)) if base.is_dir() else str(p),
                            "reason": reason})
    if not paths:
        said = "; ".join(f"{e['name']}: {e['reason']}" for e in skipped[:3])
        raise ValueError(f"--many {where}: expected a directory of submissions (one module or "
                         "package each) or a glob matching them, found none"
                         + (f" (not checked: {said}"
                            + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
                            + ")" if said else ""))
    names = _names(paths)
    out = []
    for p, name in zip(paths, names):
        if p.is_dir():
            files = {f.relative_to(p.parent).as_posix(): f for f in sorted(p.rglob("*"))
                     if f.is_file() and "__pycache__" not in f.parts}
            module = p.name if p.name.isidentifier() else None
        else:
            files = {f"sub_{_slug(p.stem)}.py": p}
            module = f"sub_{_slug(p.stem)}"
        size = sum(f.stat().st_size for f in files.values())
        if size > MAX_SUBMISSION_BYTES:
            out.append({"name": name, "module": module, "files": {},
                        "refused": f"{name}: its files hold {size} bytes; expected at most "
                                   f"{MAX_SUBMISSION_BYTES} (not checked)"})
            continue
        out.append({"name": name, "module": module,
                    "files": {k: f.read_bytes() for k, f in files.items()}})
    return out, skipped


def _not_a_submission(p: Path, *, named: bool) -> str | None:
    """Why the entry ``p`` is not checked (None: it is a submission); ``named``: an entry of
    the directory given (a glob's matches were chosen by the user: no name is left out)."""
    if p.name == "__pycache__" or p.name.startswith("."):
        return "hidden, or Python's bytecode cache"
    if p.is_dir():
        if (p / "__init__.py").is_file():
            return None
        return "a folder without __init__.py (not a package: make it one, or give its module)"
    if not p.is_file():
        return "not a regular file or folder"
    if p.suffix != ".py":
        return (f"not a .py file (ends in {''.join(p.suffixes) or 'no suffix'!r}: rename it "
                "NAME.py to check it)")
    if named and _SKIP.match(p.name):
        return "a helper by its name (_*, test_*, conftest.py, setup.py)"
    return None


def _slug(text: str) -> str:
    return re.sub(r"\W+", "_", text).strip("_") or "submission"


def _names(paths: Sequence[Path]) -> list[str]:
    """The shortest path suffixes that tell the submissions apart (``alice.py``, or
    ``alice/mybert.py`` when every student's file has one name)."""
    parts = [p.resolve().parts for p in paths]
    for depth in range(1, max(len(x) for x in parts) + 1):
        names = ["/".join(x[-depth:]) for x in parts]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]


def check_submission(submission: dict, argv: Sequence[str], *, timeout: float,
                     version: str | None = None) -> dict:
    """One submission checked by ``minibert check`` in a process of its own, in a fresh
    directory holding its files alone: ``{"name", "exit_code", "report" (the JSON report, or
    None), "reason" (one line when there is no report), "seconds", "version"}``.  The process
    (and everything it started) is killed after ``timeout`` seconds.  ``version``: the
    minibert-spec version the caller runs (a worker running another refuses the task).  Never
    raises for anything the submission does."""
    start = time.monotonic()
    here = _version()
    row = {"name": submission["name"], "exit_code": 2, "report": None, "reason": "",
           "seconds": 0.0, "version": here}
    if version is not None and version != here:
        row["reason"] = (f"the worker runs minibert-spec {here}, the caller {version}: "
                         "install one version everywhere")
        return row
    if submission.get("refused"):
        row["reason"] = submission["refused"]
        return row
    if submission.get("module") is None:
        row["reason"] = f"{submission['name']}: not an importable package name"
        return row
    with tempfile.TemporaryDirectory(prefix="minibert-many-") as tmp:
        root = Path(tmp) / "submission"
        for rel, data in submission["files"].items():
            target = (root / rel).resolve()
            if root.resolve() not in target.parents:
                row["reason"] = f"{submission['name']}: a file outside its folder ({rel!r})"
                return row
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "minibert_spec.cli", "check", submission["module"], *argv,
               "--format", "json", "-o", str(out)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            row.update(reason=f"minibert check did not finish within {timeout:g} s: killed",
                       seconds=round(time.monotonic() - start, 2))
            return row
        finally:
            _kill_group(proc)  # anything the run left behind in its session
        row["exit_code"] = proc.returncode
        try:
            row["report"] = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            lines = [x for x in err.decode("utf-8", "replace").splitlines() if x.strip()]
            row["reason"] = (_reason(lines[-1]) if lines else
                             f"minibert check ended with status {proc.returncode} and no "
                             "report")
            if proc.returncode == 0:  # no report is never a pass
                row["exit_code"] = 2
    row["seconds"] = round(time.monotonic() - start, 2)
    return row


def _reason(line: str) -> str:
    """minibert check's one line without its prefixes ("minibert check: could not run: ")."""
    line = line.strip().removeprefix("minibert check:").strip()
    return line.removeprefix("could not run:").strip()[:300]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("minibert-spec")
    except metadata.PackageNotFoundError:
        return "unknown"


def run_many(submissions: Sequence[dict], argv: Sequence[str], *, timeout: float,
             cluster: str | None = None,
             on_row: Callable[[dict], object] | None = None) -> list[dict]:
    """Every submission through :func:`check_submission`: here, one after the other, or on a
    Dask cluster (``cluster``: a scheduler address, or ``local``/``local:N`` for a
    ``LocalCluster`` of N workers here); the rows in the submissions' order either way."""
    if cluster is None:
        rows = []
        for s in submissions:
            rows.append(check_submission(s, argv, timeout=timeout))
            if on_row is not None:
                on_row(rows[-1])
        return rows
    with _client(cluster) as client:
        futures = client.map(check_submission, list(submissions), argv=list(argv),
                             timeout=timeout, version=_version(), pure=False,
                             key=[f"minibert-check-{i}" for i in range(len(submissions))])
        from dask.distributed import wait

        rows = {}
        for i, (s, f) in enumerate(zip(submissions, futures)):
            wait(f)
            try:
                rows[i] = f.result()
            except Exception as e:  # noqa: BLE001 -- a worker lost (killed, out of memory)
                rows[i] = {"name": s["name"], "exit_code": 2, "report": None,
                           "reason": f"its Dask task failed: {type(e).__name__}: {e}"[:300],
                           "seconds": 0.0, "version": None}
            if on_row is not None:
                on_row(rows[i])
        return [rows[i] for i in range(len(submissions))]


CLUSTER_FORMS = ("local, local:N (N workers, a positive integer) or a Dask scheduler's address "
                 "(tcp://HOST:PORT, HOST:PORT)")


def parse_cluster(value: str) -> int | None:
    """``--cluster``'s value: the number of workers of a ``LocalCluster`` to start here
    (``local``: one per core, ``local:N``), or None for a scheduler's address; a ValueError
    naming the flag for anything else (``local:-1``, ``local: 2``, ``local:abc``, a port that
    is not a number), said at once rather than after Dask's 30 s of trying to connect."""
    m = re.fullmatch(r"local(?::(\d+))?", value)
    if m:
        n = int(m.group(1)) if m.group(1) else os.cpu_count() or 1
        if n >= 1:
            return n
    elif not value.startswith("local") and \
            re.fullmatch(r"(?:[a-z][a-z0-9+.-]*://)?[A-Za-z0-9_.\-\[\]]+(?::\d{1,5})?", value):
        return None
    raise ValueError(f"--cluster: expected {CLUSTER_FORMS}, got {value!r}")


class _client:
    """A Dask client of the cluster at ``address``, or of a ``LocalCluster`` started here
    (``local`` or ``local:N``: N single-threaded worker processes), closed on exit."""

    def __init__(self, address: str):
        self.address, self.cluster, self.client = address, None, None

    def __enter__(self):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise ValueError("--cluster needs Dask: pip install 'minibert-spec[cluster]' "
                             "(dask[distributed])") from None
        n = parse_cluster(self.address)
        if n is not None:
            # each check runs in processes of its own: a task only waits on one
            self.cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                        dashboard_address=None, host="127.0.0.1")
            self.client = Client(self.cluster)
        else:
            self.client = Client(self.address, timeout="30s")
        return self.client

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()


def class_table(rows: Sequence[dict], skipped: Sequence[dict] = ()) -> dict:
    """The class table (JSON): the ops in the op table's order (then declared ops), and per
    implementation its exit status, one-line summary, each op's verdict, its failed checks and
    run notes; ``skipped``, the entries not checked with their reasons (:func:`survey`)."""
    from minibert_spec.suite.report import in_table_order

    seen = [op["op"] for r in rows if r["report"] for op in r["report"].get("ops", [])]
    impls = []
    for r in rows:
        rep = r["report"] or {}
        verdicts = {op["op"]: op["verdict"] for op in rep.get("ops", [])}
        failed = [{"id": x["id"], "ops": list(x["ops"]),
                   "message": (x["message"].strip().splitlines() or [""])[0]}
                  for x in rep.get("results", []) if x["outcome"] in ("failed", "xpassed")]
        summary = rep.get("summary") or f"could not run: {r['reason']}"
        impls.append({"name": r["name"], "exit_code": r["exit_code"], "summary": summary,
                      "verdicts": verdicts, "failed": failed, "notes": rep.get("notes", []),
                      "load_error": rep.get("load_error") or (None if rep else r["reason"]),
                      "seconds": r["seconds"]})
    codes = [i["exit_code"] for i in impls]
    exit_code = 0 if all(c == 0 for c in codes) else 1 if 1 in codes else 2
    return {"schema": SCHEMA, "exit_code": exit_code,
            "ops": in_table_order(seen), "implementations": impls,
            "skipped": [dict(e) for e in skipped]}


def table_signature(table: dict) -> list:
    """What two runs of one class must agree on (timings aside): per implementation its exit
    status, summary, verdicts and failed check ids."""
    return [(i["name"], i["exit_code"], i["summary"], sorted(i["verdicts"].items()),
             [f["id"] for f in i["failed"]]) for i in table["implementations"]]
