"""The straightforward PyTorch composition of the acceptance step (softmax, gather, compare,
multinomial): the baseline `verify` is benchmarked against. Point-mass drafts, no top-k/top-p."""
import torch


def verify_composition(logits: torch.Tensor, drafts: torch.Tensor, temperature: float,
                       generator: torch.Generator | None = None):
    """logits [B, K+1, V], drafts [B, K] int64 -> tokens [B, K+1] int64 (-1 padded), num_accepted [B]."""
    B, K1, V = logits.shape
    K = K1 - 1
    p = torch.softmax(logits.float() / temperature, dim=-1)                      # [B, K+1, V]
    px = p[:, :K].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)                    # [B, K]
    u = torch.rand(B, K, device=logits.device, generator=generator)
    accepted = (u < px).int().cumprod(dim=1)                                      # accepted prefix
    num_accepted = accepted.sum(dim=1)                                            # [B]
    residual = p.clone()
    residual[:, :K].scatter_(-1, drafts.unsqueeze(-1), 0.0)                       # p minus x
    resampled = torch.multinomial(residual.view(-1, V), 1, generator=generator).view(B, K1)
    emitted = resampled.gather(1, num_accepted.unsqueeze(1).long()).squeeze(1)
    slots = torch.arange(K1, device=logits.device)
    tokens = torch.where(slots < num_accepted[:, None], torch.cat([drafts, drafts[:, :1]], 1), -1)
    tokens[torch.arange(B), num_accepted.long()] = emitted
    return tokens, num_accepted.int()
