"""``minibert adapter infer``'s run: the inference in a child interpreter of its own
session, under a time limit, what the module prints captured (:func:`infer_isolated`)."""

from __future__ import annotations

from dataclasses import dataclass

from minibert_spec.suite.infer.subjects import import_name

# The child of infer_isolated: sys.path as the parent's, the module imported (then a word in the
# stage file, so that a hang or an exit is said to be the import's or the inference's), the
# adapter's source (or why there is none) in the result file.  Whatever the module prints goes
# to the child's stdout and stderr, which the parent shows on its stderr; os._exit ends it even
# with a leftover non-daemon thread of the module's.
_INFER_CHILD = """\
import json, os, sys
module, stage, result = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path[:] = json.loads(sys.argv[4])


def say(**what):
    with open(result + ".part", "w") as f:
        json.dump(what, f)
    os.replace(result + ".part", result)


try:
    from minibert_spec.suite.infer import infer, load_module, render_source

    load_module(module)
    with open(stage, "w") as f:
        f.write("imported")
    mappings, missing = infer(module)
    source = render_source(module, mappings, missing)
    with open(stage, "w") as f:
        f.write("checking")
    from minibert_spec.suite.infer.isolated import check_written

    say(source=source, mapped=len(mappings), missing=missing,
        checked=check_written(source, [m.op for m in mappings]))
except ValueError as e:  # the module does not import, or an argument refused: its one line
    say(refused=str(e))
except BaseException as e:  # SystemExit and KeyboardInterrupt too: the user's code raised
    lines = str(e).strip().splitlines()
    say(raised=type(e).__name__ + (": " + lines[0] if lines else ""))
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os._exit(0)
"""


@dataclass(frozen=True)
class Inferred:
    """What :func:`infer_isolated` got: the adapter's ``source`` or the one-line ``reason``
    there is none, what the module printed, the number of ops ``mapped``, what is ``missing``,
    and :func:`check_written`'s verdicts."""

    source: str | None
    reason: str | None
    output: str
    mapped: int = 0
    missing: tuple = ()
    checked: tuple = ()  # ((op, "ok" | its first red's message), ...)


def check_written(source: str, ops: list) -> list:
    """The adapter ``source`` imported and its rows ``ops`` run by the quick tier, no oracle:
    [(op, "ok" or the first red's line)].  One that does not import or is refused is a
    ValueError: a mistake of the inference, said before anything is written."""
    import types

    from minibert_spec.suite import check_implementation

    adapter = types.ModuleType("minibert_inferred_adapter")
    try:
        exec(compile(source, "<the inferred adapter>", "exec"), adapter.__dict__)  # noqa: S102
    except Exception as e:  # noqa: BLE001 -- our own output: say why it does not import
        raise ValueError(f"the inferred adapter does not import ({type(e).__name__}: {e}); "
                         "please report this with your module") from e
    report = check_implementation(adapter, ops=ops, quick=True, oracle="off")
    if report.load_error is not None:  # could not run: its declaration refused, nothing loaded
        raise ValueError(f"the inferred adapter could not be checked: {report.summary()}")
    verdicts = report.verdicts()
    first = {}
    for r in report.failures():
        for op in r.ops:
            first.setdefault(op, f"{r.id}: {r.message.strip().splitlines()[0][:200]}")
    return [(op, "ok" if verdicts.get(op) == "ok" else first.get(op, verdicts.get(op, "n/a")))
            for op in ops]


def _stage(stage: str, module: str) -> str:
    """What the child was doing when it stopped: importing, inferring or checking."""
    import os

    if not os.path.exists(stage):
        return f"importing {module!r}"
    with open(stage, encoding="utf-8") as f:
        done = f.read()
    return (f"checking the adapter inferred for {module!r} (minibert check --quick on its rows)"
            if done == "checking" else
            f"inferring an adapter for {module!r} (its classes and functions run)")


def infer_isolated(module: str, timeout: float | None, *, paths=()) -> Inferred:
    """:func:`infer_source` of ``module`` in a child interpreter of its own session (this
    process's ``sys.path``, ``paths`` first), under a limit of ``timeout`` seconds (None: none),
    what it prints captured.  An import or inference that hangs, exits, crashes or raises gives
    a reason of one line, never a source."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    from minibert_spec.suite.probe import _kill_group, ended

    import_name(module)
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout}")
    path = list(dict.fromkeys(os.path.abspath(p or os.curdir) for p in [*paths, *sys.path]))
    with tempfile.TemporaryDirectory(prefix="minibert-infer-") as tmp:
        stage, result = os.path.join(tmp, "stage"), os.path.join(tmp, "result")
        printed = os.path.join(tmp, "output")
        with open(printed, "wb") as out:
            child = subprocess.Popen(
                [sys.executable, "-c", _INFER_CHILD, module, stage, result, json.dumps(path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)  # a hang's children are killed with it
            try:
                code = child.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(child)
                code = None
        with open(printed, "rb") as f:
            output = f.read().decode("utf-8", "replace")
        what = _stage(stage, module)
        if code is None:
            return Inferred(None, f"impl: {what} did not finish within {timeout:g} s", output)
        if not os.path.exists(result):
            return Inferred(None, ended(what, code, "before it finished",
                                           "nothing could be inferred"), output)
        with open(result, encoding="utf-8") as f:
            said = json.load(f)
    if "source" in said:
        return Inferred(said["source"], None, output, said["mapped"], tuple(said["missing"]),
                        tuple(map(tuple, said["checked"])))
    if "refused" in said:
        return Inferred(None, said["refused"], output)
    return Inferred(None, f"impl: {what} raised {said['raised']}", output)
