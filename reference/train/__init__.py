"""Training tooling around the maths: corpus, WordPiece tokenizer and MLM masking (``data``,
``corpus``), checkpoints (``checkpoint``, safetensors), plots (``plots``, matplotlib) and the
training loop (``loop``).  These may use the libraries declared in the ``train`` extra; the
maths modules of ``minibert_reference`` never import this sub-package."""
