"""``minibert check --many`` (issue 31): 20 submissions generated from a few templates
(tests/suite/many_submissions.py: correct, buggy, hanging, crashing, mixed, not importable), one
class table; the same table serially and on a Dask ``LocalCluster`` of 2 workers; a hanging or
crashing submission is red and no other row changes.  (Wall times: tests/benchmarks/
many_time.py; never asserted here.)"""

from __future__ import annotations

import json
import os
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
    cluster = many(tmp / "subs", tmp / "cluster.json", "--cluster", "local:2")
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
    _, (_, serial), (r, cluster) = tables
    assert table_signature(cluster) == table_signature(serial)
    assert r.returncode == 1


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
