"""The execution profile: what a decoder must reproduce to get the encoder's probabilities.

Arithmetic decoding needs, at every position, bit-identical next-token probabilities on both
sides. On CPU, measured on SmolLM2-135M: a full prefill, token-by-token steps and chunked forwards
differ by up to ~1e-4 in the logits, and token-by-token steps with 1 vs 2 intra-op threads differ
by ~4e-5; repeating one schedule with one thread count is bit-identical. So seqkv fixes the
schedule and the thread count, and records the rest. Two schedules exist:

* ``token-by-token``: transformers' forward, one token per step on a growing cache, 1 thread
  (single-token steps are bound by weight traffic; 1 thread measured as fast as 2 here);
* ``rows``: seqkv's row-invariant forward (``seqkv.models.rows``), whose rows are bit-identical
  however they are chunked or batched, so encoders may run in large chunks and decoders may
  speculate and batch; 1 thread (its row invariance does not hold on 2 threads on every CPU).

Invariants:
1. Encoder and decoder run every model forward inside ``pinned_threads`` (enforced).
2. A decoder refuses a file whose schedule, dtype or device class differs from its own (enforced
   in ``seqkv.codec``); a differing CPU capability or library version is refused unless the caller
   opts in, and then the token and KV checksums still catch any divergence (enforced).
3. Same profile implies identical probabilities (assumed; tested on the embedded model).

``pinned_threads`` mutates torch's process-wide intra-op thread count for the duration of the
``with`` block and restores it afterwards.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers

from seqkv.types import ExecutionProfile, Schedule

CODING_THREADS = 1
# NOTE: the row-invariant forward (``seqkv.models.rows``) gave bit-identical rows on 1 and 2
# threads on one Xeon, but on another (AVX-512, MKL 2024.2) 2-thread products of 57-101 rows
# changed bits; 1 thread is invariant on both.
ROW_THREADS = 1


# NOTE: one prefill is a few large matrix products: 2 threads, the fixed count every machine
# runs it on (a thread count is part of the bits of a float reduction).
PREFILL_THREADS = 2


def schedule_threads(schedule: Schedule) -> int:
    """The intra-op thread count a schedule's forwards run under."""
    return {"rows": ROW_THREADS, "prefill": PREFILL_THREADS}.get(schedule, CODING_THREADS)


def cpu_model() -> str:
    """The CPU's vendor, family and model number (Linux), or the machine's architecture name."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() or "unknown"
    values = dict(re.findall(r"^(vendor_id|cpu family|model)\s*:\s*(.+)$", info, re.M))
    return "-".join(values.get(k, "?").strip() for k in ("vendor_id", "cpu family", "model"))


def cpu_vendor() -> str:
    """The CPU's vendor id (``GenuineIntel``, ``AuthenticAMD``; an Arm implementer code as
    ``arm-0x41``), or the machine's architecture name where /proc/cpuinfo names none."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.M)
    if vendor is not None:
        return vendor.group(1)
    implementer = re.search(r"^CPU implementer\s*:\s*(\S+)", info, re.M)
    if implementer is not None:
        return f"arm-{implementer.group(1)}"
    return platform.machine() or "unknown"


def current_profile(dtype: torch.dtype, device: torch.device,
                    schedule: Schedule = "token-by-token", row_block: int = 0) -> ExecutionProfile:
    """The profile this process runs ``schedule`` under for a model of ``dtype`` on ``device``
    (``row_block``: the row-invariant forward's calibration, for the ``rows`` schedule)."""
    if device.type == "cuda":
        device_class = f"cuda:{torch.cuda.get_device_name(device)}"
    else:
        device_class = device.type
    return ExecutionProfile(
        schedule=schedule,
        dtype=str(dtype).removeprefix("torch."),
        device_class=device_class,
        cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        num_threads=schedule_threads(schedule),
        torch_version=torch.__version__,
        transformers_version=transformers.__version__,
        cpu_model=cpu_model(),
        row_block=row_block,
    )


@contextmanager
def pinned_threads(num_threads: int = CODING_THREADS) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to ``num_threads``."""
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
