"""The on-disk cache of lambdified SymPy maps (spec/equations/_cache.py): a map read back runs
the very code that was generated (bit-identical results, including a global lambdify took from
``math``), the directory honours XDG_CACHE_HOME, a corrupt entry is rebuilt, two writers at once
never leave a partial entry, and the key follows the equations' source."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from minibert_spec.equations import _cache
from minibert_spec.equations.gelu import ERF_FWD
from minibert_spec.equations.layernorm import _row_fn
from minibert_spec.equations.optim import _adam_sympy


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_the_cache_lives_under_xdg_cache_home(cache_home, monkeypatch):
    assert _cache.cache_dir() == cache_home / "minibert-spec" / "sympy"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored (XDG spec)
    assert _cache.cache_dir().parent.parent.name == ".cache"


@pytest.mark.parametrize("builder, args", [(_row_fn, (3,)), (_adam_sympy, ((3,),))],
                         ids=["layernorm_row", "adam"])
def test_a_map_read_back_gives_bit_identical_results(cache_home, builder, args):
    built = builder.builder(*args)
    path = _cache.entry_path("test." + builder.__name__, args)
    assert _cache.write(path, "test", built)
    assert path.parent.parent.parent == cache_home
    read = _cache.read(path)
    assert read is not None
    rng = np.random.default_rng(0)
    spec = built.cache_spec
    for _ in range(3):
        arrays = {n: rng.uniform(0.5, 1.5, s)
                  for n, s in zip(spec["names"], _input_shapes(builder, args))}
        for a, b in zip(built(**arrays), read(**arrays)):
            assert np.array_equal(a, b)


def _input_shapes(builder, args):
    if builder is _row_fn:
        n = args[0]
        return [(n,), (n,), (n,), (n,), (1,)]
    return [args[0]] * 4


def test_a_global_from_math_survives_the_round_trip(cache_home):
    """GELU's erf is not in lambdify's numpy namespace (it comes from math): the entry names
    where it comes from, and the map read back computes the same values."""
    size = ERF_FWD.sizes[0]
    with _cache.recording():  # built from SymPy (a check reads the generated source instead)
        fresh = ERF_FWD.sympy(size)
    spec = fresh.cache_spec
    assert spec["extras"].get("erf") == ["math", "erf"]
    path = _cache.entry_path("test.gelu", (size,))
    _cache.write(path, "test", fresh)
    x = np.linspace(-2, 2, int(np.prod(size))).reshape(size)
    dy = np.ones(size)
    np.testing.assert_array_equal(_cache.read(path)(x=x, dy=dy)[0], fresh(x=x, dy=dy)[0])


def test_a_corrupt_entry_is_ignored_and_rewritten(cache_home):
    calls = []

    @_cache.maps_cache(name="test.corrupt")
    def build(n):
        calls.append(n)
        return _row_fn.builder(n)

    path = _cache.entry_path("test.corrupt", (2,))
    for junk in ("", "{not json", json.dumps({"format": _cache.FORMAT,
                                              "digest": _cache.source_digest(),
                                              "value": {"map": {"source": "def ("}}})):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(junk)
        build.cache_clear()
        assert build(2) is not None
        assert _cache.read(path) is not None  # rebuilt and written whole
    assert calls == [2, 2, 2]
    build.cache_clear()
    build(2)
    assert calls == [2, 2, 2]  # a good entry is read, not rebuilt
    _cache._BUILDERS.pop("test.corrupt")


def test_two_builders_with_one_name_are_refused():
    with pytest.raises(ValueError, match="two builders"):
        _cache.maps_cache(name="layernorm.row")(lambda n: n)
        _cache.maps_cache(name="layernorm.row")(lambda n: n)
    _cache._BUILDERS.pop("layernorm.row")


def test_the_key_follows_the_source_and_the_arguments(cache_home, monkeypatch):
    one = _cache.entry_path("x", (3,))
    assert _cache.entry_path("x", (4,)) != one
    assert _cache.entry_path("y", (3,)) != one
    monkeypatch.setattr(_cache, "source_digest", lambda: "an edited equation")
    assert _cache.entry_path("x", (3,)) != one


def test_two_processes_writing_one_entry_at_once_leave_a_whole_entry(cache_home):
    """Two writers racing on the same entry, a reader meanwhile: every read is either absent
    or a whole map (atomic rename), never a truncated file."""
    script = textwrap.dedent("""
        from minibert_spec.equations import _cache
        from minibert_spec.equations.layernorm import _row_fn
        m = _row_fn.builder(3)
        p = _cache.entry_path("test.race", (3,))
        for _ in range(40):
            assert _cache.write(p, "race", m)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(2)]
    path = _cache.entry_path("test.race", (3,))
    seen = 0
    while any(p.poll() is None for p in procs):
        if path.exists():
            assert _cache.read(path) is not None
            seen += 1
    assert [p.wait() for p in procs] == [0, 0]
    assert _cache.read(path) is not None
    leftovers = [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers


def test_a_proof_is_kept_per_module_source(cache_home):
    """A registered equation's proof outcome is read back (status, sizes, detail, the time it
    took); a synthetic equation (no module file) is never cached; the key follows the
    module's source and what it imports, not the other equation modules."""
    from minibert_spec.equations import EQUATIONS, Equation, Proof, load

    load()
    eq = EQUATIONS["layernorm.backward.dx"]
    eq._proof_cache = None
    first = eq.run_proof()
    assert _cache.read_proof(eq) == {"status": first.status, "sizes": list(first.sizes),
                                     "detail": first.detail, "seconds": first.seconds}
    eq._proof_cache = None
    again = eq.run_proof()
    assert (again.status, again.sizes, again.detail) == (first.status, first.sizes, first.detail)
    synthetic = Equation("x.y", "t", (), "x", lambda: Proof("refuted", (1,)))
    assert synthetic.run_proof().status == "refuted" and _cache.read_proof(synthetic) is None
    import minibert_spec.equations.layernorm as ln
    import minibert_spec.equations.linear as lin
    import minibert_spec.equations.mlm_head as head

    assert _cache.module_digest(ln.__file__) != _cache.module_digest(lin.__file__)
    # mlm_head builds on the helpers of _nn and _sym and on gelu: its key covers them;
    # linear's does not cover _nn (editing the LayerNorm helper re-proves no linear proof)
    names = {p.name for p in _cache.module_closure(head.__file__)}
    assert {"mlm_head.py", "_nn.py", "_sym.py", "gelu.py", "__init__.py"} <= names
    assert "_nn.py" not in {p.name for p in _cache.module_closure(lin.__file__)}
    assert all(isinstance(p, Path) for p in _cache.module_closure(ln.__file__))


@pytest.mark.slow  # the slow tier: ~5 s, two interpreters proving
def test_two_processes_wanting_one_proof_at_once_prove_it_once(cache_home, tmp_path):
    """On a cold machine the workers of ``pytest -n 2`` want the same proofs at the same
    moment: the second waits for the first's lock and reads its outcome (one proof, one
    status) instead of proving it again beside it."""
    script = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from minibert_spec.equations import EQUATIONS, load
        load()
        eq = EQUATIONS["layernorm.backward.dx"]
        inner, log, me = eq.proof, Path(sys.argv[1]), sys.argv[2]
        def counted():
            with log.open("a") as f:
                f.write("proved\\n")
            time.sleep(1.0)  # the other process asks while this one proves
            return inner()
        eq.proof = counted
        (log.parent / me).touch()  # a barrier: both ask only once both are ready
        while len(list(log.parent.glob("ready-*"))) < 2:
            time.sleep(0.01)
        print(eq.run_proof().status)
    """)
    log = tmp_path / "proofs.log"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(log), f"ready-{i}"],
                              stdout=subprocess.PIPE, text=True) for i in range(2)]
    statuses = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert statuses[0] == statuses[1] and statuses[0], statuses
    assert log.read_text().count("proved") == 1


def test_a_lock_held_by_a_killed_process_does_not_block(tmp_path):
    """The lock dies with its holder (the operating system releases it): a worker killed
    while proving never stalls the next one."""
    import signal
    import threading

    entry = tmp_path / "entry.json"
    held = tmp_path / "held"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from minibert_spec.equations import _cache
        with _cache.computing(Path({str(entry)!r})):
            Path({str(held)!r}).touch()
            time.sleep(120)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script])
    try:
        while not held.exists():
            assert holder.poll() is None, "the holder died before taking the lock"
        entered = threading.Event()

        def take():
            with _cache.computing(entry):
                entered.set()

        waiter = threading.Thread(target=take, daemon=True)
        waiter.start()
        assert not entered.wait(0.5), "the lock was not exclusive while its holder lived"
        holder.send_signal(signal.SIGKILL)
        assert entered.wait(30), "a killed holder's lock still blocks"
    finally:
        holder.kill()
        holder.wait()


def test_the_collection_of_the_projects_tests_is_kept_per_source(cache_home, monkeypatch,
                                                                 tmp_path):
    """The audit's pytest collection of tests/ (~10 s) is read back while no source file
    changed; another tests folder is always collected; an edited source is a new key."""
    from minibert_spec import evidence as audit

    calls = []
    monkeypatch.setattr(audit, "_collect_items",
                        lambda tests_dir, **kw: calls.append(tests_dir) or [{"nodeid": "t"}])
    assert audit.collect_items() == [{"nodeid": "t"}]
    assert audit.collect_items() == [{"nodeid": "t"}] and len(calls) == 1
    path = audit._collection_path(audit.ROOT / "tests", None)
    assert path.parent.parent == cache_home / "minibert-spec"
    assert audit._collection_path(audit.ROOT / "tests", "pkg.mod") != path
    monkeypatch.setenv("MINIBERT_MUTANT", "linear_db_mean")
    assert audit._collection_path(audit.ROOT / "tests", None) != path
    other = tmp_path / "tests"
    other.mkdir()
    assert audit._collection_path(other, None) is None
    path.write_text("{corrupt")
    monkeypatch.delenv("MINIBERT_MUTANT")
    assert audit.collect_items() == [{"nodeid": "t"}] and len(calls) == 2
