"""The default training corpus: English prose that every Python installation already ships.

No download: the text comes from ``pydoc_data.topics`` (the language reference topics that
``help()`` shows) and the docstrings of the standard library's own source files, read with
``ast`` (never imported, so no module runs).  Paragraphs are normalised, filtered to prose (code
examples and tables dropped) and deduplicated.  The exact text depends on the Python version, so
a run directory keeps a copy (``corpus.txt``) and ``--resume`` reads that copy.

A paragraph goes to the held-out set when a hash of its text says so: the split is the same on
every machine that builds the same paragraphs, and no paragraph is in both sets.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sysconfig
from collections.abc import Iterable

from minibert_reference.train.fileio import read_user_text

# Directories of the standard library whose docstrings are not prose worth learning from.
_SKIP_DIRS = {"test", "tests", "site-packages", "dist-packages", "idlelib", "lib2to3",
              "__pycache__", "turtledemo", "ensurepip", "venv"}
_WS = re.compile(r"\s+")


def _docstrings(root: str) -> Iterable[str]:
    """Module, class and function docstrings of every .py file under ``root``, in sorted order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, name), encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
            except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc:
                        yield doc


def is_prose(paragraph: str, *, min_words: int = 6) -> bool:
    """Mostly letters and spaces, enough words, not an interactive session or a table."""
    if paragraph.startswith((">>>", "...", "$", "+--", "==", "--")):
        return False
    words = paragraph.split()
    if len(words) < min_words:
        return False
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return letters >= 0.85 * len(paragraph)


def paragraphs(texts: Iterable[str]) -> list[str]:
    """Blank-line separated paragraphs, whitespace collapsed, prose only, first occurrence of each
    (case-insensitive) kept, in input order."""
    seen: set[str] = set()
    out = []
    for text in texts:
        for block in re.split(r"\n\s*\n", text):
            para = _WS.sub(" ", block).strip()
            key = para.casefold()
            if not para or key in seen or not is_prose(para):
                continue
            seen.add(key)
            out.append(para)
    return out


def default_texts() -> list[str]:
    """The raw texts of the default corpus: pydoc topics, then standard-library docstrings."""
    texts: list[str] = []
    try:
        from pydoc_data.topics import topics
        texts.extend(topics[k] for k in sorted(topics))
    except ImportError:  # some distributions strip pydoc_data
        pass
    texts.extend(_docstrings(sysconfig.get_paths()["stdlib"]))
    return texts


def default_corpus() -> list[str]:
    """Deduplicated prose paragraphs of the default corpus."""
    paras = paragraphs(default_texts())
    if not paras:
        raise RuntimeError("default corpus: found no prose in pydoc_data or the standard "
                           "library sources; pass text files instead")
    return paras


def read_corpus(paths: Iterable[str]) -> list[str]:
    """Deduplicated prose paragraphs of the text files the user names (UTF-8)."""
    texts = [read_user_text(p, "a UTF-8 text file (--files)", max_bytes=None, empty_ok=True)
             for p in paths]
    paras = paragraphs(texts)
    if not paras:
        raise ValueError(f"paths: expected text files with prose paragraphs, found none in "
                         f"{list(paths)}")
    return paras


def is_heldout(paragraph: str, fraction: float = 0.05) -> bool:
    """Deterministic split by a hash of the paragraph's text (not Python's salted hash())."""
    h = int.from_bytes(hashlib.sha1(paragraph.encode("utf-8")).digest()[:8], "big")
    return h < fraction * 2 ** 64


def split(paras: list[str], fraction: float = 0.05) -> tuple[list[str], list[str]]:
    """(train, held_out) paragraphs."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction: expected a value in (0, 1), got {fraction!r}")
    train = [p for p in paras if not is_heldout(p, fraction)]
    held = [p for p in paras if is_heldout(p, fraction)]
    if not train or not held:
        raise ValueError(f"paras: {len(paras)} paragraphs give an empty train or held-out set "
                         f"at fraction {fraction}; expected more text")
    return train, held
