"""What every ``seqkv`` verb shares: loading the model, reading inputs, writing outputs,
printing figures, and the options that recur."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from seqkv.errors import EmptyInputError
from seqkv.levels import CodingLevel, parse_level
from seqkv.models import CausalLM, load_default_model, load_model

MODEL_HELP = "local HF model folder or .gguf file (default: embedded SmolLM2-135M-Instruct)"


def load(model_path: str | None) -> CausalLM:
    """The model a verb runs on: ``--model PATH`` or the embedded default."""
    return load_default_model() if model_path is None else load_model(model_path)


def model_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--model", metavar="PATH", default=None, help=MODEL_HELP)


def json_option(command: argparse.ArgumentParser, what: str = "one JSON object") -> None:
    command.add_argument("--json", action="store_true", help=f"print {what}")


def read_text(path: str) -> str:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    if not text:
        raise EmptyInputError(f"{path} is empty: there is nothing to compress")
    return text


def read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def write_text(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    target = Path(path)
    temporary = target.with_name(f".{target.name}.seqkv-tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(target)


def level_argument(text: str) -> CodingLevel:
    try:
        return parse_level(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def print_figures(figures: dict[str, object], as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(figures, default=str))
        return
    table = Table(title=title, show_header=False)
    for key, value in figures.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    Console().print(table)
