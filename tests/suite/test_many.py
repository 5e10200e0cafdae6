"""``minibert check --many`` (issue 31): 20 submissions generated from a few templates
(tests/suite/many_submissions.py: correct, buggy, hanging, crashing, mixed, not importable), one
class table; one submission of each template on a Dask ``LocalCluster`` of 2 workers gets the
serial table's rows; a hanging or crashing submission is red and no other row changes.  (Wall
times: tests/benchmarks/many_time.py; never asserted here.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from minibert_spec.suite.many import find_submissions, table_signature
from tests import ROOT
from tests.suite.many_submissions import ARGS, EXPECTED, write_class


def many(where, out, *extra):
    r = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", "--many", str(where),
                        *ARGS,
                        "--format", "json", "-o", str(out), *extra], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.exists(), r.stderr[-3000:]
    return r, json.loads(out.read_text())


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("class")
    names = write_class(tmp / "subs")
    serial = many(tmp / "subs", tmp / "serial.json")
    # the cluster judges one submission of each template (and the package): the same files,
    # so their rows must be the serial table's rows (20 whole runs again added nothing)
    first = {}
    for name, template in names.items():
        first.setdefault(template, name)
    first["package"] = next(n for n in names if not n.endswith(".py"))
    (tmp / "one_each").mkdir()
    for name in first.values():
        src = tmp / "subs" / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp / "one_each" / name)
    cluster = many(tmp / "one_each", tmp / "cluster.json", "--cluster", "local:2")
    return names, serial, cluster


@pytest.mark.slow  # the slow tier (conftest.py): 20 whole runs, serial and on a cluster
def test_every_submission_gets_its_templates_verdict(tables):
    names, (r, table), _ = tables
    rows = {i["name"]: i for i in table["implementations"]}
    assert sorted(rows) == sorted(names)
    for name, template in names.items():
        row, want = rows[name], EXPECTED[template]
        if want is None:  # could not be checked: red with a reason, never a pass
            assert row["exit_code"] == 2 and row["verdicts"] == {}, row
            assert row["load_error"] and row["summary"].startswith("could not run"), row
        else:
            assert row["verdicts"] == want, (name, template, row["summary"], row["failed"])
            assert row["exit_code"] == (0 if set(want.values()) == {"ok"} else 1), row
    assert table["ops"] == ["layernorm", "softmax"]
    assert r.returncode == table["exit_code"] == 1


@pytest.mark.slow  # the slow tier (conftest.py): the same fixture
def test_the_table_on_a_local_dask_cluster_is_the_serial_table(tables):
    names, (_, serial), (r, cluster) = tables
    judged = {i["name"] for i in cluster["implementations"]}
    assert {names[n] for n in judged} == set(EXPECTED) and len(judged) == len(EXPECTED) + 1
    assert table_signature(cluster) == \
        table_signature({"implementations": [i for i in serial["implementations"]
                                             if i["name"] in judged]})
    assert r.returncode == 1


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_the_html_table_draws_the_json(tmp_path):
    write_class(tmp_path / "subs", ["correct", "buggy", "import_exit"])
    r = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", "--many",
                        str(tmp_path / "subs" / "*.py"), *ARGS, "--format", "html", "-o",
                        str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    data = json.loads((tmp_path / "site" / "many.json").read_text())
    page = (tmp_path / "site" / "index.html").read_text()
    for i in data["implementations"]:
        assert f'data-impl="{i["name"]}" data-exit="{i["exit_code"]}"' in page
    assert 'data-op="layernorm" data-status="FAIL"' in page


def test_submissions_are_found_named_and_isolated(tmp_path):
    write_class(tmp_path / "a", ["correct", "correct"])
    (tmp_path / "a" / "my-bert.py").write_text("x = 1\n")
    (tmp_path / "a" / "test_helpers.py").write_text("x = 1\n")  # not a submission
    subs = {s["name"]: s for s in find_submissions(str(tmp_path / "a"))}
    assert sorted(subs) == ["my-bert.py", "student_00.py", "team_01"]
    assert subs["my-bert.py"]["module"] == "sub_my_bert"  # importable whatever the file name
    assert list(subs["team_01"]["files"]) == ["team_01/__init__.py"]
    # one file name per student folder: the folder tells them apart
    for who in ("ann", "bob"):
        (tmp_path / "b" / who).mkdir(parents=True)
        (tmp_path / "b" / who / "mybert.py").write_text("x = 1\n")
    names = [s["name"] for s in find_submissions(str(tmp_path / "b" / "*" / "mybert.py"))]
    assert names == ["ann/mybert.py", "bob/mybert.py"]
    with pytest.raises(ValueError, match="--many .*found none"):
        find_submissions(str(tmp_path / "empty*"))


def test_every_entry_not_checked_is_named_with_its_reason(tmp_path):
    """Issue 41: a folder without __init__.py, a .PY or .py.txt file, a test file, a README were
    left out of the class table and nothing named them: a grader would miss a student."""
    from minibert_spec.suite.many import survey

    (tmp_path / "ann.py").write_text("x = 1\n")
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "mybert.py").write_text("x = 1\n")  # no __init__.py
    (tmp_path / "cat.PY").write_text("x = 1\n")
    (tmp_path / "dan.py.txt").write_text("x = 1\n")
    (tmp_path / "test_ann.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("the class\n")
    subs, skipped = survey(str(tmp_path))
    assert [s["name"] for s in subs] == ["ann.py"]
    reasons = {e["name"]: e["reason"] for e in skipped}
    assert sorted(reasons) == ["README.md", "bob", "cat.PY", "dan.py.txt", "test_ann.py"]
    assert "folder without __init__.py" in reasons["bob"]
    assert "'.PY'" in reasons["cat.PY"] and "'.py.txt'" in reasons["dan.py.txt"]
    assert "test_*" in reasons["test_ann.py"]
    # a glob's matches that are not submissions are named too
    subs, skipped = survey(str(tmp_path / "[a-c]*"))
    assert [s["name"] for s in subs] == ["ann.py"]
    assert sorted(e["name"].rsplit("/", 1)[-1] for e in skipped) == ["bob", "cat.PY"]
    # with no submission at all, the refusal names what it found
    with pytest.raises(ValueError, match=r"found none \(not checked: .*folder without"):
        survey(str(tmp_path / "bob*"))


def test_a_submission_too_large_is_its_own_red_row_not_a_refusal_of_the_class(tmp_path,
                                                                               monkeypatch):
    from minibert_spec.suite import many as m

    monkeypatch.setattr(m, "MAX_SUBMISSION_BYTES", 100)
    (tmp_path / "small.py").write_text("x = 1\n")
    (tmp_path / "large.py").write_text("x = 1\n" + "#" * 200)
    subs = {s["name"]: s for s in m.find_submissions(str(tmp_path))}
    assert sorted(subs) == ["large.py", "small.py"]
    assert "hold 206 bytes; expected at most 100" in subs["large.py"]["refused"]
    row = m.check_submission(subs["large.py"], [], timeout=60)
    assert row["exit_code"] == 2 and "expected at most 100" in row["reason"], row
    table = m.class_table([row], [{"name": "x.PY", "reason": "not a .py file"}])
    assert table["exit_code"] == 2 and table["skipped"][0]["name"] == "x.PY"
    assert "could not run" in table["implementations"][0]["summary"]
    from minibert_spec.report.many import write_many_site

    write_many_site(table, tmp_path / "site")
    assert 'data-skipped="x.PY"' in (tmp_path / "site" / "index.html").read_text()


@pytest.mark.slow  # a --many run: a minibert check process per submission
def test_minibert_check_many_prints_the_entries_not_checked(tmp_path):
    """The command line: each entry not checked on stderr and in the JSON table."""
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "nothing.py").write_text("SOMETHING = 1\n")  # provides nothing: exit 2
    (tmp_path / "subs" / "eve.PY").write_text("x = 1\n")
    out = tmp_path / "many.json"
    r = subprocess.run([sys.executable, "-m", "minibert_spec.cli", "check", "--many",
                        str(tmp_path / "subs"), "--oracle", "off", "--quick", "--ops", "relu",
                        "--kinds", "fd", "--format", "json", "-o", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "not checked: eve.PY: not a .py file" in r.stderr, r.stderr[-3000:]
    table = json.loads(out.read_text())
    assert [e["name"] for e in table["skipped"]] == ["eve.PY"]
    assert r.returncode == 2, r.stderr[-3000:]
