"""What our own drafters propose on the committed prefixes of a vLLM run (the tests' reference)."""
from __future__ import annotations

import torch


def taps(target, token_ids: list[int], layer_ids) -> torch.Tensor:
    """[1, T, n_taps·d]: the HF target's hidden_states[i + 1] (output of decoder layer i) concatenated."""
    with torch.no_grad():
        out = target(torch.tensor([token_ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)


def replay(prompt: list[int], output: list[int], proposals: list, k: int):
    """Walks the solo run's rounds: proposal r = (anchor, drafts) sits at output index j (anchor ==
    output[j]), its accepted drafts are the prefix equal to output[j+1:], the next anchor follows them.
    Yields (committed prefix, anchor, vLLM's drafts) for each proposal inside the output."""
    j = 0
    for anchor, drafts in proposals:
        if j >= len(output):
            return
        assert anchor == output[j], f"proposal anchor {anchor} != output[{j}] = {output[j]}"
        assert len(drafts) == k
        yield prompt + output[:j], anchor, drafts
        n = 0
        while n < k and j + 1 + n < len(output) and drafts[n] == output[j + 1 + n]:
            n += 1
        j += n + 1


def our_drafts(target, drafter, context: list[int], anchor: int, k: int, seed: int = 0) -> list[int]:
    """Our drafter's k drafts for `anchor` at position len(context), memory = the context's taps."""
    memory = drafter.new_memory(1)
    drafter.extend_memory(memory, torch.tensor([context]), taps(target, context, drafter.target_layer_ids))
    p = torch.tensor([len(context)])
    drafts = drafter.draft(memory, torch.tensor([anchor]), num_tokens=k, seed=torch.tensor([seed]), position=p)
    return drafts[0].tolist()


def hf_greedy(target, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding with full re-forwards (no cache): the independent AR reference."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(target(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]
