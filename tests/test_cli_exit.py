"""A verb's process ends cleanly: what it froze out of the garbage collector is collected at
exit (frozen cycles were never freed, and triton's bindings then printed ~27 lines of "nanobind:
leaked ..." on stderr after every verb)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent("""
    import argparse
    import os

    import seqkv.cli.common as common


    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            os.write(1, b"collected\\n")


    held = [Cycle()]  # alive while the verb loads its model: frozen with it
    common.load = lambda path: object()  # no model needed to freeze what is alive
    common.load_for(argparse.Namespace(model=None, progress=True, freeze_after_load=True))
    held.clear()  # garbage now, in a frozen cycle
""")


def test_what_a_verb_froze_after_loading_is_collected_at_exit() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.splitlines() == ["collected"]
