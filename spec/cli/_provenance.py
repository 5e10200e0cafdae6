"""Where a report came from: date, commit, machine and package versions.

One dict (``provenance()``), printed as one line (``provenance_line``) at the top of every
console report and stored under ``"provenance"`` in JSON / as a header in Markdown, so a
number can always be traced to the code and machine that produced it."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from importlib import metadata

from minibert_spec.paths import HOME

PACKAGES = ("numpy", "sympy", "torch", "hypothesis", "pytest", "tokenizers", "safetensors")
ROOT = str(HOME)


def git_commit(root: str = ROOT) -> str:
    """HEAD's short hash, '+dirty' when tracked files differ from it; 'unknown' without git."""
    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def package_versions(names=PACKAGES) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def provenance() -> dict:
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
                   f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": package_versions(),
    }


def provenance_line(p: dict | None = None) -> str:
    p = p or provenance()
    pk = ", ".join(f"{k} {v}" for k, v in p["packages"].items())
    return (f"{p['date']} | commit {p['commit']} | {p['machine']} | Python {p['python']} | "
            f"{pk}")
