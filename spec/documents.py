"""The five source documents, section by section, in their own order.

Equations (``minibert_spec.equations``) and claims (``minibert_spec.claims``) cite their sources as
free text: ``"Mini-BERT derivation §3.3"``, ``"BERT masked-LM slides (steps 4-5)"``,
``"visual guide §2, §9"``.  :func:`locate` turns such a citation into (document, section) keys
of this table, so a report can list every equation and claim under the section that states it,
in the documents' order.  Numbered documents are located by their section numbers; the slides
and the blog have no numbers, so each label the spec uses is mapped to a section here
(``labels``).  Every citation in the spec must locate (tests/report/test_blueprint.py), so a typo in
a source never silently drops an equation from the report.

Section titles restate the documents' headings in our words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from minibert_spec.sources import BLOG, GUIDE, MINIBERT, SEED001, SLIDES


@dataclass(frozen=True)
class Section:
    key: str  # "3.3" for numbered documents, a slug otherwise
    title: str
    labels: tuple[str, ...] = ()  # the citation labels that mean this section

    @property
    def heading(self) -> str:
        return f"§{self.key} {self.title}" if self.key[0].isdigit() else self.title


@dataclass(frozen=True)
class Document:
    key: str  # short slug, used in anchors
    name: str  # the name citations start with
    what: str  # what it is, one line
    sections: tuple[Section, ...]
    numbered: bool = True
    source: bool = True  # one of the five source documents (False: other origins)

    def section(self, key: str) -> Section | None:
        return next((s for s in self.sections if s.key == key), None)


def _numbered(*pairs) -> tuple[Section, ...]:
    return tuple(Section(k, t) for k, t in pairs)


CLOSING = Section("closing", "Title and closing line", ("closing line", "title, closing line"))

DOCUMENTS: tuple[Document, ...] = (
    Document("minibert", MINIBERT,
             "Mathematical derivations for Mini-BERT (L=3, H=192, A=4, I=768, T=64, V=8192): "
             "forward, backward, MLM loss, Adam, schedule, clipping, accumulation, gradient "
             "checking, cost claims",
             _numbered(("1", "Architecture overview"), ("2", "Forward pass"),
                       ("2.1", "Input embeddings"), ("2.2", "Multi-head self-attention"),
                       ("2.3", "Layer normalization"), ("2.4", "Feed-forward network"),
                       ("2.5", "Transformer layer"), ("2.6", "MLM prediction head"),
                       ("3", "Backward pass"), ("3.1", "Linear layer gradients"),
                       ("3.2", "Softmax gradient"), ("3.3", "Layer normalization gradients"),
                       ("3.4", "Attention gradient flow"), ("3.5", "ReLU gradient"),
                       ("4", "Masked-LM loss"), ("4.1", "Cross-entropy loss"),
                       ("4.2", "MLM loss gradient"), ("5", "Optimization"),
                       ("5.1", "Adam update rules"), ("6", "Memory and compute"),
                       ("6.1", "Parameter memory"), ("6.2", "Activation memory"),
                       ("6.3", "Computational complexity"), ("7", "Numerical stability"),
                       ("7.1", "Softmax stability"), ("7.2", "LayerNorm stability"),
                       ("7.3", "Gradient clipping"), ("8", "Training dynamics"),
                       ("8.1", "Learning-rate schedule"), ("8.2", "Gradient accumulation"),
                       ("9", "Implementation verification"), ("9.1", "Gradient checking"))
             + (CLOSING,)),
    Document("seed001", SEED001,
             "A pure-NumPy Transformer encoder in LaTeX: sinusoidal positions, biased "
             "attention, post-LN, MSE reconstruction; 2 layers, d=64, 4 heads, d_ff=256",
             _numbered(("1", "Forward pass"), ("1.1", "Sinusoidal positional encoding"),
                       ("1.2", "Multi-head self-attention"), ("1.3", "Add and LayerNorm"),
                       ("1.4", "Feed-forward network"), ("2", "Backward pass"),
                       ("2.1", "Multi-head attention backward"), ("2.2", "LayerNorm backward"),
                       ("2.3", "Residual connections"), ("3", "Loss and top-level gradient"),
                       ("4", "Adam optimizer"), ("5", "Empirical results"))
             + (CLOSING,)),
    Document("slides", SLIDES,
             "Slides on BERT's masked-LM formulation: WordPiece tokens, single-head attention, "
             "summed cross-entropy over masked positions",
             (Section("tokens", "Notation, tokens and the vocabulary", ("tokens",)),
              Section("token-ids", "Token IDs and embedding vectors",
                      ("token IDs and embedding vectors",)),
              Section("input-embedding", "Input embedding construction",
                      ("input embedding construction",)),
              Section("embedding-space", "The embedding space and how it is learnt",
                      ("embedding space", "embedding update")),
              Section("step-1", "Step 1: input embedding", ("step 1",)),
              Section("step-2", "Step 2: the encoder layer", ("step 2",)),
              Section("ffn", "Feed-forward network", ("FFN",)),
              Section("step-3", "Step 3: final output", ("step 3",)),
              Section("step-4", "Step 4: vocabulary projection", ("step 4", "steps 4-5")),
              Section("step-5", "Step 5: cross-entropy loss", ("step 5",)),
              Section("attention", "Attention, step by step",
                      ("basic formula", "attention, step 2", "steps 2-3, full interpretation",
                       "full interpretation"))),
             numbered=False),
    Document("blog", BLOG,
             "A blog post on the BERT-base forward pass: 12 layers, 12 heads, 768/3072, 512 "
             "positions, tanh pooler and classifier",
             (Section("initialize", "Initialize: parameters and shapes", ("initialize",)),
              Section("forward", "Forward algorithm", ("forward", "forward algorithm")),
              Section("final", "Final step: pooler and classifier", ("final",))),
             numbered=False),
    Document("guide", GUIDE,
             "A visual guide to Mini-BERT: shapes, the attention picture, an MLM example, "
             "timing and memory claims",
             _numbered(("1", "The big picture"), ("2", "Dimensions"),
                       ("3", "Inside multi-head attention"), ("4", "Attention visualization"),
                       ("5", "Feed-forward network"), ("6", "Training with MLM"),
                       ("7", "Key mathematical operations"), ("8", "Memory layout"),
                       ("9", "Quick reference"), ("10", "Common patterns"))),
    Document("bert", "BERT",
             "Original BERT as Hugging Face implements it (not one of the five documents): "
             "what the reference adds to run real checkpoints",
             (Section("embeddings", "Embeddings: segments and the embedding LayerNorm",
                      ("segment embeddings", "embeddings.LayerNorm")),
              Section("activation", "The GELU activation", ("Hugging Face hidden_act",)),
              Section("mlm-head", "The MLM head and its tied decoder",
                      ("cls.predictions, tied decoder",))),
             numbered=False, source=False),
    Document("project", "project convention",
             "Choices of this project that no document states",
             (Section("convention", "Project conventions",
                      ("BERT's optimizer; not in the five documents",)),
              Section("variants", "Protocol variants of real implementations",
                      ("protocol variants of real code; not in the five documents",))),
             numbered=False, source=False),
)

BY_NAME = {d.name: d for d in DOCUMENTS}
BY_KEY = {d.key: d for d in DOCUMENTS}


class UnknownSource(ValueError):
    """A citation names no document or no section of this table."""


def _document(part: str) -> tuple[Document, str]:
    """The document a citation starts with (the longest name matches) and the rest."""
    for doc in sorted(DOCUMENTS, key=lambda d: -len(d.name)):
        if part == doc.name or part.startswith(doc.name + " "):
            return doc, part[len(doc.name):].strip()
    raise UnknownSource(f"source {part!r}: expected it to start with one of "
                        f"{[d.name for d in DOCUMENTS]}")


def _label_section(doc: Document, label: str, part: str) -> Section:
    for s in doc.sections:
        if label in s.labels:
            return s
    raise UnknownSource(f"source {part!r}: {label!r} is not a section label of "
                        f"{doc.name!r} (spec/documents.py)")


def _parts(source: str) -> list[str]:
    """Split at the '; ' that separate citations (not those inside a parenthesis)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(source):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == ";" and depth == 0:
            parts.append(source[start:i])
            start = i + 1
    parts.append(source[start:])
    return [p.strip() for p in parts if p.strip()]


def locate(source: str) -> list[tuple[str, str]]:
    """A citation (one or several joined by '; ') -> [(document key, section key)], in the
    order cited, without repeats.  Raises :class:`UnknownSource` for a document or section
    this table does not have."""
    out: list[tuple[str, str]] = []
    for part in _parts(source):
        doc, rest = _document(part)
        numbers = re.findall(r"§\s*(\d+(?:\.\d+)*)", rest)  # "§1-2.2" cites from §1
        label = re.search(r"\(([^()]*)\)\s*$", rest)
        if numbers:
            if not doc.numbered:
                raise UnknownSource(f"source {part!r}: {doc.name!r} has no numbered sections")
            keys = []
            for n in numbers:
                if doc.section(n) is None:
                    raise UnknownSource(f"source {part!r}: {doc.name!r} has no §{n} "
                                        "(spec/documents.py)")
                keys.append(n)
        elif label:
            keys = [_label_section(doc, label.group(1), part).key]
        else:
            raise UnknownSource(f"source {part!r}: expected §N or (section label) after the "
                                "document's name")
        for k in keys:
            if (doc.key, k) not in out:
                out.append((doc.key, k))
    return out
