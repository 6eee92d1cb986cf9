"""The 4-bit integer predictor: Q4_1 blocks as the GGUF holds them, exact block scales, a digest
of its own, and rows bit-identical over chunkings, batches, threads and its two paths."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from seqkv.coding.arithmetic import ArithmeticDecoder
from seqkv.errors import InvalidLevelError, UnsupportedModelError
from seqkv.formats.skv import read_skv
from seqkv.levels import parse_level
from seqkv.levels.base import DecodeRequest
from seqkv.levels.layer_drafts import DraftCounts, LayerDrafter, StreamDrafter
from seqkv.levels.portable import PortableLevel
from seqkv.models import CausalLM
from seqkv.models.integer import IntegerForward, IntegerWeights, native
from seqkv.models.integer.blocks import (
    BLOCK,
    SCALE_FRAC,
    BlockLinear,
    BlockWeights,
    block_linear,
    block_weights,
    q4_1_blocks,
)
from seqkv.models.integer.weights import IntLinear
from seqkv.schedule import pinned_threads
from seqkv.skv import compress, decompress, decompress_batch

TOKENS = [int(t) for t in np.random.default_rng(11).integers(0, 512, 40)]


@pytest.fixture(scope="module")
def engines(tiny_model: CausalLM, isa: native.Isa) -> tuple[IntegerForward, IntegerForward]:
    """The torch statement and native.c's path ``isa`` over the tiny model's Q4_1 integers."""
    reference = IntegerForward(block_weights(tiny_model), backend="torch")
    return reference, IntegerForward(reference.weights, isa=isa)


def _rows(engine: IntegerForward, tokens: list[int], cuts: list[int]) -> np.ndarray:
    sequence = engine.new_sequence()
    bounds = [0, *sorted(set(cuts)), len(tokens)]
    return np.concatenate([engine.forward([(sequence, tokens[a:b])])[0]
                           for a, b in itertools.pairwise(bounds) if b > a])


@pytest.fixture(scope="module")
def reference_rows(engines: tuple[IntegerForward, IntegerForward]) -> np.ndarray:
    return _rows(engines[0], TOKENS, [])


def test_blocks_are_the_reference_q4_1_quantizer() -> None:
    gguf_quants = pytest.importorskip("gguf.quants")
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((24, 4 * BLOCK)) * 0.05).astype(np.float32)
    weight[3, :BLOCK] = 0.25  # a constant block: d = 0, every nibble 0
    raw = gguf_quants.quantize(weight, gguf.GGMLQuantizationType.Q4_1)  # [N, blocks * 20]
    q, d, m = q4_1_blocks(weight)
    blocks = raw.reshape(24, 4, 20)
    assert np.array_equal(blocks[..., 0:2].copy().view(np.float16)[..., 0], d)
    assert np.array_equal(blocks[..., 2:4].copy().view(np.float16)[..., 0], m)
    nibbles = blocks[..., 4:]
    assert np.array_equal(np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).reshape(24, -1), q)


def test_the_integers_are_the_blocks_exactly(tiny_model: CausalLM) -> None:
    """``D * q + M`` at 2**-24 is ``d * q + m`` with no rounding at all, and rounds to the
    dequantized float32 value (gguf's ``d * q + m`` in float32)."""
    linear = block_weights(tiny_model).layers[1].gate_up
    d, m = (half.numpy() for half in linear.halves())
    q = linear.quants.numpy().astype(np.int64)
    integers = linear.scale.numpy().repeat(BLOCK, 1) * q + linear.minimum.numpy().repeat(BLOCK, 1)
    exact = d.astype(np.float64).repeat(BLOCK, 1) * q + m.astype(np.float64).repeat(BLOCK, 1)
    assert np.array_equal(np.ldexp(integers.astype(np.float64), -SCALE_FRAC), exact)
    dequantized = (d.astype(np.float32).repeat(BLOCK, 1) * q.astype(np.float32)
                   + m.astype(np.float32).repeat(BLOCK, 1))
    assert np.array_equal(exact.astype(np.float32), dequantized)


def test_one_nibble_changes_the_digest_and_the_formats_never_share_one(
        tiny_model: CausalLM) -> None:
    weights = block_weights(tiny_model)
    assert BlockWeights.from_model(tiny_model).digest() == weights.digest()
    layer = weights.layers[0]
    quants = layer.o.quants.clone()
    quants[3, 7] += 1 if quants[3, 7] < 15 else -1
    changed = dataclasses.replace(weights, layers=(
        dataclasses.replace(layer, o=dataclasses.replace(layer.o, quants=quants)),
        *weights.layers[1:]))
    assert changed.digest() != weights.digest()
    assert weights.digest() != IntegerWeights.from_model(tiny_model).digest()
    assert IntegerForward(weights).digest != IntegerForward(tiny_model).digest


def test_weights_outside_the_fixed_point_are_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="multiple of 32"):
        block_linear(torch.zeros((4, 48)), None)
    huge = torch.zeros((2, BLOCK))
    huge[0, 0] = 4096.0  # d = 273: D = d * 2**24 leaves int32
    with pytest.raises(UnsupportedModelError, match="128 or more"):
        block_linear(huge, None)


@given(cuts=st.lists(st.integers(1, len(TOKENS) - 1), max_size=6),
       threads=st.sampled_from([1, 2]))
def test_rows_are_the_same_for_any_chunking_and_thread_count(
        engines: tuple[IntegerForward, IntegerForward], reference_rows: np.ndarray,
        cuts: list[int], threads: int) -> None:
    with pinned_threads(threads):
        assert np.array_equal(_rows(engines[1], TOKENS, cuts), reference_rows)


@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5), seed=st.integers(0, 99),
       threads=st.sampled_from([1, 2]))
def test_batches_of_sequences_equal_each_sequence_alone_on_both_paths(
        engines: tuple[IntegerForward, IntegerForward], lengths: list[int], seed: int,
        threads: int) -> None:
    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(0, 512, rng.integers(1, 12))] for _ in lengths]
    chunks = [[int(t) for t in rng.integers(0, 512, n)] for n in lengths]
    alone = [_rows(engines[0], prompt + chunk, [])[len(prompt):]
             for prompt, chunk in zip(prompts, chunks, strict=True)]
    for engine in engines:
        batch = engine.new_batch(len(lengths))
        with pinned_threads(threads):
            engine.forward(list(zip(batch, prompts, strict=True)))
            rows = engine.forward(list(zip(batch, chunks, strict=True)))
        for expected, got in zip(alone, rows, strict=True):
            assert np.array_equal(expected, got)


def test_native_rows_and_kv_equal_the_torch_statement(
        engines: tuple[IntegerForward, IntegerForward], reference_rows: np.ndarray) -> None:
    fast = engines[1]
    assert fast.backend == "native"
    states = []
    for engine in engines:
        sequence = engine.new_sequence()
        for token in TOKENS:  # token by token: the one-row kernel
            engine.forward([(sequence, [token])])
        states.append(sequence.state())
    assert torch.equal(states[0].planes, states[1].planes)
    assert torch.equal(states[0].shifts, states[1].shifts)
    with pinned_threads(2):
        assert np.array_equal(_rows(fast, TOKENS, [2, 5, 30]), reference_rows)


def test_subnormal_block_scales_convert_exactly_under_flush_to_zero(
        tiny_model: CausalLM, isa: native.Isa) -> None:
    """A block whose minimum is an fp16 subnormal: native.c converts it with IEEE operations
    after clearing DAZ/FTZ on its threads, so the rows still equal the torch statement while
    the caller's thread flushes denormals."""
    weights = block_weights(tiny_model)
    layer = weights.layers[0]
    minimum = layer.gate_up.minimum.clone()
    minimum[::3, 1] = 37  # 37 * 2**-24: an fp16 subnormal
    gate_up = dataclasses.replace(layer.gate_up, minimum=minimum)
    tweaked = dataclasses.replace(weights, layers=(
        dataclasses.replace(layer, gate_up=gate_up), *weights.layers[1:]))
    expected = _rows(IntegerForward(tweaked, backend="torch"), TOKENS[:12], [])
    fast = IntegerForward(tweaked, isa=isa)
    assert torch.set_flush_denormal(True)  # the CPU has the mode
    try:
        with pinned_threads(2):
            rows = _rows(fast, TOKENS[:12], [5])
    finally:
        torch.set_flush_denormal(False)
    assert np.array_equal(rows, expected)


def test_packed_blocks_hold_each_nibble_and_scale_in_place() -> None:
    rng = np.random.default_rng(1)
    n, k = 21, 2 * BLOCK
    quants = torch.from_numpy(rng.integers(0, 16, (n, k)).astype(np.int8))
    d = torch.from_numpy(rng.standard_normal((n, 2)).astype(np.float16))
    m = torch.from_numpy(rng.standard_normal((n, 2)).astype(np.float16))
    packed = native.pack_blocks(quants, d, m)
    assert packed.shape == (2, 2, 320)
    for row, column in itertools.product(range(n), range(k)):
        group, lane = divmod(row, native.LANES)
        block, offset = divmod(column, BLOCK)
        half, at = divmod(offset, BLOCK // 2)
        byte = int(packed[group, block, 64 * (at // 4) + 4 * lane + at % 4])
        assert (byte >> 4 * half) & 15 == quants[row, column]
    for row, block in itertools.product(range(n), range(2)):
        group, lane = divmod(row, native.LANES)
        meta = packed[group, block, 256:].numpy().view(np.float16)
        assert meta[lane] == d[row, block] and meta[16 + lane] == m[row, block]
    assert not packed[1, :, 256:].numpy().view(np.float16)[..., 5:16].any()  # padded rows


@pytest.mark.parametrize("level", ["portable4", "portable4:1"])
def test_portable4_round_trips_and_names_itself(tiny_model: CausalLM, level: str) -> None:
    tokens = TOKENS + [5, 6, 7, 8, 9] * 5
    result = compress(tiny_model, tokens, tiny_model.prefill(tokens), level=level)
    decoded = decompress(tiny_model, result.data)
    assert decoded.tokens == tokens and decoded.session.level == level
    assert parse_level(level).spec.name == level
    assert decoded.stats.forwards < len(tokens)  # the repeats were drafted and confirmed


def test_files_of_each_integer_predictor_decode_together(tiny_model: CausalLM) -> None:
    """One batch holding portable, portable:1 and portable4 files: each decodes with its own
    predictor (a shared forward across them would decode the wrong distributions)."""
    sessions = [TOKENS[:20], TOKENS[10:35], TOKENS[5:17]]
    levels = ["portable", "portable:1", "portable4"]
    files = [compress(tiny_model, tokens, tiny_model.prefill(tokens), level=level).data
             for tokens, level in zip(sessions, levels, strict=True)]
    assert [r.tokens for r in decompress_batch(tiny_model, files)] == sessions


def test_a_model_with_dimensions_off_the_block_is_refused() -> None:
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=80,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    model = CausalLM(LlamaForCausalLM(config), None, "tiny-llama-intermediate80")
    with pytest.raises(UnsupportedModelError, match="multiple of 32"):
        BlockWeights.from_model(model)
    with pytest.raises(UnsupportedModelError, match="multiple of 32"):
        compress(model, [1, 2, 3], level="portable4")


@pytest.mark.real_model
def test_real_model_blocks_are_the_gguf_blocks_and_both_paths_agree(
        real_model: CausalLM, isa: native.Isa) -> None:
    """Requantizing SmolLM2's float weights gives back its GGUF's Q4_1 blocks bit for bit (q
    and k rows in transformers' order), and native.c's rows equal the torch statement's."""
    gguf = pytest.importorskip("gguf")
    from seqkv.models.loading import default_model_file

    weights = block_weights(real_model)
    reader = gguf.GGUFReader(str(default_model_file()))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    config = real_model.config
    parts = {"qkv": ["attn_q", "attn_k", "attn_v"], "o": ["attn_output"],
             "gate_up": ["ffn_gate", "ffn_up"], "down": ["ffn_down"]}
    for index, layer in enumerate(weights.layers):
        for part, names in parts.items():
            linear: BlockLinear = getattr(layer, part)
            raw = []
            for name in names:
                blocks = tensors[f"blk.{index}.{name}.weight"]  # [rows, blocks * 20]
                heads = {"attn_q": config.num_attention_heads,
                         "attn_k": config.num_key_value_heads}.get(name)
                if heads is not None:  # llama.cpp's rotary row order back to transformers'
                    blocks = blocks.reshape(heads, -1, 2, blocks.shape[1]).swapaxes(2, 1)
                raw.append(blocks.reshape(-1, blocks.shape[-1]))
            stacked = np.concatenate(raw).reshape(linear.out_features, -1, 20)
            d, m = (half.numpy() for half in linear.halves())
            assert np.array_equal(stacked[..., 0:2].copy().view(np.float16)[..., 0], d)
            assert np.array_equal(stacked[..., 2:4].copy().view(np.float16)[..., 0], m)
            nibbles = stacked[..., 4:]
            q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1)
            assert np.array_equal(q.reshape(linear.out_features, -1), linear.quants.numpy())
    tokens = real_model.encode_text("The ferry left at six, and the harbour master counted "
                                    "the crates twice before he signed the manifest.")
    reference = IntegerForward(weights, backend="torch")
    fast = IntegerForward(weights, isa=isa)
    with pinned_threads(1):
        expected = _rows(reference, tokens, [])
    with pinned_threads(2):
        assert np.array_equal(_rows(fast, tokens, [1, 2, 9]), expected)


def _drafted_decode(model: CausalLM, level: str, tokens: list[int],
                    drafter: StreamDrafter | None) -> tuple[list[int], DraftCounts]:
    session = read_skv(compress(model, tokens, level=level).data).session
    portable = parse_level(level)
    assert isinstance(portable, PortableLevel)
    request = DecodeRequest(ArithmeticDecoder(session.token_code), len(tokens), [len(tokens)],
                            model.start_token_id, model.vocab_size, None, with_kv=False)
    counts = DraftCounts()
    return portable.decode_drafted(model, [request], drafter, counts)[0].tail, counts


@pytest.mark.parametrize("level", ["portable", "portable4"])
def test_self_drafting_decodes_the_same_tokens_as_prompt_lookup(tiny_model: CausalLM,
                                                                level: str) -> None:
    tokens = TOKENS[:30] + [5, 6, 7, 8, 9] * 4
    portable = parse_level(level)
    assert isinstance(portable, PortableLevel)
    lookup, lookup_counts = _drafted_decode(tiny_model, level, tokens, None)
    for drafter in (portable.layer_drafter(tiny_model, 1, 3),
                    portable.layer_drafter(tiny_model, 1, 2, after_lookup=False)):
        decoded, counts = _drafted_decode(tiny_model, level, tokens, drafter)
        assert decoded == lookup == tokens
        assert counts.draft_forwards > 0 and counts.drafted > lookup_counts.drafted
        assert 0 <= counts.accepted <= counts.drafted
    assert lookup_counts.accepted == lookup_counts.drafted > 0  # the repeats, all confirmed
    with pytest.raises(InvalidLevelError, match="layers"):
        portable.layer_drafter(tiny_model, 2, 3)  # the tiny model has 2 layers


def test_a_layer_draft_leaves_the_sequence_as_it_found_it(tiny_model: CausalLM) -> None:
    engine = IntegerForward(block_weights(tiny_model))
    drafter = LayerDrafter(IntegerForward(engine.weights, layers=1), max_draft=4)
    sequence = engine.new_sequence()
    engine.forward([(sequence, TOKENS[:20])])
    before = sequence.state()
    guesses = drafter.guess(TOKENS[:21], sequence, 4, DraftCounts())
    assert len(guesses) == 4 and all(0 <= g < 512 for g in guesses)
    after = sequence.state()
    assert sequence.length == 20
    assert torch.equal(before.planes, after.planes) and torch.equal(before.shifts, after.shifts)
    # and the next rows are the same as if nothing had been drafted
    assert np.array_equal(engine.forward([(sequence, TOKENS[20:30])])[0],
                          _rows(engine, TOKENS[:30], [])[20:])


def _held_bytes(weights: IntegerWeights | BlockWeights) -> int:
    """Bytes of the linear layers' weights as their format holds them, whichever path runs a
    forward: int8 rows, a byte a weight and plane and an int64 scale a row; Q4_1
    blocks as the GGUF holds them, a nibble a weight and an fp16 scale and minimum a block
    (``BLOCK // 2 + 4`` bytes); int64 biases. Not the torch path's working copies (nibbles as
    int8, D and M as int64: more bytes than int8 rows), which ``weight_bytes`` counts there."""
    def linear(part: IntLinear | BlockLinear) -> int:
        bias = 0 if part.bias is None else part.bias.numel() * 8
        if isinstance(part, BlockLinear):
            blocks = part.scale.numel()
            assert part.minimum.numel() == blocks and part.quants.numel() == blocks * BLOCK
            return blocks * (BLOCK // 2 + 4) + bias
        return part.weight.numel() + part.scale.numel() * 8 + bias
    return linear(weights.head) + sum(
        linear(part) for layer in weights.layers for part in (layer.qkv, layer.o,
                                                              layer.gate_up, layer.down))


def test_a_forward_reads_fewer_weight_bytes_on_blocks(tiny_model: CausalLM) -> None:
    int8 = IntegerForward(tiny_model)
    blocks = IntegerForward(block_weights(tiny_model))
    assert 0 < _held_bytes(blocks.weights) < _held_bytes(int8.weights)
    if blocks.backend == "native":  # what native.c reads: 20 bytes per 32 weights, rows padded
        assert 0 < blocks.weight_bytes() < int8.weight_bytes()
        qkv = blocks.weights.layers[0].qkv
        assert isinstance(qkv, BlockLinear)
        padded = -(-qkv.out_features // 16) * 16
        layer = blocks.weight_bytes() - IntegerForward(blocks.weights, layers=1).weight_bytes()
        assert layer > padded * qkv.in_features // 32 * 20
