"""What every benchmark report states about where it ran: the CPU, torch, the load."""

from __future__ import annotations

import os
import platform

import torch

from seqkv.schedule import cpu_model


def describe_machine() -> str:
    """CPU count, architecture, CPU model and vector extension, torch version."""
    return (f"{os.cpu_count()} CPU cores ({platform.machine()}, {cpu_model()}, "
            f"{torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}")


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, as a report prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
