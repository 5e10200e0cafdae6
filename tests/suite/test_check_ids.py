"""One name per check (issue 27): every id follows the registry's one grammar, a renamed id keeps
working for one release -- in ``expected_failed_checks``, ``ids=``, ``minibert check -k`` and
``pytest -k`` -- with a DeprecationWarning naming the new id, and ``minibert check --list``
says where each check is defined."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import minibert_reference
from minibert_spec.cli import main as minibert
from minibert_spec.suite import check_implementation, parametrize_with_checks
from minibert_spec.suite.registry import _ID, ALIASES, all_checks, check, renamed, select
from tests import ROOT

OLD, NEW = "invariant[zero_upstream-layernorm]", "invariant[layernorm.zero_upstream]"


def test_every_id_follows_the_grammar():
    for c in all_checks():
        m = _ID.match(c.id)
        assert m and m["kind"] == c.kind, c.id
    assert ALIASES[OLD] == NEW
    assert all(new in {c.id for c in all_checks()} for new in ALIASES.values())
    assert not set(ALIASES) & {c.id for c in all_checks()}  # an old name is no current one


@pytest.mark.parametrize("bad", ["bad_input[layernorm_gamma_shape]",  # no such subject
                                 "invariant[zero_upstream-layernorm]",  # property first
                                 "bad_input[ce_mean,_nothing_predicted]",  # not the grammar
                                 "fd[Layernorm]"])
def test_an_id_outside_the_grammar_is_refused_at_registration(bad):
    kind, rest = bad.split("[", 1)
    with pytest.raises(ValueError, match="malformed id|subject"):
        check(kind, rest[:-1])(lambda impl: None)


def test_an_old_id_selects_its_check_and_warns_naming_the_new_one():
    with pytest.warns(DeprecationWarning, match=r"invariant\[layernorm\.zero_upstream\]"):
        assert renamed(OLD) == NEW
    with pytest.warns(DeprecationWarning, match="is now"):
        assert [c.id for c in select(ids=[OLD])] == [NEW]
    with pytest.warns(DeprecationWarning, match="is now"):  # a pattern naming only old ids
        assert [c.id for c in select(match=r"^invariant\[zero_upstream-layernorm\]$")] == [NEW]
    assert renamed(NEW) == NEW


def test_expected_failed_checks_under_an_old_name_still_xfail():
    class Broken:
        """A layernorm whose backward ignores a zero upstream gradient."""

        layernorm_forward = staticmethod(minibert_reference.layernorm_forward)

        @staticmethod
        def layernorm_backward(dy, cache):
            dx, dg, db = minibert_reference.layernorm_backward(dy, cache)
            return dx + 1.0, dg, db

    with pytest.warns(DeprecationWarning, match=r"invariant\[layernorm\.zero_upstream\]"):
        report = check_implementation(Broken(), ids=[NEW], quick=True,
                                      expected_failed_checks={OLD: "known"})
    assert [(r.id, r.outcome) for r in report.results] == [(NEW, "xfailed")]
    with pytest.warns(DeprecationWarning, match="is now"):
        mark = parametrize_with_checks(minibert_reference, {OLD: "known"}, ids=[NEW], quick=True)
    (provides, param) = mark.args[1]
    assert param.id == NEW and any(m.name == "xfail" for m in param.marks)


def test_minibert_check_k_with_an_old_id(capsys):
    assert minibert(["check", "--list", "-k", r"^invariant\[zero_upstream-layernorm\]$"]) == 0
    out, err = capsys.readouterr()
    assert [line.split("\t")[0] for line in out.splitlines()] == [NEW]
    assert f"deprecated: check id {OLD!r} is now {NEW!r}" in err


def test_minibert_check_list_names_the_defining_file_and_line(capsys):
    assert minibert(["check", "--list", "-k", r"^fd\[linear_bias\]$"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    check_id, kind, ops, where = line.split("\t")
    file, lineno = where.rsplit(":", 1)
    source = (ROOT / file).read_text().splitlines()
    assert (check_id, kind, ops) == ("fd[linear_bias]", "fd", "linear")
    assert source[int(lineno) - 1].startswith("def backward_matches_finite_differences(")


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_pytest_k_with_an_old_id_selects_the_renamed_check(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MINIBERT_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--minibert-impl=reference", "--minibert-oracle=off", "--minibert-quick", "-rA",
         "-W", "always::DeprecationWarning", "-k", "zero_upstream-layernorm_plain"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout and "invariant[layernorm_plain.zero_upstream]" in proc.stdout
    assert "names a former check id" in proc.stdout
