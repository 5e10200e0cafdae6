"""Claims of the BERT masked-LM slides: the vocabulary size and the FFN width."""

from __future__ import annotations

from minibert_spec.claims import Result, claim
from minibert_spec.sources import SLIDES


@claim("slides.vocab", "BERT's vocabulary has 30,522 WordPiece tokens", f"{SLIDES} (tokens)",
       "30,522", "not reproducible")
def _slides_vocab(ctx):
    return Result("-", "not reproducible",
                  "needs the released BERT vocabulary file; the project ships none and builds "
                  "its own tokenizers (the tokenizers package has no bundled vocabularies)")


@claim("slides.dff", "The FFN width is typically 4d", f"{SLIDES} (FFN)", "d_ff = 4d",
       "confirmed")
def _slides_dff(ctx):
    bert = ctx.bert_base_sizes
    shapes = ctx.impl.param_shapes(bert)
    mini = ctx.params["layers.0.ffn.W_1"].shape
    ratios = (shapes["layers.0.ffn.W_1"][1] / bert.hidden, mini[1] / mini[0])
    return Result(f"BERT-base {ratios[0]:g}d, Mini-BERT {ratios[1]:g}d",
                  "confirmed" if ratios == (4, 4) else "refuted")
