"""minibert_reference.parallel: results in order whatever the scheduling, every task finished before
an error leaves pmap (the first error in item order, BaseException included), no nested
parallelism, shards and groups cut from the count alone, and the count's validation."""

from __future__ import annotations

import threading
import time

import pytest

from minibert_reference import parallel


def test_pmap_returns_in_item_order_and_uses_the_workers():
    seen = set()

    def slow_first(i):
        seen.add(threading.get_ident())
        time.sleep(0.02 if i == 0 else 0.0)  # item 0 finishes last
        return i * i

    with parallel.workers(3):
        assert parallel.pmap(slow_first, range(7)) == [i * i for i in range(7)]
    assert len(seen) > 1  # really concurrent, not a loop in disguise
    with parallel.workers(1):
        seen.clear()
        assert parallel.pmap(slow_first, range(4)) == [0, 1, 4, 9]
        assert seen == {threading.get_ident()}


@pytest.mark.parametrize("exc", [ValueError("boom"), KeyboardInterrupt(), SystemExit(3)])
@pytest.mark.parametrize("raiser", [0, 1])  # the caller's own item, or a worker's
def test_first_error_in_item_order_after_every_task_finished(exc, raiser):
    finished = []

    def task(i):
        if i == raiser:
            raise exc
        if i == 2:
            raise RuntimeError("a later item's error")
        time.sleep(0.1 if i == 3 else 0.0)  # the last item outlives the errors by far
        finished.append(i)
        return i

    with parallel.workers(2):  # (leaving this block would wait for the pool's tasks itself)
        with pytest.raises(type(exc)):
            parallel.pmap(task, range(4))
        assert 3 in finished  # no task outlived the call


def test_nested_pmap_runs_inline():
    def inner(i):
        return threading.get_ident()

    def outer(i):
        return set(parallel.pmap(inner, range(3)))

    with parallel.workers(2):
        for idents in parallel.pmap(outer, range(2)):
            assert len(idents) == 1  # a worker's own items run in that worker


def test_row_shards_and_balanced_groups_depend_on_the_count_only():
    assert parallel.row_shards(8, 2) == [slice(0, 4), slice(4, 8)]
    assert parallel.row_shards(5, 3) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert parallel.row_shards(2, 4) == [slice(0, 1), slice(1, 2)]  # never an empty shard
    with parallel.workers(3):
        assert parallel.row_shards(9) == [slice(0, 3), slice(3, 6), slice(6, 9)]
    groups = parallel.balanced_groups([10, 1, 1, 9, 2, 3], 2)
    assert sorted(i for g in groups for i in g) == list(range(6))
    loads = [sum([10, 1, 1, 9, 2, 3][i] for i in g) for g in groups]
    assert max(loads) - min(loads) <= 2
    assert parallel.balanced_groups([5], 4) == [[0]]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_worker_count_is_validated(bad):
    with pytest.raises(ValueError, match="n: expected a positive integer"):
        parallel.set_workers(bad)


def test_workers_context_restores_the_count():
    before = parallel.get_workers()
    with parallel.workers(before + 2):
        assert parallel.get_workers() == before + 2
    assert parallel.get_workers() == before
