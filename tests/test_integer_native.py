"""native.c computes the integer forward's rows bit for bit as its torch statement does."""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import logging
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from native_paths import CPU_ISAS
from seqkv.errors import IntegerBackendError
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.models.integer import IntegerConfig, IntegerForward, integer_tables, native
from seqkv.models.integer.table import numpy_tables
from seqkv.schedule import pinned_threads

TOKENS = [int(t) for t in np.random.default_rng(5).integers(0, 512, 40)]

@pytest.fixture(scope="module")
def engines(tiny_model: CausalLM, isa: native.Isa) -> tuple[IntegerForward, IntegerForward]:
    """The torch statement and the native path ``isa`` over the same integer weights."""
    reference = IntegerForward(tiny_model, backend="torch")
    fast = IntegerForward(reference.weights, isa=isa)
    assert fast.isa == isa
    return reference, fast


def _rows(engine: IntegerForward, tokens: list[int], cuts: list[int]) -> np.ndarray:
    sequence = engine.new_sequence()
    bounds = [0, *sorted(set(cuts)), len(tokens)]
    return np.concatenate([engine.forward([(sequence, tokens[a:b])])[0]
                           for a, b in itertools.pairwise(bounds) if b > a])


@pytest.fixture()
def reload(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., native.NativeKernels | None]]:
    """``native.load()`` under the given environment variables (the cached library is
    forgotten before and after)."""

    monkeypatch.delenv(native.ISA_ENV, raising=False)  # the caller's forced path, if any
    monkeypatch.delenv(native.BACKEND_ENV, raising=False)

    def load(**environment: str) -> native.NativeKernels | None:
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        native.load.cache_clear()
        native.kernels.cache_clear()
        return native.load()

    try:
        yield load
    finally:
        native.load.cache_clear()
        native.kernels.cache_clear()


def test_auto_picks_native_and_the_environment_can_refuse_it(
        tiny_model: CausalLM, reload: Callable[..., native.NativeKernels | None]) -> None:
    assert IntegerForward(tiny_model).backend == "native"
    assert IntegerForward(tiny_model, backend="torch").backend == "torch"
    # a config native.c does not implement runs on torch under auto, and is refused by name
    coarse = IntegerConfig(activation_planes=1)
    assert IntegerForward(tiny_model, config=coarse).backend == "torch"
    with pytest.raises(ValueError, match="two activation planes"):
        IntegerForward(tiny_model, config=coarse, backend="native")
    assert reload(SEQKV_INTEGER_BACKEND="torch") is None
    assert IntegerForward(tiny_model).backend == "torch"
    with pytest.raises(ValueError, match="auto, native or torch"):
        reload(SEQKV_INTEGER_BACKEND="fast")


def test_a_missing_compiler_falls_back_to_torch_with_a_warning(
        tmp_path: object, caplog: pytest.LogCaptureFixture, tiny_model: CausalLM,
        reload: Callable[..., native.NativeKernels | None]) -> None:
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert reload(SEQKV_NATIVE_DIR=str(tmp_path), CC="/nonexistent/cc") is None
    assert "torch path" in caplog.text
    assert IntegerForward(tiny_model).backend == "torch"
    with pytest.raises(RuntimeError, match="did not build"):
        reload(SEQKV_INTEGER_BACKEND="native")


@given(cuts=st.lists(st.integers(1, len(TOKENS) - 1), max_size=6),
       threads=st.sampled_from([1, 2]))
def test_native_rows_equal_the_torch_rows_for_any_chunking(
        engines: tuple[IntegerForward, IntegerForward], cuts: list[int], threads: int) -> None:
    reference, fast = engines
    with pinned_threads(threads):
        assert np.array_equal(_rows(fast, TOKENS, cuts), _rows(reference, TOKENS, []))


@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5), seed=st.integers(0, 99))
def test_native_batches_of_sequences_equal_the_torch_batches(
        engines: tuple[IntegerForward, IntegerForward], lengths: list[int], seed: int) -> None:
    reference, fast = engines
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(0, 512, rng.integers(1, 12))] for _ in lengths]
    chunks = [[int(t) for t in rng.integers(0, 512, n)] for n in lengths]
    results = []
    for engine in (reference, fast):
        batch = engine.new_batch(len(lengths))
        engine.forward(list(zip(batch, prompts, strict=True)))
        results.append((engine.forward(list(zip(batch, chunks, strict=True))),
                        [s.state() for s in batch]))
    for expected, got in zip(results[0][0], results[1][0], strict=True):
        assert np.array_equal(expected, got)
    for expected_state, got_state in zip(results[0][1], results[1][1], strict=True):
        assert torch.equal(expected_state.planes, got_state.planes)
        assert torch.equal(expected_state.shifts, got_state.shifts)


@pytest.mark.parametrize("weight_planes", [1, 2])
def test_native_rows_equal_torch_for_each_weight_precision(weight_planes: int,
                                                           isa: native.Isa) -> None:
    model = tiny_random_llama(seed=2)
    config = IntegerConfig(weight_planes=weight_planes)  # type: ignore[arg-type]
    reference = IntegerForward(model, config=config, backend="torch")
    fast = IntegerForward(reference.weights, isa=isa)
    assert np.array_equal(_rows(fast, TOKENS, [7, 8, 30]), _rows(reference, TOKENS, []))


def _one_layer_engines(head_dim: int, heads: int, seed: int, isa: native.Isa, kv_heads: int = 1
                       ) -> tuple[IntegerForward, IntegerForward]:
    """A one-layer random Llama with ``kv_heads`` KV heads of ``head_dim``: its torch and
    native integer forwards over the same weights."""
    config = LlamaConfig(vocab_size=512, hidden_size=96, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=heads,
                         num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=1024)
    torch.manual_seed(seed)
    model = CausalLM(LlamaForCausalLM(config), None, f"tiny-llama-{heads}x{head_dim}")
    reference = IntegerForward(model, backend="torch")
    return reference, IntegerForward(reference.weights, isa=isa)


@pytest.mark.parametrize("head_dim", [48, 18, 136])
def test_native_heads_of_any_width_equal_torch_past_a_value_flush(head_dim: int,
                                                                  isa: native.Isa) -> None:
    """native.c's attention lays keys out in pairs of components, 16 keys to a vector, and
    values in chunks of 16: 48 components make an odd number of value chunks; 18 an odd
    number of pairs and a partial chunk; 136 two blocks of 64 in the keys' transpose and a
    partial third. 600 tokens
    in uneven chunks cross the 512-key flush of the value sums with odd key counts."""
    reference, fast = _one_layer_engines(head_dim, heads=2, seed=3, isa=isa)
    assert fast.backend == "native"
    tokens = [int(t) for t in np.random.default_rng(6).integers(0, 512, 600)]
    expected = _rows(reference, tokens, [300])
    with pinned_threads(2):
        assert np.array_equal(_rows(fast, tokens, [1, 257, 511, 513, 599]), expected)


@pytest.mark.parametrize("head_dim", [64, 96])
def test_native_one_row_steps_equal_torch_across_key_blocks(head_dim: int,
                                                            isa: native.Isa) -> None:
    """A step of one or two rows reads the pool's keys directly, summing the dot products of 16
    keys at a time when the head's width is a multiple of 32 (SmolLM2's 64): steps from 20 to
    70 keys cross whole blocks of 16 and every remainder."""
    reference, fast = _one_layer_engines(head_dim, heads=3, seed=5, isa=isa)
    tokens = [int(t) for t in np.random.default_rng(8).integers(0, 512, 70)]
    expected = _rows(reference, tokens, [])
    for threads in (1, 2):
        with pinned_threads(threads):
            assert np.array_equal(_rows(fast, tokens, [20, *range(21, 70, 1), 69]), expected)


@pytest.mark.parametrize("heads, kv_heads", [(6, 1), (2, 1), (12, 2)])
def test_native_grouped_steps_equal_torch_past_a_value_flush(heads: int, kv_heads: int,
                                                             isa: native.Isa) -> None:
    """Steps of one and two rows run a key head's query heads together, up to 4 in one pass
    over the keys (6 query heads to a key head: a pass of 4 and one of 2; 2: one of 2; 12 over
    2 key heads: two passes for each); steps after 511 to 599 keys cross the 512-key flush of
    the value sums, with odd and even key counts."""
    reference, fast = _one_layer_engines(64, heads=heads, seed=11, isa=isa, kv_heads=kv_heads)
    tokens = [int(t) for t in np.random.default_rng(12).integers(0, 512, 600)]
    expected = _rows(reference, tokens, [300])
    cuts = [256, 509, *range(510, 530), 532, 534, *range(560, 600, 3)]
    for threads in (1, 2):
        with pinned_threads(threads):
            assert np.array_equal(_rows(fast, tokens, cuts), expected)


def test_every_path_builds_and_names_itself(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each path of this architecture builds with its own flags; those this CPU runs load and
    report their instruction set (native.c's SEQKV_ISA: a path built without its instructions
    would report another), and serve the tables."""
    monkeypatch.setenv("SEQKV_NATIVE_DIR", str(tmp_path))
    logits = (np.random.default_rng(15).standard_normal((3, 300)) * 2**20).astype(np.int64)
    for path, (flags, _) in native._paths().items():
        try:
            built = native._compiled(["cc"], (*native._FLAGS, *flags))
        except subprocess.CalledProcessError as error:
            pytest.fail(f"native.c does not build for {path}: {error.stderr}")
        if path not in CPU_ISAS:
            continue  # built, not run: this CPU lacks its instructions
        kernels = native.NativeKernels(ctypes.CDLL(str(built)))
        assert kernels.isa == path
        with monkeypatch.context() as patch:
            patch.setattr(native, "load", lambda kernels=kernels: kernels)
            for got, want in zip(integer_tables(logits)[:2], numpy_tables(logits)[:2],
                                 strict=True):
                assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype, rows", [(np.int32, 40), (np.int64, 39)])
def test_both_paths_refuse_an_out_buffer_of_another_dtype_or_too_few_rows(
        engines: tuple[IntegerForward, IntegerForward], dtype: type, rows: int) -> None:
    for engine in engines:
        sequence = engine.new_sequence()
        with pytest.raises(ValueError, match="out must be C-contiguous int64"):
            engine.forward([(sequence, TOKENS)], out=np.zeros((rows, 512), dtype=dtype))
        assert sequence.length == 0  # refused before any work
        buffer = np.zeros((len(TOKENS) + 3, 512), dtype=np.int64)
        rows_out = engine.forward([(sequence, TOKENS)], out=buffer)[0]
        assert np.shares_memory(rows_out, buffer)
        assert np.array_equal(rows_out, _rows(engine, TOKENS, []))


def test_the_environment_chooses_a_path_or_is_refused_in_one_line(
        reload: Callable[..., native.NativeKernels | None]) -> None:
    for path in CPU_ISAS:
        kernels = reload(SEQKV_INTEGER_ISA=path, SEQKV_INTEGER_BACKEND="auto")
        assert kernels is not None and kernels.isa == path
    lacking = [path for path in native.ISAS if path not in CPU_ISAS]
    assert lacking  # no CPU runs both x86 and Arm paths
    with pytest.raises(IntegerBackendError, match=f"cannot run it; it runs {CPU_ISAS[0]}"):
        reload(SEQKV_INTEGER_ISA=lacking[0])
    with pytest.raises(IntegerBackendError, match="must be one of scalar, avx2"):
        reload(SEQKV_INTEGER_ISA="sse9")
    with pytest.raises(IntegerBackendError, match="has no effect with SEQKV_INTEGER_BACKEND=torch"):
        reload(SEQKV_INTEGER_ISA="scalar", SEQKV_INTEGER_BACKEND="torch")


@pytest.mark.parametrize("damage", ["truncated", "foreign", "empty"])
def test_a_damaged_library_in_the_cache_is_rebuilt_not_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    """A cached library that is cut short (mapping it can kill the process with SIGBUS), another
    library under its name, or an empty file fails the check in a child process and is built
    again; the caller gets a working library."""
    monkeypatch.setenv("SEQKV_NATIVE_DIR", str(tmp_path))
    path = CPU_ISAS[0]
    built = native._build(path)
    if damage == "truncated":
        built.write_bytes(built.read_bytes()[:1000])
    elif damage == "foreign":
        libm = ctypes.util.find_library("m")
        assert libm is not None
        foreign = next(Path(d) / libm for d in ("/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
                                                 "/usr/lib", "/lib") if (Path(d) / libm).exists())
        built.write_bytes(foreign.read_bytes())
    else:
        built.write_bytes(b"")
    assert native._probe(built, path) is not None
    rebuilt = native._build(path)
    assert rebuilt == built and native._probe(rebuilt, path) is None
    assert native.NativeKernels(ctypes.CDLL(str(rebuilt))).isa == path


def test_packed_weights_hold_each_row_in_its_lane() -> None:
    rng = np.random.default_rng(0)
    planes, n, k = 2, 21, 8
    weight = torch.from_numpy(rng.integers(-127, 128, (planes * n, k)).astype(np.int8))
    packed, sums = native.pack_weight(weight, planes)
    blocks = -(-n // native.LANES)
    assert packed.shape == (planes, blocks, k // 4, native.LANES, 4)
    for p, row, column in itertools.product(range(planes), range(n), range(k)):
        block, lane = divmod(row, native.LANES)
        quad, byte = divmod(column, 4)
        assert packed[p, block, quad, lane, byte] == weight[p * n + row, column]
    assert torch.equal(sums[:, :n], weight.view(planes, n, k).sum(-1, dtype=torch.int32))
    # rows past n (lanes 5..15 of the second block) are zeros, and so are their sums
    assert not packed[:, 1, :, n - native.LANES :].any()
    assert not sums[:, n:].any()


@pytest.mark.real_model
def test_real_model_native_rows_equal_torch_rows(real_model: CausalLM, isa: native.Isa) -> None:
    tokens = real_model.encode_text(
        "The ferry left at six, and the harbour master counted the crates twice before he "
        "signed the manifest and handed it to the captain.")
    reference = IntegerForward(real_model, backend="torch")
    fast = IntegerForward(reference.weights, isa=isa)
    expected = _rows(reference, tokens, [])
    with pinned_threads(2):
        assert np.array_equal(_rows(fast, tokens, []), expected)
    with pinned_threads(1):
        assert np.array_equal(_rows(fast, tokens, [1, 2, 9, 10, 11, 17]), expected)


@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 4), vocab=st.integers(2, 700),
       scale=st.sampled_from([1, 300, 65536, 2**24, 2**40]), ties=st.booleans())
def test_native_tables_equal_the_numpy_tables(seed: int, rows: int, vocab: int, scale: int,
                                              ties: bool) -> None:
    for path in CPU_ISAS:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(native, "load", lambda path=path: native.kernels(path))
            _tables_equal_the_numpy_tables(seed, rows, vocab, scale, ties)


def _tables_equal_the_numpy_tables(seed: int, rows: int, vocab: int, scale: int,
                                   ties: bool) -> None:
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((rows, vocab)) * scale).astype(np.int64)
    if ties:  # many tokens at the maximum, and far below it (clamped gaps)
        logits[:, : vocab // 2] = logits.max()
        logits[:, -1] = logits.max() - 2**40
    cumulative, log2p, entropy = integer_tables(logits)
    expected_cumulative, expected_log2p, expected_entropy = numpy_tables(logits)
    assert np.array_equal(cumulative, expected_cumulative)
    assert np.array_equal(log2p, expected_log2p)
    # the entropy's float sums run in another order (a report figure, not part of the code)
    np.testing.assert_allclose(entropy, expected_entropy, rtol=1e-12, atol=1e-12)


@pytest.mark.real_model
def test_real_model_native_tables_equal_the_numpy_tables(real_model: CausalLM) -> None:
    engine = IntegerForward(real_model)
    rows = engine.forward([(engine.new_sequence(), real_model.encode_text(
        "A short note on tides, moons and the harbour's calendar."))])[0]
    cumulative, log2p, entropy = integer_tables(rows)
    expected_cumulative, expected_log2p, expected_entropy = numpy_tables(rows)
    assert np.array_equal(cumulative, expected_cumulative)
    assert np.array_equal(log2p, expected_log2p)
    np.testing.assert_allclose(entropy, expected_entropy, rtol=1e-12, atol=1e-12)
