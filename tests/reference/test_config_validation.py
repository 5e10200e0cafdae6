"""BertConfig refuses bad values naming the field (H not divisible by A, non-positive sizes,
unknown options)."""

from __future__ import annotations

import pytest

from minibert_reference.config import BertConfig, mini_bert


def raises(arg):
    return pytest.raises(ValueError, match=rf"^{arg}(?!\w)")


@pytest.mark.parametrize("field,value", [
    ("n_heads", 5), ("n_heads", 0), ("hidden", 0), ("vocab_size", -1), ("max_len", 2.5),
    ("position", "rotary"), ("head", "cls"), ("ln_eps", -1e-5), ("init_std", 0.0),
])
def test_config_rejects_bad_values(field, value):
    """H not divisible by A, non-positive sizes, unknown options."""
    with raises(field):
        BertConfig(**{**mini_bert().to_dict(), "hidden": 12, field: value})


