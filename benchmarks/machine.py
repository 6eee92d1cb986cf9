"""The load average as a benchmark's JSON prints it; a report states its whole run with
``seqkv.provenance.start_run``."""

from __future__ import annotations

from seqkv import provenance


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, or ``unavailable`` where the platform has none."""
    load = provenance.load_average()
    return "unavailable" if load is None else " ".join(f"{x:.2f}" for x in load)
