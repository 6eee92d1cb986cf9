"""The instruction sets of native.c that this CPU runs, best first: the tests force each in turn
(the ``isa`` fixture of ``tests/conftest.py``). A path this CPU cannot run is built, not run, by
``tests/test_integer_native.py``."""

from __future__ import annotations

from seqkv.models.integer import native

CPU_ISAS = native.cpu_isas()
