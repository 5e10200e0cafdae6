"""The five source documents of the specification, named once.

Equations (``spec/equations/``) and claims (``spec/claims/``) cite a document by these names plus
a section ("Mini-BERT derivation §3.3"); the documents themselves are not part of the project.
"""

from __future__ import annotations

MINIBERT = "Mini-BERT derivation"  # L=3, H=192, A=4, I=768, T=64, V=8192: forward, backward, MLM
SEED001 = "NumPy-Transformer document"  # sinusoidal PE, biased MHA, post-LN, MSE reconstruction
SLIDES = "BERT masked-LM slides"  # WordPiece, single-head attention, summed masked CE
BLOG = "BERT-base blog"  # 12 layers, 12 heads, 768/3072, 512 positions, tanh pooler
GUIDE = "visual guide"  # Mini-BERT's shapes, attention picture, MLM example, timing, memory

DOCUMENTS = (MINIBERT, SEED001, SLIDES, BLOG, GUIDE)
# what the protocol's variants cite (spec/documents.py "project convention"): the forms real
# implementations take (GPT-style blocks, losses on probabilities), stated by no document
PROTOCOL_VARIANTS = "project convention (protocol variants of real code; not in the five documents)"
