"""Token cases shared by the decoding prototype tests (imported, not collected)."""

from __future__ import annotations

from hypothesis import strategies as st
from transformers import DynamicCache

from research.decoding.forward import forward_rows, greedy
from seqkv.models import CausalLM

VOCAB = 512  # the tiny test model's vocabulary

random_tokens = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)


@st.composite
def repetitive_tokens(draw: st.DrawFn) -> list[int]:
    """A short pattern repeated, with a few substitutions: prompt lookup's good case."""
    pattern = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6))
    tokens = (pattern * 40)[: draw(st.integers(1, 48))]
    for _ in range(draw(st.integers(0, 3))):
        tokens[draw(st.integers(0, len(tokens) - 1))] = draw(st.integers(0, VOCAB - 1))
    return tokens


def greedy_sequence(model: CausalLM, first: int, length: int) -> list[int]:
    """The model's own greedy continuation."""
    cache = DynamicCache()
    tokens = [first]
    while len(tokens) < length:
        tokens.append(greedy(forward_rows(model.model, cache, tokens[-1:]))[-1])
    return tokens
