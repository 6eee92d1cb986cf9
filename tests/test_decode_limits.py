"""Bounded decoding: the caller's limits on every decode entry point, the information guard on
forged token counts, and the canonical token code (``seqkv.codec``, ``seqkv.coding.arithmetic``
invariants 5 and 6, ``seqkv.formats.skv`` format 5).

Each check is shown to fail on its defect: with the guard, the limit or the canonical check
removed, the matching test here fails (the decode runs on, or accepts the changed file)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from seqkv import cli
from seqkv.codec import DecodeItem, decode_many, decode_memory_bytes
from seqkv.coding.arithmetic import ArithmeticDecoder
from seqkv.errors import (
    CodeExhaustedError,
    CorruptFileError,
    DecodeLimitError,
    SeqKVError,
)
from seqkv.formats.framing import frame, unframe
from seqkv.formats.skv import _ERRORS, MAGIC, read_skv, write_skv
from seqkv.limits import MODEL_FREE_MAX_TOKENS
from seqkv.models import CausalLM
from seqkv.skv import compress, decompress, decompress_batch, decompress_tokens

TOKENS = [5, 17, 17, 3, 9, 10, 11, 12]
LEVELS = ("tokens", "rows", "segments:2", "ngram", "plain", "portable")


def _forged(data: bytes, count: int, version: int | None = None) -> bytes:
    """``data`` with its token count (and so its segments) set to ``count``."""
    session = read_skv(data).session
    segments = (count,) if session.segments == (session.count,) else (
        count - count // 2, count // 2)
    return write_skv(dataclasses.replace(session, count=count, segments=segments), version).data


@pytest.fixture(scope="module")
def files(tiny_model: CausalLM) -> dict[str, bytes]:
    return {level: compress(tiny_model, TOKENS, level=level).data for level in LEVELS}


def _no_forward(model: CausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    def forward(*args: object, **kwargs: object) -> None:
        raise AssertionError("a forward ran")

    monkeypatch.setattr(model.model, "forward", forward)


@pytest.mark.parametrize("entry", ["decompress", "decompress_tokens", "decompress_batch",
                                   "decode_many"])
def test_every_entry_point_refuses_more_than_max_tokens_before_any_forward(
        tiny_model: CausalLM, files: dict[str, bytes], entry: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = files["tokens"]
    calls: dict[str, Callable[[], object]] = {
        "decompress": lambda: decompress(tiny_model, data, max_tokens=7),
        "decompress_tokens": lambda: decompress_tokens(data, tiny_model, max_tokens=7),
        "decompress_batch": lambda: decompress_batch(tiny_model, [data, data], max_tokens=7),
        "decode_many": lambda: decode_many(tiny_model, [DecodeItem(read_skv(data).session)],
                                           max_tokens=7),
    }
    _no_forward(tiny_model, monkeypatch)
    with pytest.raises(DecodeLimitError, match="more than the 7"):
        calls[entry]()


def test_max_tokens_at_the_count_decodes(tiny_model: CausalLM, files: dict[str, bytes]) -> None:
    assert decompress(tiny_model, files["tokens"], max_tokens=len(TOKENS)).tokens == TOKENS
    assert decompress_tokens(files["plain"], max_tokens=len(TOKENS)) == TOKENS


def test_the_default_limit_is_the_context(fuzz_model: CausalLM) -> None:
    data = _forged(compress(fuzz_model, TOKENS, level="tokens").data, 129)
    with pytest.raises(DecodeLimitError, match="more than the 128"):
        decompress(fuzz_model, data)


def test_without_a_model_the_default_limit_is_documented(files: dict[str, bytes]) -> None:
    with pytest.raises(DecodeLimitError, match=f"more than the {MODEL_FREE_MAX_TOKENS:,}"):
        decompress_tokens(_forged(files["plain"], MODEL_FREE_MAX_TOKENS + 1))
    with pytest.raises(DecodeLimitError, match="more than the 3"):
        decompress_tokens(files["ngram"], max_tokens=3)


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "8"])
def test_a_limit_that_is_not_a_positive_integer_is_refused(tiny_model: CausalLM,
                                                           files: dict[str, bytes],
                                                           value: object) -> None:
    with pytest.raises(SeqKVError, match="max_tokens"):
        decompress(tiny_model, files["tokens"], max_tokens=value)  # type: ignore[arg-type]
    with pytest.raises(SeqKVError, match="max_memory_bytes"):
        decompress_tokens(files["plain"], max_memory_bytes=value)  # type: ignore[arg-type]


def test_the_memory_budget_is_checked_before_any_forward(
        tiny_model: CausalLM, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    need = decode_memory_bytes(tiny_model, len(TOKENS), len(TOKENS), tiny_model.vocab_size,
                               with_kv=True)
    assert decode_memory_bytes(tiny_model, 2 * len(TOKENS), 2 * len(TOKENS),
                               tiny_model.vocab_size, with_kv=True) > need
    assert decompress(tiny_model, files["rows"], max_memory_bytes=need).tokens == TOKENS
    _no_forward(tiny_model, monkeypatch)
    with pytest.raises(DecodeLimitError, match="budget"):
        decompress(tiny_model, files["rows"], max_memory_bytes=need - 1)


def test_a_vocabulary_below_2_is_refused(tiny_model: CausalLM, files: dict[str, bytes]) -> None:
    session = dataclasses.replace(read_skv(files["plain"]).session, vocab_size=1)
    with pytest.raises(CorruptFileError, match="at least 2"):
        decode_many(tiny_model, [DecodeItem(session)])


@pytest.mark.parametrize("level", LEVELS)
def test_a_forged_count_stops_once_the_code_runs_out(tiny_model: CausalLM,
                                                     files: dict[str, bytes], level: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A file of 8 tokens whose count says 4,096 (the tiny model's context): the decode stops a
    few symbols past the code's end, not after 4,096 (counted, not timed: the work, whatever the
    machine's load)."""
    forged = _forged(files[level], 4096)
    decoded = [0]
    consume = ArithmeticDecoder.consume

    def counting(self: ArithmeticDecoder, start: int, end: int) -> None:
        decoded[0] += 1
        consume(self, start, end)

    monkeypatch.setattr(ArithmeticDecoder, "consume", counting)
    # plain: refused before decoding, 4,096 tokens of 9 bits being more than 74 bits carry
    with pytest.raises(CodeExhaustedError, match="run out" if level != "plain" else
                       "74 bits cannot carry 4,096 tokens at the plain level"):
        decompress(tiny_model, forged)
    if level in ("ngram", "plain"):
        with pytest.raises(CodeExhaustedError):
            decompress_tokens(forged)
    assert decoded[0] <= (0 if level == "plain" else 256)


def test_files_of_format_4_decode_and_are_bounded_by_max_tokens(
        tiny_model: CausalLM, files: dict[str, bytes]) -> None:
    """Format 4's writer dropped every trailing zero, so no guard applies to its files: they
    decode as before, and a forged count is bounded by the caller's max_tokens."""
    for level in ("tokens", "plain"):
        old = write_skv(read_skv(files[level]).session, 4).data
        assert read_skv(old).version == 4
        assert decompress(tiny_model, old).tokens == TOKENS
        with pytest.raises(DecodeLimitError):
            decompress(tiny_model, _forged(old, 64, version=4), max_tokens=32)


@pytest.mark.parametrize("version", [4, 5])
def test_a_token_code_with_a_zero_bit_appended_is_refused(tiny_model: CausalLM,
                                                          files: dict[str, bytes],
                                                          version: int) -> None:
    """One more zero bit (a padding bit claimed as code) decodes to the same tokens: the file
    is refused as non-canonical, after its tokens verified."""
    session = read_skv(files["tokens"]).session
    if version == 5:
        code = session.token_code
        data = code.data if code.num_bits % 8 else code.data + b"\x00"
        longer = dataclasses.replace(code, data=data, num_bits=code.num_bits + 1)
        forged = write_skv(dataclasses.replace(session, token_code=longer), 5).data
    else:  # format 4 drops trailing zeros on write: forge the header's padding bits instead
        forged = _with_padding(write_skv(session, 4).data)
    with pytest.raises(CorruptFileError, match="not the one its writer writes"):
        decompress(tiny_model, forged)


def _with_padding(data: bytes) -> bytes:
    """``data`` (a format-4 file) with one more zero bit of token code: a zero byte appended to
    the code if its last byte is full, else one padding bit less (framing recomputed)."""
    version, sections = unframe(data, MAGIC, (4,), _ERRORS, "fixture")
    header = bytearray(sections[0])
    padding = header[0] >> 5
    if padding:
        header[0] = (header[0] & 0x1F) | (padding - 1) << 5
        sections[0] = bytes(header)
    else:
        header[0] = (header[0] & 0x1F) | 7 << 5
        sections[0], sections[1] = bytes(header), sections[1] + b"\x00"
    return frame(MAGIC, version, sections)


def test_cli_decompress_max_tokens(use_tiny: CausalLM, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path
    skv = folder / "s.skv"
    skv.write_bytes(compress(use_tiny, TOKENS, level="plain").data)
    status = cli.main(["decompress", str(skv), "-o", str(folder / "t.json"), "--tokens-only",
                       "--max-tokens", "7"])
    err = capsys.readouterr().err
    assert status != 0 and err.count("\n") == 1 and "more than the 7" in err
    assert cli.main(["decompress", str(skv), "-o", str(folder / "t.json"), "--tokens-only",
                     "--max-tokens", "8"]) == 0


def test_cli_check_max_tokens(use_tiny: CausalLM, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    skv = tmp_path / "s.skv"
    skv.write_bytes(compress(use_tiny, TOKENS, level="tokens").data)
    status = cli.main(["check", str(skv), "--report", str(tmp_path / "r" / "c.md"),
                       "--max-tokens", "7"])
    err = capsys.readouterr().err
    assert status != 0 and err.count("\n") == 1 and "more than the 7" in err
