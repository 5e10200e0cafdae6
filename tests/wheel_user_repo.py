"""The product as a user gets it: the wheel, installed into fresh virtual environments in a
temporary directory outside the checkout, used from a small repository of the user's own.

    python tests/wheel_user_repo.py            # (.ci/run runs it after the test command)

The user repository holds ``mybert_fixed.py`` (linear, ReLU, LayerNorm written the way a user
writes them) and ``mybert_buggy.py`` (the same with LayerNorm's gamma pulled outside the feature
means), the ten-line test file of the README and a ``pyproject.toml`` of its own.  Checked:

* with the ``oracle`` extra: ``pytest`` on the ten-line file is red on the buggy module naming
  only LayerNorm's checks and green on the fixed one; ``minibert check`` exits 1 / 0 on them,
  and its failed check ids are exactly pytest's; the plugin changes nothing in a session that
  does not use it (same collection, no option of its own in effect) and loads nothing there:
  ``sys.modules`` of that session with the plugin enabled and with ``-p no:minibert`` differ
  by the plugin's own module alone (no module of ``minibert_spec`` or ``minibert_reference``,
  nothing it imported);
* a user repository with the most generic names of its own (``spec/__init__.py``,
  ``reference.py``, ``tests/__init__.py``, ``conftest.py``): its unrelated tests pass under
  ``python -m pytest`` and ``pytest``; ``minibert check``, the ten-line file and the plugin give
  the verdicts of the plain repository, and import neither of the user's generic modules (each
  leaves a mark when imported); ``pip show -f`` lists nothing at the top of site-packages but
  the project's own names;
* an op of the user's own, declared (the README's ReGLU): ``minibert check`` exits 0 on it and
  1 on its planted bug, red in FD and the oracle;
* without torch: ``minibert check`` exits 2 saying how to install the oracle, and 0 with
  ``--oracle off``, whose report says the oracle was off.

Exits non-zero, naming what failed, on any difference.  Prints the timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPL = '''\
"""A user's NumPy layers (linear, ReLU, LayerNorm) in the protocol's op-pair form."""
import numpy as np


def linear_forward(x, W, b=None):
    y = x @ W
    return (y if b is None else y + b), (x, W, b is not None)


def linear_backward(dy, cache):
    x, W, has_b = cache
    n = x.shape[-1]
    dW = x.reshape(-1, n).T @ dy.reshape(-1, W.shape[1])
    db = dy.reshape(-1, W.shape[1]).sum(0) if has_b else None
    return dy @ W.T, dW, db


def relu_forward(x):
    return np.maximum(x, 0), x > 0


def relu_backward(dy, mask):
    return (dy * mask,)


def layernorm_forward(x, gamma, beta, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    x_hat = (x - mu) * rstd
    return gamma * x_hat + beta, (x_hat, rstd, gamma)


def layernorm_backward(dy, cache):
    x_hat, rstd, gamma = cache
    n = dy.shape[-1]
    g = dy * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))
    return dx, (dy * x_hat).reshape(-1, n).sum(0), dy.reshape(-1, n).sum(0)
'''
BUG = ('''    g = dy * gamma
    dx = rstd * (g - g.mean(-1, keepdims=True) - x_hat * (g * x_hat).mean(-1, keepdims=True))''',
       '''    dx = rstd * gamma * (dy - dy.mean(-1, keepdims=True)
                         - x_hat * (dy * x_hat).mean(-1, keepdims=True))  # gamma outside''')

TEST_FILE = '''\
import os

from minibert_spec.suite import parametrize_with_checks

impl = __import__(os.environ.get("MYBERT", "mybert_fixed"))


@parametrize_with_checks(impl)
def test_mybert(check):
    check()
'''

# a conftest of the user's that records what a session imported
MODULES_CONFTEST = '''\
import json, os, sys


def pytest_sessionfinish(session):
    with open(os.environ["MODULES_OUT"], "w") as f:
        json.dump(sorted(sys.modules), f)
'''

OTHER_TESTS = '''\
from hypothesis import given, settings, strategies as st


def test_profile():
    s = settings.default
    print(f"settings: profile={settings.get_current_profile_name()} "
          f"max_examples={s.max_examples} derandomize={s.derandomize} database={s.database!r}")


@given(st.integers())
def test_property(n):
    assert n == n
'''

PYPROJECT = '''\
[project]
name = "mybert"
version = "0.0.1"

[tool.pytest.ini_options]
addopts = "-p no:cacheprovider"
'''


def run(cmd, cwd, env=None, timeout=1800):
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.perf_counter() - start


def fail(msg: str, proc=None) -> None:
    tail = ""
    if proc is not None:
        tail = "\n" + (proc.stdout + proc.stderr)[-3000:]
    sys.exit(f"wheel_user_repo: FAIL: {msg}{tail}")


def venv(where: Path, wheel: Path, extras: str) -> Path:
    py = where / "bin" / "python"
    proc, t = run([sys.executable, "-m", "venv", str(where)], where.parent)
    if proc.returncode:
        fail("venv", proc)
    spec = f"{wheel}[{extras}]" if extras else str(wheel)
    proc, t2 = run([str(py), "-m", "pip", "install", "--quiet", spec, "pytest"], where.parent)
    if proc.returncode:
        fail(f"pip install {spec}", proc)
    print(f"venv {where.name}: installed {wheel.name}[{extras}] in {t + t2:.0f} s")
    return where / "bin"


def user_env(bin_dir: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MINIBERT_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def pytest_failed(bin_dir: Path, repo: Path, module: str) -> tuple[int, set[str], float]:
    report = repo / f"junit-{module}.xml"
    proc, t = run([str(bin_dir / "python"), "-m", "pytest", "-q", f"--junitxml={report}",
                   "test_mybert.py"], repo,
                  user_env(bin_dir, MYBERT=module))
    import xml.etree.ElementTree as ET

    failed = set()
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            name = case.attrib["name"]
            failed.add(name[name.index("[") + 1:-1])
    return proc.returncode, failed, t


def check_json(bin_dir: Path, repo: Path, module: str, *args) -> tuple[int, dict | None, float,
                                                                        object]:
    out = repo / f"check-{module}.json"
    out.unlink(missing_ok=True)
    proc, t = run([str(bin_dir / "minibert"), "check", module, "--format", "json", "-o",
                   str(out), *args], repo, user_env(bin_dir))
    data = json.loads(out.read_text()) if out.exists() else None
    return proc.returncode, data, t, proc


# ---------------------------------------------- an op of the user's own (minibert_spec.ops)
# the README's worked example (a ReGLU the op table lacks) and the bug its text plants
REGLU_BUG = ("(a > 0)", "(a < 0)")


def readme_reglu() -> str:
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(# myreglu\.py.*?)```", text, re.S)
    if len(blocks) != 1:
        fail("the README's ReGLU example (```python, # myreglu.py) is gone")
    return blocks[0]


def declared_op(bin_dir: Path, repo: Path) -> None:
    """The README's ReGLU, declared in the user's repository: ``minibert check`` from the wheel
    exits 0 on it, 1 on its planted bug with FD and the oracle red."""
    for name, source, want in (("myreglu", readme_reglu(), 0),
                               ("myreglu_buggy", readme_reglu().replace(*REGLU_BUG), 1)):
        (repo / f"{name}.py").write_text(source)
        code, data, t, proc = check_json(bin_dir, repo, name, "-k", "reglu")
        failed = {r["id"] for r in (data or {}).get("results", ()) if r["outcome"] == "failed"}
        red = {"fd[reglu]", "oracle.backward[reglu-f64]"}
        if code != want or (red <= failed) != bool(want):
            fail(f"minibert check {name} -k reglu: exit {code}, failed {sorted(failed)}", proc)
        print(f"minibert check {name} -k reglu (a declared op): exit {code} in {t:.0f} s, failed "
              f"{sorted(failed)}")
        (repo / f"{name}.py").unlink()


# -------------------------------------------------------- a user repository with generic names
# Each of the user's generic modules leaves a mark when imported: the suite must never import
# them (its own are minibert_spec and minibert_reference), and the user's tests must get them.
USER_SPEC = '''\
import os
open(os.path.join(os.path.dirname(__file__), "..", "imported-spec"), "a").close()
OWNER = "user"
'''
USER_REFERENCE = '''\
import os
open(os.path.join(os.path.dirname(__file__), "imported-reference"), "a").close()
OWNER = "user"
'''
USER_CONFTEST = '''\
import json, os, sys

import pytest


@pytest.fixture
def owner():
    return "user"


def pytest_sessionfinish(session):
    out = os.environ.get("MODULES_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())
                       if n.split(".")[0] in ("spec", "reference", "tests", "minibert_spec",
                                              "minibert_reference")}, f)
'''
USER_TESTS = '''\
import reference
import spec


def test_the_users_own_modules(owner):
    assert spec.OWNER == reference.OWNER == owner == "user"
'''
# the only names the wheel may put at the top of site-packages (and its console script)
OWN_TOP_LEVEL = {"minibert_spec", "minibert_reference"}


def top_level_of_installed(bin_dir: Path, repo: Path) -> set[str]:
    """The first path component of every file ``pip show -f minibert-spec`` lists (less the
    distribution's own metadata folder and the console script under bin/)."""
    proc, _ = run([str(bin_dir / "python"), "-m", "pip", "show", "-f", "minibert-spec"], repo,
                  user_env(bin_dir))
    if proc.returncode:
        fail("pip show -f minibert-spec", proc)
    lines = proc.stdout.split("Files:", 1)[1].splitlines()
    files = [x.strip() for x in lines if x.strip()]
    return {f.split("/")[0] for f in files
            if not f.startswith("..") and not f.split("/")[0].endswith(".dist-info")}


def generic_names_repo(full: Path, tmp: Path, plain_failed: set[str]) -> None:
    """The user repository again, beside a ``spec`` package, a ``reference`` module, a
    ``tests`` package and a ``conftest.py`` of the user's own."""
    repo = tmp / "generic-repo"
    repo.mkdir()
    for name in ("mybert_fixed.py", "mybert_buggy.py", "test_mybert.py", "pyproject.toml"):
        (repo / name).write_text((tmp / "user-repo" / name).read_text())
    (repo / "spec").mkdir()
    (repo / "spec" / "__init__.py").write_text(USER_SPEC)
    (repo / "reference.py").write_text(USER_REFERENCE)
    (repo / "tests").mkdir()
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_users_own.py").write_text(USER_TESTS)
    (repo / "conftest.py").write_text(USER_CONFTEST)

    def marks() -> list[str]:
        return sorted(p.name for p in repo.glob("imported-*"))

    def clear() -> None:
        for p in repo.glob("imported-*"):
            p.unlink()

    # the user's unrelated tests, both ways pytest is started, with the plugin installed
    for cmd in ([str(full / "python"), "-m", "pytest", "-q", "tests"],
                [str(full / "pytest"), "-q", "tests"]):
        clear()
        proc, _ = run(cmd, repo, user_env(full))
        if proc.returncode != 0 or "1 passed" not in proc.stdout:
            fail(f"the user's own tests beside generic names: {' '.join(cmd[-3:])}", proc)
        if marks() != ["imported-reference", "imported-spec"]:
            fail(f"the user's tests did not get the user's modules: marks {marks()}", proc)
    print("a repository with its own spec/, reference.py, tests/ and conftest.py: its tests "
          "pass under python -m pytest and pytest")

    # our verdicts there equal the plain repository's, and the suite imports none of the user's
    clear()
    code, failed, t = pytest_failed(full, repo, "mybert_buggy")
    if code != 1 or failed != plain_failed:
        fail(f"the ten-line file beside generic names: exit {code}, failed {sorted(failed)} "
             f"(plain repository: {sorted(plain_failed)})")
    c, data, t2, p = check_json(full, repo, "mybert_buggy")
    got = {r["id"] for r in data["results"] if r["outcome"] == "failed"} if data else None
    if c != 1 or got != plain_failed:
        fail(f"minibert check beside generic names: exit {c}, failed {got}", p)
    c0, _, _, p0 = check_json(full, repo, "mybert_fixed")
    if c0 != 0:
        fail(f"minibert check on the fixed module beside generic names exited {c0}", p0)
    out = tmp / "generic-modules.json"
    proc, _ = run([str(full / "python"), "-m", "pytest", "-q", "--minibert-impl=mybert_buggy",
                   "-k", "layernorm and fd", "-p", "no:cacheprovider", "--ignore=tests"], repo,
                  user_env(full, MODULES_OUT=str(out)))
    if proc.returncode != 1 or "fd[layernorm]" not in proc.stdout:
        fail("pytest --minibert-impl=mybert_buggy beside generic names", proc)
    if marks():
        fail(f"the suite imported the user's generic modules: {marks()}")
    files = json.loads(out.read_text())
    ours = {n: f for n, f in files.items() if n.split(".")[0] in OWN_TOP_LEVEL and f}
    if not ours or any("site-packages" not in f for f in ours.values()):
        fail(f"the suite's modules do not come from the wheel: {ours}")
    if any(n.split(".")[0] in ("spec", "reference") for n in files):
        fail(f"a generic name was imported in a session that checks: {sorted(files)}")
    top = top_level_of_installed(full, repo)
    if top != OWN_TOP_LEVEL:
        fail(f"pip show -f minibert-spec: top-level names {sorted(top)}, expected only "
             f"{sorted(OWN_TOP_LEVEL)}")
    print(f"beside generic names: the ten-line file ({t:.0f} s), minibert check ({t2:.0f} s) "
          f"and the plugin give the plain repository's verdicts ({len(plain_failed)} failed "
          f"ids), import only {sorted(OWN_TOP_LEVEL)} from site-packages; pip show -f: top "
          f"level {sorted(top)}")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="minibert-user-") as tmp:
        tmp = Path(tmp)
        proc, t = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
                       str(tmp / "dist"), str(ROOT)], tmp)
        if proc.returncode:
            fail("pip wheel", proc)
        wheel = next((tmp / "dist").glob("minibert_spec-*.whl"))
        print(f"built {wheel.name} in {t:.0f} s")
        repo = tmp / "user-repo"
        repo.mkdir()
        (repo / "mybert_fixed.py").write_text(IMPL)
        (repo / "mybert_buggy.py").write_text(IMPL.replace(*BUG))
        (repo / "test_mybert.py").write_text(TEST_FILE)
        (repo / "pyproject.toml").write_text(PYPROJECT)
        assert len(TEST_FILE.strip().splitlines()) <= 10

        full = venv(tmp / "venv-oracle", wheel, "oracle")
        # the checks come from the installed wheel, never from the checkout
        proc, _ = run([str(full / "python"), "-c", "import minibert_spec, minibert_reference; "
                       "print(minibert_spec.__file__, minibert_reference.__file__)"], repo,
                      user_env(full))
        if str(ROOT) in proc.stdout or "site-packages" not in proc.stdout:
            fail(f"the package does not come from the venv: {proc.stdout}")

        code_fixed, failed_fixed, t1 = pytest_failed(full, repo, "mybert_fixed")
        code_buggy, failed_buggy, t2 = pytest_failed(full, repo, "mybert_buggy")
        print(f"pytest (ten-line file): fixed exit {code_fixed} in {t1:.0f} s, buggy exit "
              f"{code_buggy} in {t2:.0f} s, failed: {sorted(failed_buggy)}")
        if code_fixed != 0 or failed_fixed:
            fail(f"pytest on the fixed module: exit {code_fixed}, failed {sorted(failed_fixed)}")
        if code_buggy != 1 or not failed_buggy:
            fail(f"pytest on the buggy module: exit {code_buggy}, failed {sorted(failed_buggy)}")
        if "fd[layernorm]" not in failed_buggy or any(
                "layernorm" not in f for f in failed_buggy):
            fail(f"pytest on the buggy module blames other checks: {sorted(failed_buggy)}")

        c_fixed, d_fixed, t3, p3 = check_json(full, repo, "mybert_fixed")
        c_buggy, d_buggy, t4, p4 = check_json(full, repo, "mybert_buggy")
        print(f"minibert check: fixed exit {c_fixed} in {t3:.0f} s, buggy exit {c_buggy} in "
              f"{t4:.0f} s")
        if c_fixed != 0:
            fail(f"minibert check on the fixed module exited {c_fixed}", p3)
        if c_buggy != 1:
            fail(f"minibert check on the buggy module exited {c_buggy}", p4)
        check_failed = {r["id"] for r in d_buggy["results"] if r["outcome"] == "failed"}
        if check_failed != failed_buggy:
            fail(f"minibert check and pytest disagree: only check "
                 f"{sorted(check_failed - failed_buggy)}, only pytest "
                 f"{sorted(failed_buggy - check_failed)}")
        verdicts = {row["op"]: row["verdict"] for row in d_buggy["ops"]}
        if [op for op, v in verdicts.items() if v == "FAIL"] != ["layernorm"]:
            fail(f"minibert check verdicts on the buggy module: {verdicts}")

        # three shards of the buggy module's run (dealt by the durations shipped in the
        # wheel) merge into the unsharded report: the same failed checks, the same exit
        shards = []
        for k in (1, 2, 3):
            proc, _ = run([str(full / "minibert"), "check", "mybert_buggy", "--shard",
                           f"{k}/3", "-o", str(tmp / f"shard-{k}.json")], repo, user_env(full))
            shards.append(str(tmp / f"shard-{k}.json"))
        proc, t6 = run([str(full / "minibert"), "report", "merge", *shards, "-o",
                        str(tmp / "merged")], repo, user_env(full))
        merged = (json.loads((tmp / "merged" / "report.json").read_text())
                  if (tmp / "merged" / "report.json").exists() else {"results": []})
        if proc.returncode != 1 or {r["id"] for r in merged["results"]
                                    if r["outcome"] == "failed"} != check_failed:
            fail(f"minibert report merge of 3 shards of the buggy module: exit "
                 f"{proc.returncode}", proc)
        print(f"3 shards of the buggy module merged: exit 1, the same failed checks ({t6:.1f} "
              "s to merge)")

        # the plugin is inert unless used: a session of other tests is the same with it
        # installed as with it disabled (same tests, same Hypothesis profile and database)
        (repo / "test_other.py").write_text(OTHER_TESTS)
        (repo / "conftest.py").write_text(MODULES_CONFTEST)
        seen, modules = [], []
        for i, extra in enumerate(([], ["-p", "no:minibert"])):
            out = tmp / f"modules-{i}.json"
            proc, _ = run([str(full / "python"), "-m", "pytest", "-q", "-s", *extra,
                           "test_other.py"], repo, user_env(full, MODULES_OUT=str(out)))
            lines = [x for x in proc.stdout.splitlines() if x.startswith("settings:")]
            seen.append((proc.returncode, lines))
            modules.append(set(json.loads(out.read_text())) if out.exists() else set())
        if seen[0] != seen[1] or seen[0][0] != 0:
            fail(f"the plugin changed a session that does not use it: {seen}")
        loaded = sorted(modules[0] - modules[1])
        project = [m for m in loaded if m.split(".")[0] in ("minibert_spec", "minibert_reference")
                   and m not in ("minibert_spec", "minibert_spec._pytestplugin")]
        if project or loaded != ["minibert_spec", "minibert_spec._pytestplugin"]:
            fail(f"the plugin loaded modules in a session that does not use it: project "
                 f"{project}, all {loaded}")
        print(f"a session not using the suite, plugin installed vs disabled: identical "
              f"({seen[0][1][0]}); modules loaded because of the plugin: {loaded} (of "
              f"{len(modules[0])})")
        (repo / "test_other.py").unlink()
        (repo / "conftest.py").unlink()
        proc, _ = run([str(full / "python"), "-m", "pytest", "--minibert-impl=mybert_buggy",
                       "-q", "-k", "layernorm and fd"], repo, user_env(full))
        if proc.returncode != 1 or "fd[layernorm]" not in proc.stdout:
            fail("pytest --minibert-impl=mybert_buggy -k 'layernorm and fd'", proc)
        print("pytest --minibert-impl=mybert_buggy -k 'layernorm and fd': red, names "
              "fd[layernorm]")

        declared_op(full, repo)
        generic_names_repo(full, tmp, failed_buggy)

        bare = venv(tmp / "venv-core", wheel, "")
        proc, _ = run([str(bare / "python"), "-c", "import torch"], repo, user_env(bare))
        if proc.returncode == 0:
            fail("torch is importable in the core venv")
        c, _, _, p = check_json(bare, repo, "mybert_fixed")
        if c != 2 or "pip install 'minibert-spec[oracle]'" not in p.stderr:
            fail(f"minibert check without torch exited {c}", p)
        refusal = p.stderr.strip()
        c, d, t5, p = check_json(bare, repo, "mybert_fixed", "--oracle", "off")
        if c != 0 or d["oracle"] != "off":
            fail(f"minibert check --oracle off without torch exited {c}", p)
        print(f"without torch: minibert check exit 2 ({refusal!r}); --oracle off exit 0 in "
              f"{t5:.0f} s")
        proc, t7 = run([str(bare / "minibert"), "check", "--many", "mybert_*.py", "--oracle",
                        "off", "--format", "json", "-o", str(tmp / "many.json")], repo,
                       user_env(bare))
        rows = ({i["name"]: i["exit_code"] for i in json.loads(
            (tmp / "many.json").read_text())["implementations"]}
            if (tmp / "many.json").exists() else {})
        if proc.returncode != 1 or rows != {"mybert_buggy.py": 1, "mybert_fixed.py": 0}:
            fail(f"minibert check --many 'mybert_*.py' without torch: {rows}", proc)
        print(f"minibert check --many 'mybert_*.py' --oracle off: {rows} in {t7:.0f} s")
    print("wheel_user_repo: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
