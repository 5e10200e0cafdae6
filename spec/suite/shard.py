"""Shards: one run split into N deterministic, duration-balanced parts, each run by its own
job, and the parts merged back into the one verdict the unsharded run gives.

pytest-split is the model: a durations file maps each item (a check id, a mutant) to the
seconds it took; the items are dealt to N groups, longest first, each to the group with the
least total so far (its ``least_duration`` algorithm), and each group keeps the items in the
run's own order.  Given the same items and the same durations, every job computes the same N
groups, so job k runs group k alone and nothing is run twice or lost.

Durations come from a previous report -- every ``minibert check`` report records each check's
seconds, every mutation-matrix row its own -- or a plain ``{id: seconds}`` file (what
``minibert report merge`` writes beside the merged report, as pytest-split's
``.test_durations``).  The default when none is given: the durations recorded for the bundled
reference (``spec/results/check_durations.json``) for checks, the recorded matrix for mutants;
an item the file does not name weighs the mean of those it names (1 s when it names none).

Sharding never changes a verdict: each check draws from a seed derived from its own id
(minibert_spec.suite.registry.Check.hypothesis_test), never from its shard or position.  A merge
refuses shards that do not make one run -- another implementation or another version of it,
another version of the suite, other settings, another selection or durations, a shard missing
or given twice -- naming which.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from minibert_spec.paths import RESULTS

# the durations of the checks on the bundled reference (minibert check reference --bad-input
# --format json, each result's "seconds"): the default weights of a sharded check run
DEFAULT_DURATIONS = RESULTS / "check_durations.json"
FALLBACK_SECONDS = 1.0  # an item's weight when the durations name nothing at all
_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str, what: str = "--shard") -> tuple[int, int]:
    """``"k/N"`` -> (k, N), 1 <= k <= N; a ValueError naming ``what`` otherwise."""
    m = _SHARD.match(str(text))
    if not m:
        raise ValueError(f"{what}: expected k/N (e.g. 2/3: the second of three shards), "
                         f"got {text!r}")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"{what}: expected k/N with 1 <= k <= N, got {text!r}")
    return k, n


def durations_from(data, what: str = "durations") -> dict[str, float]:
    """The ``{id: seconds}`` a JSON document records: a check report (its results' seconds), a
    merged report, a mutation matrix (its rows' seconds), or a plain mapping of ids to
    seconds.  A ValueError naming ``what`` for anything else."""
    if isinstance(data, dict) and isinstance(data.get("results"), list):  # a check report
        pairs = [(r.get("id"), r.get("seconds")) for r in data["results"]
                 if isinstance(r, dict)]
    elif isinstance(data, dict) and isinstance(data.get("rows"), dict):  # a mutation matrix
        pairs = [(k, v.get("seconds") if isinstance(v, dict) else None)
                 for k, v in data["rows"].items()]
    elif isinstance(data, dict):
        pairs = list(data.items())
    else:
        raise ValueError(f"{what}: expected a report, a mutation matrix or an object mapping "
                         f"ids to seconds, got {type(data).__name__}")
    out = {}
    for key, seconds in pairs:
        if not isinstance(key, str) or isinstance(seconds, bool) \
                or not isinstance(seconds, (int, float)) or not seconds >= 0:
            raise ValueError(f"{what}: expected ids mapped to seconds >= 0, got "
                             f"{key!r}: {seconds!r}")
        out[key] = float(seconds)
    return out


def read_durations(path, what: str = "--durations") -> dict[str, float]:
    """:func:`durations_from` a file (the guarded reader of the user's files)."""
    from minibert_reference.train.fileio import read_user_json

    return durations_from(read_user_json(path, "a report or a durations file"),
                          f"{what} {path}")


def default_check_durations() -> dict[str, float]:
    """The shipped durations of the checks on the reference ({} if the file is absent)."""
    if not DEFAULT_DURATIONS.exists():
        return {}
    return read_durations(DEFAULT_DURATIONS, "the default durations")


def weights(ids: Sequence[str], durations: Mapping[str, float]) -> list[float]:
    """Each id's weight: its recorded seconds, else the mean of the recorded seconds of the
    ids given (else :data:`FALLBACK_SECONDS`)."""
    known = [durations[i] for i in ids if i in durations]
    default = round(sum(known) / len(known), 6) if known else FALLBACK_SECONDS
    return [durations.get(i, default) for i in ids]


def partition(ids: Sequence[str], w: Sequence[float], n: int) -> list[list[str]]:
    """``ids`` dealt to ``n`` groups by weight: longest first (ties: the run's order), each to
    the group with the least total (ties: the lowest group); each group in the run's order.
    Deterministic: the same ids and weights give the same groups in every process."""
    if len(set(ids)) != len(ids):
        raise ValueError("partition: the ids must be distinct")
    heap = [(0.0, g) for g in range(n)]
    members: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(ids)), key=lambda i: (-w[i], i)):
        total, g = heapq.heappop(heap)
        members[g].append(i)
        heapq.heappush(heap, (total + w[i], g))
    return [[ids[i] for i in sorted(m)] for m in members]


def digest(obj) -> str:
    """sha256 of ``obj`` as canonical JSON (what two shards must agree on)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def shard_plan(ids: Sequence[str], durations: Mapping[str, float], k: int, n: int) -> dict:
    """Shard ``k`` of ``n`` of the run over ``ids``: ``{"index", "count", "selection" (every
    id of the whole run, in its order), "weights" (their digest), "items" (this shard's ids,
    in the run's order)}`` -- what the shard's record carries for the merge."""
    w = weights(ids, durations)
    groups = partition(list(ids), w, n)
    return {"index": k, "count": n, "selection": list(ids), "weights": digest(w),
            "items": groups[k - 1]}


def verify_shards(records: Sequence[tuple[str, dict]], schema: str, kind: str,
                  same: Sequence[str] = (), what: str = "minibert report merge"
                  ) -> list[tuple[str, dict]]:
    """The shard records ``(name, record)`` of one run, ordered by shard index; a ValueError
    naming the shards and the first thing they disagree on otherwise: a record that is not a
    shard of ``schema`` (``kind`` says what that is), one of its settings or of the ``same``
    keys (dotted paths into the record: the implementation) differing, another shard count,
    selection or durations, a shard missing or given twice, an item claimed by two shards or
    by none."""
    if not records:
        raise ValueError(f"{what}: expected at least one shard record")
    for name, rec in records:
        if not isinstance(rec, dict) or rec.get("schema") != schema:
            got = rec.get("schema") if isinstance(rec, dict) else type(rec).__name__
            raise ValueError(f"{name}: expected {kind} ({schema}), got {got!r}")
    keys = sorted({k for _, rec in records for k in (rec.get("settings") or {})})
    same = [*same, *(f"settings.{k}" for k in keys)]
    for name, rec in records:
        plan = rec.get("shard") if isinstance(rec, dict) else None
        if not isinstance(plan, dict) or not {"index", "count", "selection", "weights",
                                              "items"} <= set(plan):
            raise ValueError(f"{name}: expected the record of a shard (a run with --shard "
                             "k/N), got one without its shard plan")

    def at(rec, path):
        for part in path.split("."):
            rec = rec.get(part) if isinstance(rec, dict) else None
        return rec

    first_name, first = records[0]
    for key in [*same, "shard.count", "shard.selection", "shard.weights"]:
        for name, rec in records[1:]:
            if at(rec, key) != at(first, key):
                named = {"shard.selection": "the selected ids differ",
                         "shard.weights": "the durations they were dealt by differ"}
                why = named.get(key) or (f"{key} differs ({at(first, key)!r} vs "
                                         f"{at(rec, key)!r})")
                raise ValueError(f"{what}: {first_name} and {name} are not shards of one run: "
                                 f"{why}")
    n = first["shard"]["count"]
    by_index: dict[int, list[str]] = {}
    for name, rec in records:
        by_index.setdefault(rec["shard"]["index"], []).append(name)
    twice = {k: v for k, v in by_index.items() if len(v) > 1}
    if twice:
        k, names = sorted(twice.items())[0]
        raise ValueError(f"{what}: shard {k}/{n} given twice ({', '.join(names)})")
    missing = [k for k in range(1, n + 1) if k not in by_index]
    if missing:
        raise ValueError(f"{what}: shard{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(f'{k}/{n}' for k in missing)} missing (given: "
                         f"{', '.join(f'{k}/{n}' for k in sorted(by_index))})")
    owner: dict[str, str] = {}
    for name, rec in records:
        for item in rec["shard"]["items"]:
            if item in owner:
                raise ValueError(f"{what}: {item} is in two shards ({owner[item]} and {name})")
            owner[item] = name
    lost = [i for i in first["shard"]["selection"] if i not in owner]
    if lost:
        raise ValueError(f"{what}: {len(lost)} selected item(s) in no shard (first: {lost[0]})")
    return sorted(records, key=lambda nr: nr[1]["shard"]["index"])


def read_shards(paths: Sequence[str]) -> list[tuple[str, dict]]:
    """Each file as ``(path, JSON object)`` (the guarded reader of the user's files)."""
    from minibert_reference.train.fileio import read_user_json

    return [(str(p), read_user_json(p, "a shard's report (JSON)")) for p in paths]


def top_level_spec(module: str, paths: Sequence[str] = ()):
    """The import spec of ``module``'s top-level module or package, found without importing
    it (``paths`` appended to ``sys.path`` meanwhile); None when it is not found, or built
    in."""
    import importlib.util
    import sys

    saved = list(sys.path)
    try:
        sys.path.extend(p for p in paths if p not in sys.path)
        found = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved
    origin = getattr(found, "origin", None) if found else None
    return None if not origin or origin in ("built-in", "frozen") else found


def implementation_digest(module: str, paths: Sequence[str] = ()) -> str | None:
    """sha256 of the implementation's source (its module file, or every ``.py`` file of its
    top-level package), found without importing it: two shards of one run must judge the
    same code.  None when it cannot be found (then only its name is compared)."""
    found = top_level_spec(module, paths)
    if found is None:
        return None
    root = Path(found.origin).parent if found.submodule_search_locations else None
    files = sorted(root.rglob("*.py")) if root is not None else [Path(found.origin)]
    h = hashlib.sha256()
    for f in files:
        if "__pycache__" in f.parts:
            continue
        h.update((f.relative_to(root).as_posix() if root else f.name).encode())
        try:
            h.update(hashlib.sha256(f.read_bytes()).digest())
        except OSError:
            h.update(b"<unreadable>")
    return h.hexdigest()


# --------------------------------------------------------------------------- check reports
def merge_check_reports(records: Sequence[tuple[str, dict]]):
    """The one :class:`~minibert_spec.suite.report.CheckReport` that the shards ``(name, report
    JSON)`` of one ``minibert check --shard k/N`` run make: every check's result in the run's order,
    the shards' run notes (each naming its shard), a shard that could not load the implementation
    as the run's load error.  The grid, the verdicts and the exit status are recomputed from
    the results, by the code that computes the unsharded run's.  A ValueError naming the
    shards when they are not the shards of one run (:func:`verify_shards`)."""
    from minibert_spec.suite.report import SCHEMA, CheckReport

    ordered = verify_shards(records, SCHEMA, "a minibert check report", ["impl"])
    results, notes, load_errors, parts = {}, [], [], []
    for name, rec in ordered:
        k, n = rec["shard"]["index"], rec["shard"]["count"]
        try:
            part = CheckReport.from_json(rec)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{name}: expected a minibert check report, got one whose "
                             f"results cannot be read ({type(e).__name__}: {e})") from None
        # its seconds as a --durations file must hold them: the merge writes durations.json
        durations_from(rec, name)
        run_s = rec.get("seconds", 0.0)
        if isinstance(run_s, bool) or not (isinstance(run_s, (int, float)) and run_s >= 0):
            raise ValueError(f"{name}: expected the run's seconds >= 0, got "
                             f"{rec.get('seconds')!r}")
        parts.append({"shard": f"{k}/{n}", "file": name, "exit_code": part.exit_code(),
                      "seconds": round(part.seconds, 2),
                      "machine": part.provenance.get("machine"),
                      "date": part.provenance.get("date")})
        if part.load_error is not None:
            load_errors.append(f"shard {k}/{n}: {part.load_error}")
            continue
        got = [r.id for r in part.results]
        if sorted(got) != sorted(rec["shard"]["items"]):
            extra = sorted(set(got) - set(rec["shard"]["items"]))
            lost = sorted(set(rec["shard"]["items"]) - set(got))
            raise ValueError(f"{name}: its results are not the checks of its shard {k}/{n} "
                             f"({len(lost)} without a result, {len(extra)} not its own"
                             + (f"; first: {(lost or extra)[0]}" if lost or extra else "")
                             + ")")
        results.update((r.id, r) for r in part.results)
        notes += [f"shard {k}/{n}: {note}" for note in part.notes]
    first = CheckReport.from_json(ordered[0][1])
    selection = ordered[0][1]["shard"]["selection"]
    return CheckReport(first.impl, [] if load_errors else [results[i] for i in selection],
                  first.oracle, first.bad_input, notes,
                  max(p["seconds"] for p in parts), "; ".join(load_errors) or None,
                  first.provenance, first.settings, None, parts, first.thin,
                  first.depth)
