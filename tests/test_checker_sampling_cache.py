"""The entropy-rate sampler's padded contexts (``seqkv.checker.sampling.PaddedContexts``): each
batch row computes what its context alone computes, with the sampled tokens written in place
into the reserved cache (``_ReservedLayer``), step after step."""

from __future__ import annotations

import torch

from seqkv.checker.sampling import PaddedContexts
from seqkv.models import CausalLM

TOKENS = [5, 17, 99, 3, 250, 7, 31, 400, 12, 8, 301, 77]


@torch.inference_mode()
def _alone(model: CausalLM, tokens: list[int]) -> torch.Tensor:
    logits = model.model(input_ids=torch.tensor([tokens])).logits[0, -1]
    return torch.log_softmax(logits.double(), dim=-1)


def test_padded_rows_match_each_context_alone_over_several_steps(tiny_model: CausalLM) -> None:
    with torch.inference_mode():
        out = tiny_model.model(input_ids=torch.tensor([TOKENS]), use_cache=True)
    kv = tiny_model.kv_tensor(out.past_key_values)
    logits = out.logits[0].float()
    ends, per, steps = [4, 9, 12], 2, 4
    source = PaddedContexts(tiny_model, kv, logits, ends, per, steps)
    first = source.start(len(ends) * per)
    for index, end in enumerate(ends):
        assert torch.allclose(first[index * per], _alone(tiny_model, TOKENS[:end]), atol=1e-5)
    grown = [list(TOKENS[:end]) for end in ends for _ in range(per)]
    for step in range(steps - 1):
        sampled = torch.tensor([(row * 37 + step * 11) % 500 for row in range(len(grown))])
        rows = source.advance(sampled)
        for row, tokens in enumerate(grown):
            tokens.append(int(sampled[row]))
            assert torch.allclose(rows[row], _alone(tiny_model, tokens), atol=1e-4), (step, row)
