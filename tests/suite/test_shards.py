"""Shards with one merged verdict (issue 31): ``minibert check --shard k/N``, ``minibert mutate
--matrix --shard k/N`` and ``minibert report merge`` give the report -- verdicts, failures,
check ids, exit status; timings aside -- of the unsharded run; a merge refuses what is not the
shards of one run, naming which; the pytest path (``--minibert-impl``) works with pytest-split
and pytest-xdist unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from minibert_spec.suite.compare import compare
from minibert_spec.suite.shard import (
    merge_check_reports,
    parse_shard,
    partition,
    shard_plan,
    verify_shards,
    weights,
)
from tests import ROOT

SHARDS = 3


def minibert(*args, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minibert_spec.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


def load(path) -> dict:
    return json.loads(Path(path).read_text())


# --------------------------------------------------------------------------- the dealing
def test_parse_shard_refuses_what_is_not_k_of_n():
    assert parse_shard("2/3") == (2, 3)
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", "-1/2"):
        with pytest.raises(ValueError, match=r"--shard: expected k/N"):
            parse_shard(bad)


def test_partition_deals_every_item_once_longest_first_to_the_least_loaded():
    ids = [f"c{i}" for i in range(40)]
    w = [float((i * 7919) % 13) + 0.5 for i in range(40)]
    groups = partition(ids, w, 3)
    assert sorted(i for g in groups for i in g) == sorted(ids)  # each once
    for g in groups:  # each group in the run's order
        assert g == sorted(g, key=ids.index)
    totals = [sum(w[ids.index(i)] for i in g) for g in groups]
    # the greedy bound: no group exceeds another by more than the longest item
    assert max(totals) - min(totals) <= max(w)
    assert partition(ids, w, 3) == groups  # the same dealing in every process
    # longest first: the three longest items land in three different groups
    longest = sorted(ids, key=lambda i: -w[ids.index(i)])[:3]
    assert len({next(k for k, g in enumerate(groups) if i in g) for i in longest}) == 3


def test_weights_of_unknown_ids_are_the_mean_of_the_known():
    assert weights(["a", "b", "c"], {"a": 1.0, "b": 3.0}) == [1.0, 3.0, 2.0]
    assert weights(["x", "y"], {}) == [1.0, 1.0]


def _fake_shards(n=3, **changes):
    ids = [f"fd[op{i}]" for i in range(7)]
    out = []
    for k in range(1, n + 1):
        plan = shard_plan(ids, {}, k, n)
        rec = {"schema": "minibert-check/1", "impl": "m", "oracle": "off",
               "settings": {"seed": 1, "implementation": "abc"}, "shard": plan,
               "results": [{"id": i, "kind": "fd", "ops": ["linear"], "outcome": "passed",
                            "message": "", "seconds": 0.1} for i in plan["items"]]}
        for key, (which, value) in changes.items():
            if which == k:
                target = rec
                *path, last = key.split(".")
                for p in path:
                    target = target[p]
                target[last] = value
        out.append((f"s{k}.json", rec))
    return out


@pytest.mark.parametrize("records, message", [
    (_fake_shards()[:2], r"shard 3/3 missing"),
    (_fake_shards()[:2] + [_fake_shards()[1]], r"shard 2/3 given twice \(s2.json, s2.json\)"),
    (_fake_shards(impl=(2, "other")), r"s1.json and s2.json are not shards of one run: impl"),
    (_fake_shards(**{"settings.seed": (3, 2)}), r"settings.seed differs \(1 vs 2\)"),
    (_fake_shards(**{"settings.implementation": (2, "def")}),
     r"settings.implementation differs"),
    (_fake_shards(**{"shard.weights": (2, "0" * 64)}), r"the durations they were dealt by"),
    (_fake_shards(**{"shard.count": (2, 4)}), r"shard.count differs"),
    (_fake_shards(schema=(1, "minibert-matrix/1")), r"s1.json: expected a minibert check "),
    ([("x.json", {"schema": "minibert-check/1"})], r"x.json: expected the record of a shard"),
])
def test_merge_refuses_what_is_not_the_shards_of_one_run(records, message):
    with pytest.raises(ValueError, match=message):
        merge_check_reports(records)


def test_merge_refuses_a_shard_whose_results_are_not_its_checks():
    records = _fake_shards()
    records[1][1]["results"].pop()
    with pytest.raises(ValueError, match=r"s2.json: its results are not the checks of its shard"):
        merge_check_reports(records)


@pytest.mark.parametrize("where, match", [
    ("result", r"s2.json: expected ids mapped to seconds >= 0, got 'fd\[op\d\]': -1.0"),
    ("run", r"s2.json: expected the run's seconds >= 0, got -3.0")])
def test_merge_refuses_negative_seconds(where, match):
    """Issue 41: a shard with negative seconds was merged, and its durations.json was then
    refused by the next sharded run's --durations."""
    records = _fake_shards()
    if where == "result":
        records[1][1]["results"][0]["seconds"] = -1.0
    else:
        records[1][1]["seconds"] = -3.0
    with pytest.raises(ValueError, match=match):
        merge_check_reports(records)


def test_verify_orders_the_shards_by_index():
    records = _fake_shards()
    ordered = verify_shards(records[::-1], "minibert-check/1", "a check report")
    assert [n for n, _ in ordered] == ["s1.json", "s2.json", "s3.json"]


# --------------------------------------------------------------------------- minibert check
# the red implementation over the whole suite; the green one over a few ops (its whole-suite
# runs cost ~2 minutes of the slow tier and judged the same merge again)
SHARDED = {"minibert_reference": ("--ops", "layernorm", "softmax"),
           "tests.examples.broken_impl": ()}


@pytest.fixture(scope="module", params=list(SHARDED))
def sharded_run(request, tmp_path_factory):
    """The unsharded report of one implementation, its 3 shards and their merge."""
    impl = request.param
    tmp = tmp_path_factory.mktemp("shards")
    full = minibert("check", impl, *SHARDED[impl], "--format", "json", "-o", tmp / "full.json")
    shards = [minibert("check", impl, *SHARDED[impl], "--shard", f"{k}/{SHARDS}",
                       "-o", tmp / f"s{k}.json") for k in range(1, SHARDS + 1)]
    merged = minibert("report", "merge", *(tmp / f"s{k}.json" for k in range(1, SHARDS + 1)),
                      "-o", tmp / "merged", "--format", "html")
    return impl, tmp, full, shards, merged


@pytest.mark.slow  # the slow tier (conftest.py): four runs per implementation
def test_merged_shards_are_the_unsharded_report(sharded_run):
    impl, tmp, full, shards, merged = sharded_run
    before, after = load(tmp / "full.json"), load(tmp / "merged" / "report.json")
    assert compare(before, after) == []  # outcomes, failing tensors, op verdicts, exit code
    assert [r["id"] for r in after["results"]] == [r["id"] for r in before["results"]]
    for key in ("exit_code", "summary", "counts", "notes", "load_error", "impl", "groups"):
        assert after[key] == before[key], key
    assert [(o["op"], o["verdict"], {k: (c["status"], c["checks"]) for k, c in o["cells"].items()})
            for o in after["ops"]] == \
        [(o["op"], o["verdict"], {k: (c["status"], c["checks"]) for k, c in o["cells"].items()})
         for o in before["ops"]]
    assert merged.returncode == full.returncode == before["exit_code"], merged.stderr
    assert (1 if impl != "minibert_reference" else 0) == before["exit_code"]
    # each shard ran a part, the parts are the run, and the page draws the merged JSON
    parts = [load(tmp / f"s{k}.json") for k in range(1, SHARDS + 1)]
    assert sorted(i for p in parts for i in p["shard"]["items"]) == \
        sorted(r["id"] for r in before["results"])
    assert all(0 < len(p["results"]) < len(before["results"]) for p in parts)
    assert load(tmp / "merged" / "check.json")["results"] == after["results"]
    durations = load(tmp / "merged" / "durations.json")
    assert set(durations) == {r["id"] for r in before["results"]}


@pytest.mark.slow  # the slow tier (conftest.py): four runs per implementation
def test_a_merge_with_a_shard_missing_or_twice_is_refused_naming_it(sharded_run):
    _, tmp, *_ = sharded_run
    r = minibert("report", "merge", tmp / "s1.json", tmp / "s3.json", "-o", tmp / "m2")
    assert r.returncode == 2 and "shard 2/3 missing" in r.stderr
    r = minibert("report", "merge", tmp / "s1.json", tmp / "s2.json", tmp / "s2.json",
                 tmp / "s3.json", "-o", tmp / "m3")
    assert r.returncode == 2 and "shard 2/3 given twice" in r.stderr
    other = load(tmp / "s2.json")
    other["settings"]["max_examples"] = 50
    (tmp / "s2x.json").write_text(json.dumps(other))
    r = minibert("report", "merge", tmp / "s1.json", tmp / "s2x.json", tmp / "s3.json",
                 "-o", tmp / "m4")
    assert r.returncode == 2 and "settings.max_examples differs (None vs 50)" in r.stderr


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_shards_of_another_version_of_the_implementation_are_refused(tmp_path):
    """A shard run on an edited implementation (same module name) does not merge."""
    src = ROOT / "tests" / "examples" / "broken_impl.py"
    for k, text in ((1, src.read_text()), (2, src.read_text() + "\n# edited\n")):
        (tmp_path / "mine.py").write_text(text)
        r = minibert("check", "mine", "--ops", "layernorm", "--kinds", "fd", "invariant",
                     "--oracle", "off", "--shard", f"{k}/2", "-o", tmp_path / f"s{k}.json",
                     cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
        assert (tmp_path / f"s{k}.json").exists(), r.stderr
    r = minibert("report", "merge", tmp_path / "s1.json", tmp_path / "s2.json", "-o",
                 tmp_path / "m")
    assert r.returncode == 2 and "settings.implementation differs" in r.stderr


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
@pytest.mark.parametrize("args, message", [
    (["--shard", "2/3", "-x", "-o", "x.json"], "--shard: not with --first-red"),
    (["--shard", "2/3"], "--shard: expected -o FILE"),
    (["--shard", "4/3", "-o", "x.json"], "--shard: expected k/N with 1 <= k <= N"),
    (["--shard", "1/5", "-k", r"^fd\[layernorm\]$", "-o", "x.json"], "5 shards for 1"),
    (["--durations", "x.json"], "--durations: applies to --shard only"),
])
def test_shard_options_refused_in_one_line(args, message, tmp_path):
    r = minibert("check", "minibert_reference", *args, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow  # the slow tier: >= 5 s of the default run (issue 40)
def test_a_shard_that_cannot_load_the_implementation_makes_the_merge_say_so(tmp_path):
    (tmp_path / "gone.py").write_text("raise ImportError('no numpy here')\n")
    for k in (1, 2):
        r = minibert("check", "gone", "--oracle", "off", "--shard", f"{k}/2", "-o",
                     tmp_path / f"s{k}.json", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
        assert r.returncode == 2 and (tmp_path / f"s{k}.json").exists()
    r = minibert("report", "merge", tmp_path / "s1.json", tmp_path / "s2.json", "-o",
                 tmp_path / "m")
    assert r.returncode == 2 and "shard 1/2:" in r.stderr and "no numpy here" in r.stderr


# --------------------------------------------------------------------------- the mutation matrix
# a few cheap mutants (the whole matrix takes ~15 min of both cores)
MUTANTS = ["checkpoint_hash_params_only", "wordpiece_alphabet_ties_by_insertion",
           "wordpiece_min_frequency_exclusive", "tanh_backward_missing_square"]
ROW = ("mutant", "equation", "status", "tests", "killers", "fingerprint")


@pytest.mark.slow  # the slow tier (conftest.py): four matrix runs
def test_merged_matrix_shards_are_the_unsharded_matrix(tmp_path):
    def matrix(name, *args):
        file = tmp_path / f"{name}.json"
        file.write_text('{"version": 1, "rows": {}}')
        return minibert("mutate", "--matrix", *MUTANTS, "--no-baseline", "--rerun",
                        "--matrix-file", file, "--json", tmp_path / f"{name}-record.json",
                        *args)

    full = matrix("full")
    assert full.returncode == 0, full.stdout[-2000:]
    for k in range(1, SHARDS + 1):
        r = matrix(f"m{k}", "--shard", f"{k}/{SHARDS}", "--durations",
                   ROOT / "spec" / "results" / "mutation_matrix.json")
        assert r.returncode == 0, r.stdout[-2000:]
    merged = minibert("report", "merge",
                      *(tmp_path / f"m{k}-record.json" for k in range(1, SHARDS + 1)),
                      "-o", tmp_path / "merged")
    assert merged.returncode == full.returncode, merged.stderr
    before = load(tmp_path / "full-record.json")["rows"]
    after = load(tmp_path / "merged" / "mutation_matrix.json")["rows"]
    assert list(after) == sorted(MUTANTS)
    assert {m: [r[k] for k in ROW] for m, r in after.items()} == \
        {m: [r[k] for k in ROW] for m, r in before.items()}
    parts = [load(tmp_path / f"m{k}-record.json")["shard"]["items"] for k in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(MUTANTS) and all(parts)
    assert (tmp_path / "merged" / "mutation_matrix.md").read_text().count("| ") > 4
    # the recorded matrix of the checkout is untouched (each run had its own --matrix-file)
    assert subprocess.run(["git", "diff", "--quiet", "--", "spec/results/mutation_matrix.json"],
                          cwd=ROOT).returncode == 0


# --------------------------------------------------------------------------- the pytest path
def _pytest(tmp: Path, name: str, *args) -> dict[str, str]:
    """``pytest --minibert-impl`` on the broken adapter's layernorm checks (a user's session:
    no project conftest), as {test id: outcome} from its JUnit XML."""
    xml = tmp / f"{name}.xml"
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                        "--minibert-impl", "tests.examples.broken_impl", "--minibert-oracle",
                        "off", "-k", "layernorm", f"--junitxml={xml}", *args],
                       cwd=tmp, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode in (0, 1), r.stdout[-2000:] + r.stderr[-2000:]
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kids = {c.tag for c in case}
        out[case.get("name")] = ("failed" if kids & {"failure", "error"} else
                                 "skipped" if "skipped" in kids else "passed")
    return out


@pytest.mark.slow  # the slow tier (conftest.py): pytest sessions split and spread
def test_the_pytest_plugin_splits_with_pytest_split_and_spreads_with_xdist(tmp_path):
    whole = _pytest(tmp_path, "whole", "--store-durations",
                    f"--durations-path={tmp_path / '.test_durations'}")
    assert len(whole) > 10 and "failed" in whole.values() and "passed" in whole.values()
    groups = [_pytest(tmp_path, f"g{k}", "--splits", "3", "--group", str(k),
                      f"--durations-path={tmp_path / '.test_durations'}") for k in (1, 2, 3)]
    assert all(groups) and sum(len(g) for g in groups) == len(whole)
    assert {k: v for g in groups for k, v in g.items()} == whole
    assert _pytest(tmp_path, "xdist", "-n", "2") == whole
