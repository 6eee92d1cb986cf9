"""The checker: measures each of the paper's bounds and premises on a run, and reports.

It reads the codec's results and the model; it never mutates them, and the core never imports
it. Entry points: ``check_text_tokens``, ``check_skv`` and ``render_markdown``.
"""

from seqkv.checker.checks import Check, CheckInputs, CodeLengths, evaluate
from seqkv.checker.report import render_markdown
from seqkv.checker.run import CheckOptions, CheckReport, check_skv, check_text_tokens

__all__ = [
    "Check",
    "CheckInputs",
    "CheckOptions",
    "CheckReport",
    "CodeLengths",
    "check_skv",
    "check_text_tokens",
    "evaluate",
    "render_markdown",
]
