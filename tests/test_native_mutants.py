"""Each micro-kernel of native.c is guarded: a mutant of it (one lane wrong, a saturating add, a
wrong operand) makes the harness of ``test_native_aarch64.py`` report a mismatch on its path.

Each case replaces one line of native.c (the original must occur exactly once, so that a
rewrite of the kernel fails here by name, not silently), builds the harness on the paths whose
kernel it is, and requires exit 1 with at least one array that differs, on the int8 predictor
(the linear and attention kernels) or the 4-bit one (the Q4_1 kernels). A case whose paths this
machine cannot run is not generated (the AVX-512 VNNI and AVX-VNNI kernels run only on CPUs that
have them: ``test_integer_native.py`` builds them everywhere).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_native_aarch64 import BUILDS, NATIVE_C, harness, vectors  # noqa: F401 (fixtures)


@dataclass(frozen=True)
class Mutant:
    name: str
    builds: tuple[str, ...]  # the harness builds (test_native_aarch64.BUILDS) it must fail on
    variant: str  # the vector file: "int8" or "q4"
    original: str
    mutated: str


MUTANTS = (
    Mutant("avx2-dot-saturating-add", ("x86-avx2",), "int8",
           "#define DPW(acc, a, b) acc = _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))",
           "#define DPW(acc, a, b) acc = _mm256_adds_epi16(acc, _mm256_madd_epi16(a, b))"),
    Mutant("avx2-linear-one-lane", ("x86-avx2",), "int8",
           "acc[j][8 * half + m] += (int64_t)t[2 * m] + t[2 * m + 1];",
           "acc[j][8 * half + (m ^ (m == 7))] += (int64_t)t[2 * m] + t[2 * m + 1];"),
    Mutant("avx2-q4-wrong-plane-bytes", ("x86-avx2", "x86-avxvnni"), "q4",
           "_mm256_maddubs_epi16(b3, broadcast4_i8(x + 28)))))",
           "_mm256_maddubs_epi16(b3, broadcast4_i8(x + 24)))))"),
    Mutant("avx2-attention-key-sum", ("x86-avx2", "x86-avxvnni"), "int8",
           "x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));",
           "x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb0));"),
    Mutant("avx2-attention-value-lane", ("x86-avx2", "x86-avxvnni"), "int8",
           "for (int lane = 0; lane < 2; ++lane)\n            for (int m = 0; m < 4; ++m) {\n"
           "                high[c + 8 * lane + m]",
           "for (int lane = 0; lane < 1; ++lane)\n            for (int m = 0; m < 4; ++m) {\n"
           "                high[c + 8 * lane + m]"),
    Mutant("avxvnni-dot-saturating", ("x86-avxvnni",), "int8",
           "#define DPW(acc, a, b) acc = _mm256_dpwssd_avx_epi32(acc, a, b)",
           "#define DPW(acc, a, b) acc = _mm256_dpwssds_avx_epi32(acc, a, b)"),
    Mutant("avx512vnni-dot-saturating", ("x86-avx512vnni",), "int8",
           "#define DP(acc, v, x) acc = _mm512_dpbusd_epi32(acc, v, x)",
           "#define DP(acc, v, x) acc = _mm512_dpbusds_epi32(acc, v, x)"),
    Mutant("scalar-linear-one-product", ("x86-scalar", "aarch64-scalar"), "int8",
           "+ v[2] * w[4 * lane + 2] + v[3] * w[4 * lane + 3];",
           "+ v[2] * w[4 * lane + 2] + v[3] * w[4 * lane + 2];"),
    Mutant("scalar-q4-high-nibble", ("x86-scalar", "aarch64-scalar"), "q4",
           "total += first * (byte & 15) + second * (byte >> 4);",
           "total += first * (byte & 15) + second * (byte & 15);"),
    Mutant("neon-linear-wrong-plane", ("aarch64-neon",), "int8",
           "l[c] = vdotq_s32(l[c], w, bl);",
           "l[c] = vdotq_s32(l[c], w, bh);"),
    Mutant("neon-q4-wrong-bytes", ("aarch64-neon",), "q4",
           "sl = vdotq_s32(sl, n1, broadcast4_s8(l + 16 + 4 * j));",
           "sl = vdotq_s32(sl, n1, broadcast4_s8(l + 4 * j));"),
)
CASES = [pytest.param(mutant, build, id=f"{mutant.name}-{build}")
         for mutant in MUTANTS for build in mutant.builds if build in BUILDS]


def test_every_mutant_names_one_line_of_native_c() -> None:
    source = NATIVE_C.read_text()
    for mutant in MUTANTS:
        assert source.count(mutant.original) == 1, mutant.name
        assert mutant.mutated != mutant.original


@pytest.mark.parametrize("mutant, build", CASES)
def test_a_mutant_kernel_is_caught_on_its_path(
        harness: Callable[..., str], vectors: dict[str, Path], tmp_path: Path,  # noqa: F811
        mutant: Mutant, build: str) -> None:
    mutated = tmp_path / "native.c"
    mutated.write_text(NATIVE_C.read_text().replace(mutant.original, mutant.mutated))
    output = harness(build, vectors[mutant.variant], "forward", expect=1, source=mutated,
                     key=mutant.name)
    differing = [line for line in output.splitlines()
                 if "elements differ" in line and ": 0 of " not in line]
    assert differing, output
    assert output.rstrip().endswith("harness: MISMATCH")
