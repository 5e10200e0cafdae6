"""The thread policy (reference/train/threads.py): explicit counts are honoured, 'auto' is the
available cores, the policy really reaches the BLAS (threadpoolctl: single-threaded) and the
workers (minibert_reference.parallel), and a checkpoint's recorded counts are read back for a
bit-exact
resume."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from minibert_reference import parallel
from minibert_reference.train import threads as TH


def blas_counts() -> set[int]:
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", 0, " 2x"])
def test_threads_flag_rejects_what_is_not_auto_or_positive(bad):
    with pytest.raises(ValueError, match="--threads"):
        TH.parse_threads(bad)


def test_explicit_count_sets_the_workers_and_single_threaded_blas():
    assert TH.choose("1") == 1 and TH.choose(3) == 3
    before = parallel.get_workers()
    for n in (1, 2, 3):
        with TH.use_threads(n):
            assert blas_counts() == {1} and parallel.get_workers() == n
    assert parallel.get_workers() == before


def test_auto_is_the_available_cores(monkeypatch):
    monkeypatch.setattr(TH, "available_cores", lambda: 5)
    assert TH.choose("auto") == 5 and TH.choose(None) == 5


def test_keep_freed_memory_applies_on_glibc():
    import platform

    ok = TH.keep_freed_memory()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert ok


def test_probe_measures_every_candidate():
    timings = TH.probe([1, 2], rounds=1)
    assert set(timings) == {1, 2} and all(np.isfinite(t) and t > 0 for t in timings.values())


def test_checkpoint_records_the_counts_it_ran_with(tmp_path):
    from minibert_reference import adam_init, init_params, mini_bert
    from minibert_reference.train.checkpoint import recorded_threads, save_checkpoint

    config = mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                       vocab_size=16)
    params = init_params(config, seed=0, dtype=np.float64)
    path = str(tmp_path / "ck.safetensors")
    with TH.use_threads(2):
        save_checkpoint(path, params, adam_init(params), rng_state="{}",
                        model_config=config.to_dict())
    assert recorded_threads(path) == {"workers": 2, "blas": 1}
    assert recorded_threads(str(tmp_path / "missing.safetensors")) is None
