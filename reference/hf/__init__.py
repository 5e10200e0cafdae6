"""Hugging Face BERT interoperability: checkpoints in and out (``checkpoint``) and the WordPiece
tokenizer of a checkpoint directory (``tokenizer``).

Tooling, not maths: it uses ``safetensors`` (and ``tokenizers``) from the ``train`` extra, and
never ``torch`` or ``transformers`` -- a checkpoint is read as NumPy arrays and nothing here
touches the network.  The maths modules of ``minibert_reference`` never import this package.
"""

from minibert_reference.hf.checkpoint import (
    config_from_hf,
    config_to_hf,
    load_pretrained,
    save_pretrained,
)

__all__ = ["config_from_hf", "config_to_hf", "load_pretrained", "save_pretrained"]
