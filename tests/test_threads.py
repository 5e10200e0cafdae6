"""The BLAS thread policy (reference/train/threads.py): explicit counts are honoured, 'auto'
picks one of the probed counts, the count really reaches the BLAS (threadpoolctl), and a
checkpoint's recorded count is read back for a bit-exact resume."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from reference.train import threads as TH


def blas_counts() -> set[int]:
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", 0, " 2x"])
def test_threads_flag_rejects_what_is_not_auto_or_positive(bad):
    with pytest.raises(ValueError, match="--threads"):
        TH.parse_threads(bad)


def test_explicit_count_is_used_and_reaches_the_blas():
    assert TH.choose("1") == 1 and TH.choose(3) == 3
    with TH.blas_threads(1):
        assert blas_counts() == {1}
    with TH.blas_threads(2):
        assert blas_counts() == {2}


def test_auto_picks_a_probed_count_near_the_fastest(monkeypatch):
    monkeypatch.setattr(TH, "probe", lambda: {1: 1.0, 2: 0.5})
    assert TH.choose("auto") == 2
    monkeypatch.setattr(TH, "probe", lambda: {1: 1.0, 2: 3.0})  # a busy machine
    assert TH.choose("auto") == 1
    monkeypatch.setattr(TH, "probe", lambda: {1: 1.0, 2: 0.95})  # a near-tie: fewer threads
    assert TH.choose("auto") == 1


def test_probe_measures_every_candidate():
    timings = TH.probe([1, 2], rounds=1)
    assert set(timings) == {1, 2} and all(np.isfinite(t) and t > 0 for t in timings.values())


def test_checkpoint_records_the_count_it_ran_with(tmp_path):
    from reference import adam_init, init_params, mini_bert
    from reference.train.checkpoint import recorded_blas_threads, save_checkpoint

    config = mini_bert(n_layers=1, hidden=8, n_heads=2, intermediate=16, max_len=8,
                       vocab_size=16)
    params = init_params(config, seed=0, dtype=np.float64)
    path = str(tmp_path / "ck.safetensors")
    with TH.blas_threads(1):
        save_checkpoint(path, params, adam_init(params), rng_state="{}",
                        model_config=config.to_dict())
    assert recorded_blas_threads(path) == 1
    assert recorded_blas_threads(str(tmp_path / "missing.safetensors")) is None
