"""How long a verdict takes (issue 29), on the project's own cases: ``minibert check`` on the
reference and on buggy implementations, its first red with ``--first-red``, and a user's
ten-line pytest file with ``parametrize_with_checks`` (tests/wheel_user_repo.py's file and
modules), each run in a fresh process, the cases alternating process by process, medians over
rounds -- through minibert_spec.benchverdict, the functions of ``minibert bench --verdict`` (what a
user runs on their own implementation), which also says how it checks itself.

    python tests/benchmarks/verdict_time.py [--rounds 5] [--cases reference first_red ...]
                                            [-o report.json] [--allow-noisy]

Case ``startup`` (one fixed-seed check) is the wall time every ``minibert check`` pays before
its first check: the process, the fork server, loading the reference.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minibert_spec.benchverdict import (  # noqa: E402
    TARGET_FIRST_RED_S,
    TARGET_REFERENCE_COLD_S,
    TARGET_REFERENCE_S,
    check_case,
    exit_status,
    measure,
    pytest_case,
    render,
)

REALSTYLE_TARGET_S = 20.0  # a buggy real-style implementation's whole check (issue 29)


def cases(repo: Path) -> dict:
    """name -> minibert_spec.benchverdict.Case (the pytest cases run in ``repo``, the user's)."""
    root = str(ROOT)
    out = {
        "startup": check_case("minibert_reference", "-k", r"^fd\[relu\]$", cwd=root,
                              what="one fixed-seed check: the process, the fork server, "
                                   "loading the reference"),
        "reference": check_case("minibert_reference", target_s=TARGET_REFERENCE_S, cwd=root,
                                cache="warm", what="minibert check minibert_reference, warm"),
        "reference_cold": check_case("minibert_reference", target_s=TARGET_REFERENCE_COLD_S,
                                     cwd=root, cache="cold",
                                     what="minibert check minibert_reference, cold: no cache"),
        "reference_deep": check_case("minibert_reference", "--deep", cwd=root, cache="warm"),
        "broken": check_case("tests.examples.broken_impl", cwd=root),
        "first_red": check_case("tests.examples.broken_impl", "--first-red", cwd=root,
                                target_s=TARGET_FIRST_RED_S),
    }
    for name in ("realstyle_tutorial", "realstyle_minigpt", "realstyle_numpy_transformer"):
        out[name] = check_case(f"tests.examples.{name}", cwd=root, target_s=REALSTYLE_TARGET_S)
    for name in ("fixed", "buggy"):
        out[f"pytest_{name}"] = pytest_case(
            repo / "test_mybert.py", env={"MYBERT": f"mybert_{name}"},
            what=f"pytest on the user's ten-line file, the {name} module")
    return out


DEFAULT_CASES = ("startup", "reference", "reference_cold", "reference_deep", "first_red",
                 "broken", "pytest_fixed", "pytest_buggy")


def user_repo(where: Path) -> Path:
    """The user's repository of tests/wheel_user_repo.py: two modules and the ten-line file."""
    from tests.wheel_user_repo import BUG, IMPL, TEST_FILE

    (where / "mybert_fixed.py").write_text(IMPL)
    (where / "mybert_buggy.py").write_text(IMPL.replace(*BUG))
    (where / "test_mybert.py").write_text(TEST_FILE)
    return where


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES),
                   choices=list(cases(Path("."))))
    p.add_argument("-o", "--output", help="also write the JSON here (atomically)")
    p.add_argument("--allow-noisy", action="store_true",
                   help="exit 0 even when the self-check finds the machine busy")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="verdict-time-") as tmp:
        every = cases(user_repo(Path(tmp)))
        result = measure({n: every[n] for n in args.cases}, args.rounds)
    print(render(result))
    if args.output:
        from minibert_reference.train.fileio import atomic_write

        atomic_write(args.output, json.dumps(result, indent=1) + "\n")
    status, why = exit_status(result, args.allow_noisy)
    if status:
        print(f"self-check failed: {why}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
