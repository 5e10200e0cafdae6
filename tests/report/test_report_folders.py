"""Report folders: ``--format html`` needs ``-o`` (``minibert audit`` ran its whole audit, ~2
minutes, and exited 0 with no site; ``minibert check`` already refused), and a report folder
gets the mode ``mkdir`` would give it (it was 0700: a site nobody else could read)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("jinja2")

from minibert_spec.cli import main  # noqa: E402
from minibert_spec.report import Site  # noqa: E402


@pytest.mark.parametrize("command", ["audit", "check"])
def test_format_html_without_output_is_refused_before_any_work(command, capsys, monkeypatch):
    import minibert_spec.audit

    def no_audit(*args, **kwargs):
        raise AssertionError("the audit ran")

    monkeypatch.setattr(minibert_spec.audit, "run_audit", no_audit)
    argv = [command, "--format", "html"] + (["tests.examples.classy_adapter"]
                                            if command == "check" else ["--no-measure"])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--format html: expected -o DIR" in err[0], err


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_a_report_folder_gets_the_mode_mkdir_would_give(tmp_path, umask):
    old = os.umask(umask)
    try:
        with Site(tmp_path / "site", title="t", provenance=None, nav=[]) as site:
            site.write("index.html", "<p>hi</p>")
        os.mkdir(tmp_path / "plain")
    finally:
        os.umask(old)
    mode = (tmp_path / "site").stat().st_mode & 0o777
    assert mode == 0o777 & ~umask == (tmp_path / "plain").stat().st_mode & 0o777, oct(mode)
