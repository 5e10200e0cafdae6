"""An adapter that re-exports the reference's own ops (issue 24): every check must be green on it
under any seed -- a red here is a false verdict of the suite, not a bug of the code."""

from minibert_reference import accumulate_gradients, bert_tiny, load_pretrained, save_pretrained  # noqa: F401
from minibert_reference.model import *  # noqa: F403
from minibert_reference.ops import *  # noqa: F403
from minibert_reference.optim import *  # noqa: F403
