"""Issue 41: the entry points' arguments validated before anything runs, each refusal one line
naming the flag and the value, exit 2 -- ``--database``/``--replay`` onto a path that cannot
hold a database (a run that could not save its failures read as one that had)."""

from __future__ import annotations

import pytest

from minibert_spec.cli import main

IMPL = "tests.examples.classy_adapter"


def _refused(capsys, rc) -> str:
    cap = capsys.readouterr()
    assert rc == 2, cap
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cap.err, cap.err
    return lines[0]


def _database_cases(tmp_path) -> dict:
    (tmp_path / "afile").write_text("x")
    return {"a regular file": (str(tmp_path / "afile"), "is a file, not a directory"),
            "a path under a file": (str(tmp_path / "afile" / "db"), "which is a file"),
            # exists, but nothing can be written there (root included)
            "an unwritable directory": ("/proc", "cannot be written")}


@pytest.mark.parametrize("case", ["a regular file", "a path under a file",
                                  "an unwritable directory"])
@pytest.mark.parametrize("many", [False, True], ids=["check", "many"])
def test_database_that_cannot_be_written_is_refused_naming_it(case, many, tmp_path, capsys):
    path, said = _database_cases(tmp_path)[case]
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "one.py").write_text("x = 1\n")
    target = ["--many", str(tmp_path / "subs")] if many else [IMPL]
    line = _refused(capsys, main(["check", *target, "--oracle", "off", "--database", path]))
    assert f"--database {path}" in line and said in line, line


@pytest.mark.parametrize("case", ["a regular file", "a path under a file"])
def test_replay_of_a_file_is_refused_naming_it(case, tmp_path, capsys):
    path, said = _database_cases(tmp_path)[case]
    line = _refused(capsys, main(["check", IMPL, "--oracle", "off", "--replay", path]))
    assert f"--replay {path}" in line and said in line, line


def test_a_database_folder_that_can_be_written_is_taken(tmp_path):
    from argparse import Namespace

    from minibert_spec.cli._output import databases_refused

    db = tmp_path / "new" / "db"
    assert databases_refused(Namespace(database=str(db), replay=[str(tmp_path / "none")])) \
        is None
    assert db.is_dir() and list(db.iterdir()) == []  # created, the write test removed


@pytest.mark.parametrize("value", ["local:-1", "local: 2", "local:abc", "local:0", "localhost:x",
                                   "tcp://host:port", "two words"])
def test_a_cluster_value_dask_cannot_take_is_refused_at_once(value, tmp_path, capsys):
    """``local:-1`` and ``local: 2`` were taken as a scheduler's address (a 30 s time-out),
    ``local:abc`` said "invalid literal for int()" without the flag."""
    (tmp_path / "one.py").write_text("x = 1\n")
    line = _refused(capsys, main(["check", "--many", str(tmp_path), "--cluster", value]))
    assert line.startswith("minibert check: --cluster: expected local, local:N") and \
        repr(value) in line, line


def test_the_cluster_forms_dask_takes_are_taken():
    from minibert_spec.suite.many import parse_cluster

    assert parse_cluster("local:3") == 3 and parse_cluster("local") >= 1
    for address in ("tcp://10.0.0.5:8786", "scheduler:8786", "tls://sched.example.org:8786",
                    "127.0.0.1"):
        assert parse_cluster(address) is None, address


def test_train_threads_are_bounded_by_the_cores(tmp_path, capsys):
    from minibert_reference.train.threads import available_cores

    cores = available_cores()
    rc = main(["train", "--run-dir", str(tmp_path / "r"), "--threads", "100000", "--steps", "1",
               "--warmup", "1", "--no-progress"])
    line = _refused(capsys, rc)
    assert f"--threads: expected 'auto' or an integer in [1, {cores}]" in line, line
    assert "'100000'" in line and not (tmp_path / "r").exists()


@pytest.mark.parametrize("verdict", [False, True], ids=["bench", "bench --verdict"])
def test_bench_output_that_cannot_be_written_is_refused_before_measuring(verdict, tmp_path,
                                                                         capsys):
    """``-o .`` lost the timings after the whole measurement (17 s and more)."""
    (tmp_path / "afile").write_text("x")
    for output, said in ((str(tmp_path), "is a directory"),
                         (str(tmp_path / "afile" / "t.json"), "which is a file")):
        rc = main(["bench", *(["--verdict", IMPL] if verdict else []), "-o", output])
        line = _refused(capsys, rc)
        assert f"-o {output}: " in line and said in line, line


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("impl", ["tests.examples.hostile_import_exit0",
                                  "tests.examples.hostile_nothing"])
def test_bench_verdict_refuses_what_cannot_be_checked_before_timing_it(impl, capsys):
    rc = main(["bench", "--verdict", impl, "--rounds", "1"])
    cap = capsys.readouterr()
    assert rc == 2, cap
    assert f"--verdict {impl}: cannot be checked, nothing timed" in cap.err, cap.err
    assert "round 1/1" not in cap.err, cap.err  # nothing was timed
