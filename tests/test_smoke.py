"""The whole-model gradient check the CLI runs, as a test (float64, both presets)."""

import pytest

from reference.config import PRESETS
from spec.gradcheck import assert_all_passed, model_gradcheck

# bert_base (110M parameters) is built and run by tests/test_bert.py; finite differences and
# float64 identities over it are out of reach here
SMALL_PRESETS = sorted(p for p in PRESETS if p != "bert_base")


@pytest.mark.parametrize("preset", SMALL_PRESETS)
def test_model_gradcheck(impl, preset):
    results = model_gradcheck(impl, PRESETS[preset](), B=2, T=8, seed=0, n_dirs=1)
    assert len(results) == len(impl.param_shapes(PRESETS[preset]())) + 1
    assert_all_passed(results)
