"""Issue 46, point 1: one block hash (``seqkv.blockhash``) for every prefix key.

Properties of the chain (block boundaries, token granularity, roots apart), the pinned values
that persisted keys depend on (the trie's format-5 identity above all), the refusals of bad
input, and a source check that no other SHA-256-over-tokens key function exists in
``src/seqkv``, with a mutant that adds one.
"""

from __future__ import annotations

import ast
import hashlib
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from seqkv.blockhash import (
    HASH_BYTES,
    chain_root,
    hash_block_chain,
    hash_block_tokens,
    namespace_root,
)
from seqkv.errors import InvalidNameError, InvalidTokensError
from seqkv.integrations.vllm.keys import KeySpace
from seqkv.namespaces import Namespace
from seqkv.store.ids import NamespaceKey
from seqkv.store.index import INDEX_DOMAIN, chain_keys
from seqkv.trie.keys import prefix_hash

SRC = Path(__file__).resolve().parents[1] / "src" / "seqkv"
TOKENS = st.lists(st.integers(0, 2**40), max_size=40)


@given(TOKENS, st.data())
def test_a_chain_is_the_steps_over_its_blocks(tokens: list[int], data: st.DataObject) -> None:
    """The chain at each boundary is ``hash_block_tokens`` of the last block after the previous
    boundary's hash, whatever the block lengths (one token included)."""
    ends = sorted(set(data.draw(st.lists(st.integers(1, max(len(tokens), 1)), max_size=8))))
    ends = [e for e in ends if e <= len(tokens)]
    root = chain_root(b"test", b"a")
    chain = hash_block_chain(root, tokens, ends)
    parent, start = root, 0
    for end, value in zip(ends, chain, strict=True):
        parent = hash_block_tokens(parent, tokens[start:end])
        start = end
        assert value == parent and len(value) == HASH_BYTES


@given(TOKENS, TOKENS)
def test_a_key_at_a_boundary_does_not_see_later_tokens(head: list[int], tail: list[int]) -> None:
    root = chain_root(b"test", b"a")
    ends = [len(head)] if head else []
    assert hash_block_chain(root, head + tail, ends) == hash_block_chain(root, head, ends)


def test_partial_blocks_are_hashed_at_token_granularity() -> None:
    """Every token counts: blocks differing in one token, or by one token more, differ; and the
    boundaries are part of the key (the same tokens in other blocks give another chain)."""
    root = chain_root(b"test", b"a")
    base = hash_block_tokens(root, [1, 2, 3])
    assert base != hash_block_tokens(root, [1, 2, 4])
    assert base != hash_block_tokens(root, [1, 2, 3, 0])
    assert base != hash_block_tokens(root, [1, 2])
    assert hash_block_chain(root, [1, 2, 3], [1, 3])[-1] != base
    assert hash_block_chain(root, [1, 2, 3], [3]) == [base]


def test_contexts_are_apart() -> None:
    tokens = [5, 6, 7]
    values = {hash_block_tokens(root, tokens) for root in (
        chain_root(b"d", b"tenant-a"), chain_root(b"d", b"tenant-b"), chain_root(b"e", b"tenant-a"),
        chain_root(b"d", b"tenant-", b"a"), chain_root(b"d"), namespace_root("tenant-a"),
        namespace_root(""))}
    assert len(values) == 7
    space = KeySpace(b"m" * 8, "bfloat16", 2, "cpu", b"c")
    assert space.block_keys(tokens, "a") != space.block_keys(tokens, "b")
    a, b = NamespaceKey(bytes(16)), NamespaceKey(bytes(15) + b"\x01")
    assert chain_keys(a, list(range(16)), [16], 32) != chain_keys(b, list(range(16)), [16], 32)


def _format_5_identity(namespace: str, tokens: list[int]) -> str:
    """What ``.skv`` files of format 5 persist as ``prefix_hash``, written out by hand."""
    name = namespace.encode()
    return hashlib.sha256(b"seqkv.trie.prefix.v1\x00" + struct.pack("<I", len(name)) + name
                          + np.asarray(tokens, dtype="<i8").tobytes()).hexdigest()


def test_the_trie_key_is_the_format_5_file_identity() -> None:
    """Files written before the block hash still resolve: their identity is the one-block chain
    from the namespace, byte for byte (and pinned)."""
    generator = random.Random(46)
    for namespace in ("", "tenant-a", "é", "x" * 300):
        for length in (0, 1, 17, 300):
            tokens = [generator.randrange(2**40) for _ in range(length)]
            want = _format_5_identity(namespace, tokens)
            assert hash_block_tokens(namespace_root(namespace), tokens).hex() == want
            assert prefix_hash(Namespace(namespace), tokens) == want
    assert prefix_hash(Namespace(""), [1, 2, 3]) == (
        "f71e03c58f38137b" + prefix_hash(Namespace(""), [1, 2, 3])[16:])


def test_keys_are_pinned() -> None:
    """A change here orphans persisted keys: the store's index entries and warm entries."""
    assert chain_root(b"d", b"a").hex()[:16] == "550ef9baa8b90815"
    assert hash_block_tokens(chain_root(b"d", b"a"), [1, 2, 3]).hex()[:16] == "8774625a4577492b"
    assert [k.hex() for k in chain_keys(NamespaceKey(bytes(16)), list(range(40)), [16, 32], 6)
            ] == ["00cd86517cab", "4ae435e456da"]
    assert INDEX_DOMAIN == b"seqkv.store.index.v2"


@pytest.mark.parametrize("tokens", [[1.5, 2.0], [True, False], [2**64], [[1, 2]], ["a"],
                                    np.array([1.0]), np.array([2**63], dtype=np.uint64)])
def test_tokens_that_are_not_int64_are_refused_by_name(tokens: object) -> None:
    with pytest.raises(InvalidTokensError):
        hash_block_tokens(chain_root(b"d"), tokens)  # type: ignore[arg-type]


def test_mutant_without_the_dtype_check_hashes_floats_as_their_truncation() -> None:
    """The defect the check guards: ``np.asarray(..., dtype="<i8")`` truncates 1.5 to 1, so a
    float sequence would share a key with another sequence."""
    truncated = np.asarray([1.5, 2.0]).astype("<i8").tobytes()
    assert truncated == np.asarray([1, 2], dtype="<i8").tobytes()
    with pytest.raises(InvalidTokensError):
        hash_block_tokens(chain_root(b"d"), [1.5, 2.0])  # type: ignore[list-item]


@pytest.mark.parametrize("ends", [[0], [2, 2], [3, 2], [4]])
def test_block_ends_out_of_order_or_past_the_tokens_are_refused(ends: list[int]) -> None:
    with pytest.raises(InvalidTokensError, match="block ends"):
        hash_block_chain(chain_root(b"d"), [1, 2, 3], ends)


def test_a_namespace_utf8_cannot_encode_is_refused() -> None:
    with pytest.raises(InvalidNameError, match="surrogate"):
        namespace_root("a\ud800")


def test_a_later_block_needs_the_whole_parent_key() -> None:
    space = KeySpace(b"m" * 8, "bfloat16", 2, "cpu", b"c")
    keys = space.block_keys([1, 2, 3, 4], "t")
    assert space.block_keys([1, 2, 3, 4], "t", start=1, parent=keys[0]) == keys[1:]
    for parent in (None, keys[0][:16]):
        with pytest.raises(ValueError, match="parent"):
            space.block_keys([1, 2, 3, 4], "t", start=1, parent=parent)


# One prefix-hash function: the only functions that hash a prefix of token ids are those of
# seqkv.blockhash. Every other function of the package that calls hashlib is listed here with
# what it hashes; none is a prefix key (a whole sequence's fingerprint or binding is not: it is
# compared, never looked up by prefix). A new caller fails the test until it is listed here,
# which is where a second prefix-hash scheme would be caught in review.
_NOT_PREFIX_KEYS = {
    "bench/figures.py:tokens_sha256": "a whole text's tokens, named in the figure baselines",
    "checker/run.py:check_skv": "a checked file's bytes, in the report",
    "checker/run.py:_tokens_sha256": "a whole text's tokens, in the report",
    "digests.py:digest": "the package's content digests (tokens_digest: a whole session)",
    "formats/skv_legacy.py:read_legacy": "the legacy file's checksum",
    "integrations/vllm/keys.py:folder_digest": "a model folder's files",
    "integrations/vllm/scheduler.py:store_id": "a session name the store would refuse",
    "mixing/dictionary.py:_read_format_1": "a dictionary file's checksum",
    "mixing/dictionary.py:__init__": "a dictionary's content",
    "models/adapter.py:identity": "a model's config, weights and tokenizer",
    "models/gguf_cache.py:cache_key": "a GGUF file's identity",
    "models/integer/blocks.py:digest": "integer weights",
    "models/integer/forward.py:digest": "integer weights",
    "models/integer/forward.py:__init__": "integer weights and layer count",
    "models/integer/native.py:_compiled": "a native kernel's source and flags",
    "models/integer/weights.py:digest": "integer weights",
    "store/backends/base.py:of": "a codec identity's description",
    "store/binding.py:digest_binding": "a session row's binding (a whole session's digest)",
    "store/ids.py:namespace_key": "a namespace's name",
}


def _hashing_functions(root: Path) -> list[str]:
    """``module:function`` of every function outside ``blockhash.py`` that uses ``hashlib``
    (and every module that imports it under another name or imports from it)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == "blockhash.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            renamed = isinstance(node, ast.Import) and any(
                a.name == "hashlib" and a.asname for a in node.names)
            if (isinstance(node, ast.ImportFrom) and node.module == "hashlib") or renamed:
                found.append(f"{relative} (imports hashlib by another name)")
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name)
                    and inner.value.id == "hashlib" for inner in ast.walk(node)):
                found.append(f"{relative}:{node.name}")
    return found


def test_no_other_prefix_hash_function_in_the_package() -> None:
    assert sorted(set(_hashing_functions(SRC)) - set(_NOT_PREFIX_KEYS)) == []


def test_mutant_a_second_prefix_hash_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "seqkv"
    for path in SRC.rglob("*.py"):
        target = copy / path.relative_to(SRC)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    (copy / "store" / "index.py").write_text((copy / "store" / "index.py").read_text() + (
        "\n\ndef running_keys(tokens):\n"
        "    return hashlib.sha256(bytes(tokens)).digest()\n"))
    (copy / "coding" / "tags.py").write_text(
        "from hashlib import sha256\n\n\ndef tag(tokens):\n    return sha256(tokens).digest()\n")
    assert sorted(set(_hashing_functions(copy)) - set(_NOT_PREFIX_KEYS)) == [
        "coding/tags.py (imports hashlib by another name)", "store/index.py:running_keys"]
