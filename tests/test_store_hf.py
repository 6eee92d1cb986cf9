"""save_cache / load_cache: a DynamicCache persisted and restored bit for bit, in three dtypes, in
its own file format (``seqkv.formats.hf_cache``), whose older version still loads."""

from __future__ import annotations

import copy
import random
import struct
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from legacy_files import LEGACY, must_decode_here
from seqkv.bounds import Bound, BoundViolationError
from seqkv.digests import Digest
from seqkv.errors import (
    CorruptFileError,
    EnvironmentMismatchError,
    InvalidKVError,
    NotASeqKVFileError,
    SeqKVError,
    UnsupportedVersionError,
)
from seqkv.formats.framing import encode_varint
from seqkv.formats.hf_cache import (
    CACHE_VERSION,
    CacheFile,
    read_cache,
    write_cache,
)
from seqkv.formats.residual import encode_residual_section
from seqkv.formats.skv import MAGIC, read_skv, write_skv
from seqkv.kvcache import tensor_from_cache
from seqkv.limits import MAX_LEVEL_BYTES, MAX_SEGMENTS
from seqkv.models import CausalLM, tiny_random_llama
from seqkv.session import PrefixRef
from seqkv.skv import compress, decompress
from seqkv.store.hf import load_cache, save_cache

PROMPT = [1, 17, 230, 5, 99, 410, 3, 77, 301, 12, 12, 64, 128, 256, 7, 33]


def _continue(model: torch.nn.Module, cache: DynamicCache, prompt: list[int]) -> list[int]:
    ids = torch.tensor([[*prompt, 42]])  # [1, T]: generate runs only the uncached last token
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids),  # type: ignore[operator]
                             cache=copy.deepcopy(cache), max_new_tokens=6, do_sample=False)
    generated: list[int] = out[0, ids.shape[1]:].tolist()
    return generated


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cache_round_trips_bit_for_bit(dtype: torch.dtype, tmp_path: Path) -> None:
    model = tiny_random_llama()
    hf = model.model.to(dtype)
    with torch.inference_mode():
        cache = DynamicCache()
        hf(input_ids=torch.tensor([PROMPT]), cache=cache, use_cache=True)
    saved = save_cache(cache, tmp_path / "c.skvc", model=hf, tokens=PROMPT)
    restored = load_cache(tmp_path / "c.skvc", model=hf)
    original = tensor_from_cache(cache)
    again = tensor_from_cache(restored)
    assert again.dtype == dtype
    assert torch.equal(original.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       again.view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert _continue(hf, restored, PROMPT) == _continue(hf, cache, PROMPT)
    assert saved.tokens == len(PROMPT) and saved.file_bytes > 0


def test_wrong_token_count_is_refused(tiny_model: CausalLM, tmp_path: Path) -> None:
    cache = tiny_model.prefill(PROMPT)
    with pytest.raises(InvalidKVError, match="sequences"):
        save_cache(cache, tmp_path / "c.skvc", model=tiny_model, tokens=PROMPT[:-1])


def test_other_files_are_refused(tiny_model: CausalLM, tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"not a cache file")
    with pytest.raises(NotASeqKVFileError, match="save_cache"):
        load_cache(tmp_path / "x", model=tiny_model)


def _saved(model: CausalLM, path: Path) -> bytes:
    save_cache(model.prefill(PROMPT), path, model=model, tokens=PROMPT)
    return path.read_bytes()


def _recrc(body: bytes) -> bytes:
    """``body`` (a file without its CRC) with its CRC-32 appended."""
    return body + struct.pack("<I", zlib.crc32(body))


def test_the_file_is_version_2_and_holds_no_skv(tiny_model: CausalLM, tmp_path: Path) -> None:
    """The cache file is its own format of the coded session: no ``.skv`` inside, and it reads
    back to the session it was written from, and writes back to the same bytes."""
    data = _saved(tiny_model, tmp_path / "c.skvc")
    assert data[:10] == b"SKVCACHE" + bytes([CACHE_VERSION, 0]) and CACHE_VERSION == 2
    assert MAGIC not in data
    read = read_cache(data)
    assert (read.version, read.dtype) == (2, 0)
    assert write_cache(read.dtype, read.session) == data
    assert read_cache(write_cache(2, read.session)) == CacheFile(2, read.session, 2)


def test_a_version_1_file_still_loads(tiny_model: CausalLM, tmp_path: Path) -> None:
    """Version 1 framed a whole ``.skv``: such a file (made here as its writer made it) loads."""
    kv = tiny_model.kv_tensor(tiny_model.prefill(PROMPT))
    skv = compress(tiny_model, PROMPT, kv=kv, tolerance=0.0, level="ngram").data
    (tmp_path / "v1.skvc").write_bytes(b"SKVCACHE" + bytes([1, 0]) + skv)
    assert read_cache((tmp_path / "v1.skvc").read_bytes()).version == 1
    restored = load_cache(tmp_path / "v1.skvc", model=tiny_model)
    assert torch.equal(tensor_from_cache(restored), kv)


@pytest.mark.parametrize("name", ["v2-plain.skv", "v2-tokens-bitexact.skv"])
def test_a_version_1_file_framing_a_format_2_skv_loads_as_decompress_reads_it(
        tiny_model: CausalLM, tmp_path: Path, name: str) -> None:
    """The first version-1 writer framed a format-2 ``.skv`` (JSON header): it reads with what
    this machine knows of the reader (``reader_side``), as ``decompress`` reads the bare file:
    the same KV, or the same refusal by name where this machine's profile is not the file's."""
    legacy = (LEGACY / name).read_bytes()
    (tmp_path / "v1.skvc").write_bytes(b"SKVCACHE" + bytes([1, 0]) + legacy)
    if must_decode_here(tiny_model, legacy):
        restored = load_cache(tmp_path / "v1.skvc", model=tiny_model)
        assert torch.equal(tensor_from_cache(restored), decompress(tiny_model, legacy).kv)
    else:
        with pytest.raises(EnvironmentMismatchError):
            load_cache(tmp_path / "v1.skvc", model=tiny_model)


def test_a_version_2_file_without_its_kv_digest_is_refused(tiny_model: CausalLM,
                                                          tmp_path: Path) -> None:
    """Flags cleared and the digest cut out (CRC recomputed): the load would return this
    machine's recompute unchecked, so the file is refused by name."""
    data = _saved(tiny_model, tmp_path / "c.skvc")
    session = read_cache(data).session
    assert session.kv_digest is not None and session.residual is not None
    residual = encode_residual_section(session.residual)
    cut = session.kv_digest + encode_varint(len(residual)) + residual
    body = bytearray(data[:-4])
    body[10] &= ~0b101  # no residual, no KV digest
    at = body.index(cut)
    del body[at:at + len(cut)]
    with pytest.raises(CorruptFileError, match="no KV digest"):
        read_cache(_recrc(bytes(body)))


def test_a_version_1_file_naming_a_prefix_is_refused(tiny_model: CausalLM) -> None:
    session = compress(tiny_model, PROMPT, level="ngram").session
    forged = replace(session, prefix=PrefixRef("ab" * 32, 3, Digest(bytes(8))))
    data = b"SKVCACHE" + bytes([1, 0]) + write_skv(forged).data
    with pytest.raises(CorruptFileError, match="prefix"):
        read_cache(data)


@pytest.mark.parametrize(("version", "dtype"), [(0, 0), (3, 0), (2, 3)])
def test_an_unknown_version_or_dtype_is_refused_by_name(tiny_model: CausalLM, tmp_path: Path,
                                                        version: int, dtype: int) -> None:
    data = bytearray(_saved(tiny_model, tmp_path / "c.skvc"))
    data[8:10] = bytes([version, dtype])
    (tmp_path / "c.skvc").write_bytes(bytes(data))
    with pytest.raises(UnsupportedVersionError, match=f"version {version} \\(dtype code {dtype}"):
        load_cache(tmp_path / "c.skvc", model=tiny_model)


def test_damage_is_refused(tiny_model: CausalLM, tmp_path: Path) -> None:
    """Each field's check, fed the defect it names (the CRC recomputed where the defect is a
    well-checksummed forgery)."""
    data = _saved(tiny_model, tmp_path / "c.skvc")
    body = data[:-4]
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    with pytest.raises(CorruptFileError, match="CRC32"):
        read_cache(bytes(flipped))
    with pytest.raises(CorruptFileError, match="truncated"):
        read_cache(data[:12])
    flags = body[10]
    with pytest.raises(CorruptFileError, match="unknown flags"):
        read_cache(_recrc(body[:10] + bytes([flags | 0b1000]) + body[11:]))
    level_length = body[11]
    with pytest.raises(CorruptFileError, match="level length"):
        read_cache(_recrc(body[:11] + bytes([MAX_LEVEL_BYTES + 1]) + body[12:]))
    with pytest.raises(CorruptFileError, match="no level name"):
        read_cache(_recrc(body[:12] + b"N" + body[13:]))
    segments_at = 12 + level_length
    with pytest.raises(CorruptFileError, match="segment count"):
        read_cache(_recrc(body[:segments_at] + encode_varint(MAX_SEGMENTS + 1)
                          + body[segments_at + 1:]))
    with pytest.raises(CorruptFileError, match="segment length"):  # a non-minimal varint
        read_cache(_recrc(body[:segments_at + 1] + b"\x90\x00" + body[segments_at + 2:]))
    declared = flags if flags >> 5 else flags | 1 << 5  # at least the last bit unused
    with pytest.raises(CorruptFileError, match="unused bits"):
        read_cache(_recrc(body[:10] + bytes([declared]) + body[11:-1] + bytes([body[-1] | 1])))


def test_a_save_whose_bound_fails_writes_nothing(monkeypatch: pytest.MonkeyPatch,
                                                 tiny_model: CausalLM, tmp_path: Path) -> None:
    """``save_cache`` raises on the codec's bounds as ``seqkv.compress`` does (the mutant: a
    bound forced to fail)."""
    import seqkv.codec as codec

    failed = Bound("forced", "measured <= bound", 0.0, 1.0, False, "a bound forced to fail")
    monkeypatch.setattr(codec, "code_within_table_cost", lambda *_: failed)
    with pytest.raises(BoundViolationError):
        save_cache(tiny_model.prefill(PROMPT), tmp_path / "c.skvc", model=tiny_model,
                   tokens=PROMPT)
    assert not (tmp_path / "c.skvc").exists()


def test_forged_files_end_in_a_seqkv_error_or_read_canonically(tiny_model: CausalLM,
                                                                tmp_path: Path) -> None:
    """Every byte of a body changed to random values, its CRC recomputed (seeded, so the run
    repeats): each forgery is refused with a ``SeqKVError`` or reads into a session that
    writes back to exactly its bytes (module invariant 2: no two files read alike)."""
    data = _saved(tiny_model, tmp_path / "c.skvc")
    body = data[:-4]
    rng = random.Random(46)
    accepted = 0
    for position in range(10, len(body)):
        for value in rng.sample(range(256), 8):
            forged = _recrc(body[:position] + bytes([value]) + body[position + 1:])
            try:
                read = read_cache(forged)
            except SeqKVError:
                continue
            accepted += 1
            assert write_cache(read.dtype, read.session) == forged
    assert accepted > 0  # digests and code bytes are free: some forgeries read


def test_a_version_1_load_reads_with_this_reader(tiny_model: CausalLM, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a format-2 file's float profile is this machine's, only the reader side (the model
    and this machine's profile) lets it load, so ``load_cache`` passes it to the ``.skv``
    reader: checked here by what the reader is given, on any machine."""
    import seqkv.formats.hf_cache as hf_cache

    given = []

    def spy(data: bytes, side: object = None) -> object:
        given.append(side)
        return read_skv(data, side)

    monkeypatch.setattr(hf_cache, "read_skv", spy)
    (tmp_path / "v1.skvc").write_bytes(
        b"SKVCACHE" + bytes([1, 0]) + (LEGACY / "v2-plain.skv").read_bytes())
    load_cache(tmp_path / "v1.skvc", model=tiny_model)
    assert len(given) == 1 and given[0] is not None
    assert given[0].model is not None and given[0].profile is not None


@pytest.mark.parametrize(("change", "message"), [
    ({"segments": (5, 11)}, "splits its tokens"),
    ({"vocab_size": None}, "lacks a vocabulary size"),
    ({"level": "segments:65", "vocab_size": None}, "beyond 64 segments"),
    ({"level": "tokens"}, "stores a vocabulary size"),
])
def test_a_session_in_a_form_its_level_does_not_write_is_refused(
        tiny_model: CausalLM, change: dict[str, object], message: str) -> None:
    """One file per cache: the segments and the vocabulary size follow from the level, as the
    ``.skv`` header derives them, so no second form of the same session reads."""
    session = compress(tiny_model, PROMPT, kv=tiny_model.prefill(PROMPT), tolerance=0.0,
                       level="ngram").session
    assert session.segments == (16,) and session.vocab_size is not None
    with pytest.raises(CorruptFileError, match=message):
        read_cache(write_cache(0, replace(session, **change)))  # type: ignore[arg-type]


def test_a_segments_session_reads_back(tiny_model: CausalLM) -> None:
    session = compress(tiny_model, PROMPT, kv=tiny_model.prefill(PROMPT), tolerance=0.0,
                       level="segments:3").session
    assert session.segments == (6, 5, 5)
    data = write_cache(0, session)
    read = read_cache(data).session
    assert read.segments == (6, 5, 5) and write_cache(0, read) == data
