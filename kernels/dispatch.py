"""The one dispatch point between seqkv's Triton kernels and their pure-torch references.

Motivation: every op in :mod:`seqkv.kernels` exists twice, as a Triton kernel (``triton.py``) and
as a torch reference (``naive.py``) that is also the CPU path. Which one runs is decided here and
nowhere else, so that a user can force either with one switch and a test can pin the backend.
The quantizers (:mod:`seqkv.quantizers`) call the ops for every quantize and dequantize, so this
rule is also what decides how a quantizer computes: the reference on a CPU, the kernel on a GPU.

Rules (:func:`resolve_backend`):

- ``"torch"``: the reference, on any device.
- ``"triton"``: the kernel. It needs the ``triton`` package, and CUDA tensors or Triton's CPU
  interpreter (``TRITON_INTERPRET=1``, slow: for tests). Anything missing raises
  :class:`KernelUnavailableError`; a configuration the kernel does not implement raises
  :class:`UnsupportedKernelInputError` naming what to change. An unknown backend name raises
  ``seqkv.errors.KernelBackendError``.
- ``"auto"``: the kernel when every tensor is on a CUDA device, ``triton`` is installed and the
  kernel implements the configuration; the reference otherwise.

The backend comes from the function argument when one is given, else from the environment
variable ``SEQKV_KERNELS`` (``torch``, ``triton`` or ``auto``), else ``"auto"``. The variable is
read at every call, never at import.

Invariants:
1. Importing this module (and :mod:`seqkv.kernels`) never imports ``triton`` (enforced: the
   ``triton.py`` modules are imported inside the op functions, after dispatch chose them;
   checked: ``tests/test_kernels_dispatch.py`` imports ``seqkv.kernels`` and runs an op in a
   fresh interpreter where ``triton`` cannot be imported, then inspects ``sys.modules``).
   NOTE: torch and transformers import ``triton`` themselves when it is installed; what matters
   is that seqkv never needs it.
2. ``"torch"`` never touches ``triton`` (enforced by construction), and neither does ``"auto"``
   on CPU tensors: the reference is the CPU path (checked: ``tests/test_kernels_wiring.py``
   spies on both implementations of every op through every quantizer).
3. The environment is read at call time and nothing is cached between calls (enforced: no
   module-level mutable state).
4. ``TRITON_INTERPRET`` is read by Triton when a kernel module is first imported; changing it
   afterwards in the same process has no effect on kernels already imported (assumed; the tests
   set it before any kernel runs).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Literal, get_args

import torch

from seqkv.errors import KernelBackendError, SeqKVError

KernelBackend = Literal["auto", "triton", "torch"]
"""What a caller may ask for: ``"auto"`` picks per call (see the module docstring)."""

ResolvedBackend = Literal["triton", "torch"]
"""What actually runs."""

ENV_VAR = "SEQKV_KERNELS"
"""Environment variable read at call time when no backend argument is given."""

_TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y"})
"""Values Triton itself reads as true for ``TRITON_INTERPRET``."""


class KernelUnavailableError(SeqKVError, RuntimeError):
    """The Triton backend was forced but cannot run here (no triton, or no CUDA/interpreter)."""


class UnsupportedKernelInputError(SeqKVError, ValueError):
    """The Triton backend was forced for an input its kernel does not implement."""


def requested_backend(backend: KernelBackend | None = None) -> KernelBackend:
    """The backend asked for: the argument if given, else ``$SEQKV_KERNELS``, else ``"auto"``.

    >>> requested_backend("torch")
    'torch'
    """
    choices: tuple[KernelBackend, ...] = get_args(KernelBackend)
    if backend is not None:
        if backend not in choices:
            raise KernelBackendError(
                f"backend must be one of {', '.join(choices)}; got {backend!r}"
            )
        return backend
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if not raw:
        return "auto"
    for choice in choices:
        if raw == choice:
            return choice
    raise KernelBackendError(
        f"{ENV_VAR}={raw!r} is not a kernel backend; set it to one of {', '.join(choices)} "
        "or unset it"
    )


def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def on_cuda(*tensors: torch.Tensor) -> bool:
    """Whether there is at least one tensor and every one lives on a CUDA device."""
    return bool(tensors) and all(t.is_cuda for t in tensors)


def interpreter_enabled() -> bool:
    """Whether ``TRITON_INTERPRET`` asks Triton to run kernels on the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE_WORDS


def resolve_backend(
    backend: KernelBackend | None,
    *tensors: torch.Tensor,
    unsupported: str | None = None,
) -> ResolvedBackend:
    """Decide which implementation runs for these input tensors.

    ``unsupported`` is the op's reason why its kernel cannot handle this configuration
    (``None``: it can). ``"auto"`` then falls back to the reference; ``"triton"`` raises.

    >>> resolve_backend("torch", torch.zeros(2))
    'torch'
    >>> resolve_backend("auto", torch.zeros(2))  # CPU tensors: the reference
    'torch'
    """
    asked = requested_backend(backend)
    if asked == "torch":
        return "torch"
    cuda = on_cuda(*tensors)
    if asked == "auto":
        if cuda and unsupported is None and triton_available():
            return "triton"
        return "torch"
    if not triton_available():
        raise KernelUnavailableError(
            "backend 'triton' needs the triton package; install it (pip install triton) or use "
            f"backend='torch' / {ENV_VAR}=torch"
        )
    if not cuda and not interpreter_enabled():
        raise KernelUnavailableError(
            "backend 'triton' runs on CUDA tensors; move the inputs to a GPU, or set "
            "TRITON_INTERPRET=1 before the first kernel call to use Triton's (slow) CPU "
            "interpreter"
        )
    if unsupported is not None:
        raise UnsupportedKernelInputError(
            f"the Triton kernel does not support this input: {unsupported}"
        )
    return "triton"
