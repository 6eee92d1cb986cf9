"""The texts seqkv ships in ``seqkv/data``, one of each kind: what every bench and gate codes.

The prose sample (586 tokens with SmolLM2-135M) and a text each of code, legal and technical
prose (about 2,000 tokens each).
"""

from __future__ import annotations

import importlib.resources

TEXT_FILES = {"prose": "sample.txt", "code": "kinds/code.txt", "legal": "kinds/legal.txt",
              "technical": "kinds/technical.txt"}


def shipped_text(kind: str) -> str:
    """One of the shipped texts, by kind (``TEXT_FILES``)."""
    return (importlib.resources.files("seqkv") / "data" / TEXT_FILES[kind]).read_text("utf-8")
