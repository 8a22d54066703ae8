"""DFlash2's candidate selector: per slot, the unary logits' top-k candidates re-scored by a low-rank
bilinear term between the previous slot's token and each candidate,

    score(prev, c | h) = unary[c] + (P[prev] ⊙ W h) · S[c]      (P, S: codebooks [rows, r]; W: d -> r)

with h the slot's hidden state after the final norm. Slot 1's predecessor is the anchor. Rows are draft
vocabulary rows (all of the vocabulary without one); a predecessor outside the draft vocabulary (IGNORE,
a negative row) reads a zero codebook row, so its slot keeps its unary ranking.

Paths through the K × top-k lattice: `greedy_path` picks the best candidate slot by slot (the reference's
walk); `best_path` maximises the summed scores over the whole lattice (Viterbi); `edge_log_probs` scores a
tree node's children given its token.
"""
from __future__ import annotations

import torch
from torch import nn


class CandidateSelector(nn.Module):
    """Weights (the released names): `predecessor_codebook`, `successor_codebook` [rows, r],
    `hidden_projection` d -> r."""

    def __init__(self, rows: int, hidden_size: int, rank: int, top_k: int, std: float = 0.02):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(rows, rank))
        self.successor_codebook = nn.Parameter(torch.empty(rows, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        if not self.predecessor_codebook.is_meta:
            for p in (self.predecessor_codebook, self.successor_codebook, self.hidden_projection.weight):
                nn.init.normal_(p, std=std)

    def context(self, hidden: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """P[prev] ⊙ W h: hidden [..., d], prev [...] rows (negative: a zero row) -> [..., r]."""
        pred = self.predecessor_codebook[prev.clamp_min(0)] * (prev >= 0).unsqueeze(-1)
        return pred * self.hidden_projection(hidden).to(pred.dtype)

    def edge_scores(self, unary: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor,
                    cands: torch.Tensor) -> torch.Tensor:
        """unary[cands] + transition: unary [..., R], hidden [..., d], prev [...], cands [..., k] -> [..., k]."""
        trans = (self.context(hidden, prev).unsqueeze(-2) * self.successor_codebook[cands]).sum(-1)
        return unary.gather(-1, cands) + trans.to(unary.dtype)

    def candidates(self, unary: torch.Tensor) -> torch.Tensor:
        """[..., k] int64: the unary logits' top-k rows (k = min(top_k, R))."""
        return unary.topk(min(self.top_k, unary.shape[-1]), dim=-1).indices

    def greedy_path(self, unary: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """Rows [B, K] chosen slot by slot: unary [B, K, R], hidden [B, K, d], anchor [B] rows. Everything but
        the predecessor is computed for all slots at once; the walk itself is K small steps."""
        b, k_slots = unary.shape[:2]
        if k_slots == 0:
            return anchor.new_empty(b, 0)
        cands = self.candidates(unary)                                            # [B, K, k]
        base = unary.gather(-1, cands)
        proj = self.hidden_projection(hidden)                                     # [B, K, r]
        succ = self.successor_codebook[cands]                                     # [B, K, k, r]
        prev, out = anchor, []
        for s in range(k_slots):
            pred = self.predecessor_codebook[prev.clamp_min(0)] * (prev >= 0).unsqueeze(-1)
            trans = ((pred * proj[:, s].to(pred.dtype)).unsqueeze(-2) * succ[:, s]).sum(-1)
            scores = base[:, s] + trans.to(base.dtype)
            prev = cands[:, s].gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
            out.append(prev)
        return torch.stack(out, 1)

    def best_path(self, unary: torch.Tensor, hidden: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """Rows [B, K] of the path with the highest summed score through the top-k lattice (Viterbi)."""
        b, k_slots = unary.shape[:2]
        if k_slots == 0:
            return anchor.new_empty(b, 0)
        cands = self.candidates(unary)                                               # [B, K, k]
        score = self.edge_scores(unary[:, 0], hidden[:, 0], anchor, cands[:, 0])      # [B, k]
        back = []
        for s in range(1, k_slots):
            ctx = self.context(hidden[:, s, None].expand(-1, cands.shape[-1], -1), cands[:, s - 1])  # [B, k, r]
            trans = torch.einsum("bar,bcr->bac", ctx, self.successor_codebook[cands[:, s]])
            total = score.unsqueeze(-1) + trans.to(score.dtype)                        # [B, k_prev, k]
            score, arg = total.max(1)
            score = score + unary[:, s].gather(-1, cands[:, s])
            back.append(arg)
        best = [score.argmax(-1)]
        for arg in reversed(back):
            best.append(arg.gather(-1, best[-1][:, None]).squeeze(-1))
        idx = torch.stack(best[::-1], 1)                                               # [B, K]
        return cands.gather(-1, idx[..., None]).squeeze(-1)

    def edge_log_probs(self, unary: torch.Tensor, hidden: torch.Tensor, prev: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A tree node's children at one slot: (candidate rows [k], log-softmax of their edge scores [k] fp32)
        given the node's row `prev`; unary [R], hidden [d] of the slot."""
        cands = self.candidates(unary)
        prev_t = torch.tensor(prev, device=unary.device)
        scores = self.edge_scores(unary, hidden, prev_t, cands)
        return cands, torch.log_softmax(scores.float(), -1)
