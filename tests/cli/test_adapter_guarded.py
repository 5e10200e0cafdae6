"""``minibert adapter infer`` runs the user's module as ``minibert check`` does (issue 41): in a
child process under a time limit, what it prints captured and shown on stderr, one line of
reason for a hang, an exit, a crash or a raise, a non-zero status -- and only the adapter on
stdout, so that ``infer M > M_adapter.py`` on a module that prints writes a file that imports.
The module is tests/examples/hostile_anywhere.py, told where and how to misbehave by
``MINIBERT_HOSTILE``; the current directory is on the path, as for ``check``."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests import ROOT

HOSTILE = "tests.examples.hostile_anywhere"
TIMEOUT = 4  # seconds: the infer's limit in these tests (its import and inference take ~2 s)


def _env(hostile: str = "") -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "HYPOTHESIS"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if hostile:
        env["MINIBERT_HOSTILE"] = hostile
    return env


def minibert(*args, hostile: str = "", cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minibert_spec.cli", *args], cwd=cwd,
                          env=_env(hostile), capture_output=True, text=True, timeout=120)


# where:how -> what the one line of reason says
BAD = {
    "import:hang": f"importing '{HOSTILE}' did not finish within {TIMEOUT} s",
    "backward:busy": f"did not finish within {TIMEOUT} s",
    "construct:exit": "(its classes and functions run) raised SystemExit: 0",
    "import:exit": f"importing '{HOSTILE}' raised SystemExit: 0",
    "forward:os_exit": "ended the process with exit status 0 before it finished",
    "forward:crash": "killed the process (SIGKILL)",
    "forward:raise": "its forward raised RuntimeError: hostile_anywhere: raised in forward",
    "class:raise": "raised RuntimeError: hostile_anywhere: the metaclass refuses '__module__'",
}


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("hostile", sorted(BAD))
def test_infer_on_a_hostile_module_is_one_line_and_non_zero(hostile):
    start = time.monotonic()
    got = minibert("adapter", "infer", HOSTILE, "--timeout", str(TIMEOUT), hostile=hostile)
    assert time.monotonic() - start < TIMEOUT + 60, "no hang past the limit"
    assert got.returncode == 2, (got.returncode, got.stderr)
    assert got.stdout == "", "no adapter is written"
    errors = [line for line in got.stderr.splitlines() if line.startswith("minibert adapter:")]
    assert len(errors) == 1 and BAD[hostile] in errors[0], got.stderr
    assert "internal error" not in got.stderr and "Traceback" not in got.stderr


def test_infer_of_a_printing_module_writes_an_adapter_that_imports(tmp_path):
    """The module prints at import and in its forward: that goes to stderr; stdout, redirected
    to a file, is the adapter alone -- the file imports and adapts the ReLU."""
    got = minibert("adapter", "infer", HOSTILE, hostile="forward:print")
    assert got.returncode == 0, got.stderr
    assert "hostile_anywhere: printed in forward" in got.stderr
    assert "hostile_anywhere: printed" not in got.stdout
    (tmp_path / "hostile_adapter.py").write_text(got.stdout)
    code = ("import hostile_adapter as a, numpy as np; "
            "y, cache = a.relu_forward(np.array([-1.0, 2.0])); print(y.tolist())")
    env = _env("forward:print")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1] == "[0.0, 2.0]", ran.stdout


def test_a_leftover_thread_of_the_module_does_not_hang_infer():
    got = minibert("adapter", "infer", HOSTILE, hostile="forward:thread")
    assert got.returncode == 0, got.stderr
    assert "relu_forward, relu_backward = layer(" in got.stdout


def test_infer_and_new_find_a_module_in_the_current_directory(tmp_path):
    """As ``minibert check mybert`` does, run by the ``minibert`` script (whose sys.path does
    not hold the current directory)."""
    (tmp_path / "mybert_cwd.py").write_text(
        "import numpy as np\n\n\ndef relu_forward(x):\n    return np.maximum(x, 0), x\n\n\n"
        "def relu_backward(dout, x):\n    return (dout * (x > 0),)\n")
    script = ("import sys; from minibert_spec.cli import main; sys.path[:] = [p for p in "
              "sys.path if p not in ('', '.')]; sys.exit(main(sys.argv[1:]))")
    run = [sys.executable, "-c", script]
    inferred = subprocess.run([*run, "adapter", "infer", "mybert_cwd"], cwd=tmp_path,
                              env=_env(), capture_output=True, text=True, timeout=120)
    assert inferred.returncode == 0, inferred.stderr
    assert "backward=impl.relu_backward" in inferred.stdout
    new = subprocess.run([*run, "adapter", "new", "mybert_cwd", "-o", "mybert_cwd_adapter.py"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert new.returncode == 0 and "not found" not in new.stderr, new.stderr
    # a module found nowhere: the skeleton still, with a note naming it (the check can fail)
    missing = subprocess.run([*run, "adapter", "new", "no_such_mybert"], cwd=tmp_path,
                             env=_env(), capture_output=True, text=True, timeout=120)
    assert missing.returncode == 0, missing.stderr
    assert "module 'no_such_mybert' is not found from" in missing.stderr, missing.stderr


def test_the_adapter_new_skeleton_runs_with_every_row_uncommented(tmp_path):
    """Every ``# def name(signature):`` row of the skeleton, uncommented as the user would,
    imports: the names its signatures use (``np.float32``, adam_step's ``default_no_decay``)
    are imported by the skeleton itself."""
    import re

    from minibert_spec.cli.adapter import skeleton

    text = skeleton("mybert_rows")
    rows = re.sub(r"^# (def \w+\(.*\):)$\n^#     \.\.\.$", r"\1\n    ...", text, flags=re.M)
    assert rows.count("\ndef ") > 30, rows  # every protocol name's row
    (tmp_path / "mybert_rows.py").write_text("")
    (tmp_path / "rows_adapter.py").write_text(rows)
    env = _env()
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    ran = subprocess.run([sys.executable, "-c", "import rows_adapter; print(rows_adapter."
                          "adam_step.__defaults__ or rows_adapter.adam_step.__kwdefaults__)"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "default_no_decay" in ran.stdout, ran.stdout
