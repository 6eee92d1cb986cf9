"""The ``SEQKV_*`` environment variables, read and checked in one place.

Motivation: a variable set to a value seqkv does not know must not be taken for another value
(read as a path, a misspelt ``SEQKV_MODEL_CACHE=of`` would name a cache folder ``of`` below
whatever folder the process runs in; ``SEQKV_TIMING_HISTORY=off`` was read as "use the
history"). Each reader here returns the value or raises ``EnvironmentVariableError``, one line
naming the variable and what it accepts (the CLI prints it as its one ``seqkv: error:`` line,
exit status 2). A path may start with ``~`` (the home folder).

The variables (each read at call time, nothing cached):

    SEQKV_MODEL_CACHE         off (also 0, no, false) or an absolute folder path
                              (``seqkv.models.gguf_cache``)
    SEQKV_HOME                an absolute folder path (``seqkv.descriptions``)
    SEQKV_VLLM_TRACE          an absolute file path (``seqkv.integrations.vllm``)
    SEQKV_TIMING_HISTORY      none (``seqkv.bench.timing``)
    SEQKV_TIMING_INJECT       NAME=FACTOR,... (checked by ``seqkv.bench.timing``)
    SEQKV_KERNELS             auto, torch or triton (checked by ``seqkv.kernels.dispatch``)
    SEQKV_INTEGER_BACKEND,    checked by ``seqkv.models.integer.native``
    SEQKV_INTEGER_ISA,
    SEQKV_NATIVE_DIR

Invariants:
1. A variable that is unset, empty or only blanks reads as unset (enforced).
2. Any other value is one the variable accepts, or ``EnvironmentVariableError`` (enforced; one
   test per variable in ``tests/test_environment.py``).
3. This module imports nothing of seqkv but ``seqkv.errors`` (layer 0: every layer may read the
   environment through it).
"""

from __future__ import annotations

import os
from pathlib import Path

from seqkv.errors import EnvironmentVariableError

OFF_WORDS = ("off", "0", "no", "false")


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None or not value.strip() else value.strip()


def choice(name: str, accepted: tuple[str, ...]) -> str | None:
    """``$name`` (case-insensitive) if it is one of ``accepted``, None if unset.

    >>> os.environ["SEQKV_EXAMPLE"] = "NONE"
    >>> choice("SEQKV_EXAMPLE", ("none",))
    'none'
    >>> choice("SEQKV_EXAMPLE", ("all",))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    seqkv.errors.EnvironmentVariableError: SEQKV_EXAMPLE='NONE' is not accepted: set it to all, ...
    >>> del os.environ["SEQKV_EXAMPLE"]
    """
    raw = _raw(name)
    if raw is None:
        return None
    if raw.lower() not in accepted:
        raise EnvironmentVariableError(f"{name}={raw!r} is not accepted: set it to "
                                       f"{', '.join(accepted)}, or unset it")
    return raw.lower()


def switched_off(name: str) -> bool:
    """Whether ``$name`` is one of ``OFF_WORDS`` (case-insensitive)."""
    raw = _raw(name)
    return raw is not None and raw.lower() in OFF_WORDS


def path(name: str, what: str = "folder", off: bool = False) -> Path | None:
    """``$name`` as an absolute path, None if unset; with ``off``, also None for an off word
    (``OFF_WORDS``)."""
    raw = _raw(name)
    if raw is None or (off and raw.lower() in OFF_WORDS):
        return None
    accepted = f"{'off or ' if off else ''}an absolute {what} path"
    if "\0" in raw or not os.path.isabs(os.path.expanduser(raw)):
        raise EnvironmentVariableError(f"{name}={raw!r} is not accepted: set it to {accepted}, "
                                       "or unset it")
    return Path(os.path.expanduser(raw))
