"""DFlash2's dynamic convolutions: a short grouped depthwise convolution along the draft block, causal inside
the block (slot s reads slots s − t, t < kernel, never slots before the block's first), whose kernel is a
learned per-channel base plus a per-group offset predicted from the hidden state.

Each sublayer (attention, MLP) is wrapped: the normed input x goes through the input convolution, the
sublayer's output through the output convolution; both offsets come from one projection of x.
"""
from __future__ import annotations

import torch
from torch import nn


def grouped_dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """y[s] = Σ_t x[s − t] · (base[t] + delta[s, t, group]) over taps t <= s within each block.

    x [..., L, d] with L a multiple of `block_size` (consecutive blocks); delta [..., L, K, G] (G groups
    of d / G channels); base [K, d]. Returns [..., L, d] in x's dtype."""
    kernel, d = base.shape
    groups = delta.shape[-1]
    xs = x.reshape(-1, block_size, groups, d // groups)
    ds = delta.reshape(-1, block_size, kernel, groups)
    out = torch.zeros_like(xs)
    for t in range(kernel):
        coeff = base[t].to(xs.dtype).view(groups, d // groups) + ds[:, t:, t, :, None]
        out[:, t:] += xs[:, :block_size - t] * coeff
    return out.reshape(x.shape)


class DynamicConv(nn.Module):
    """The input and output convolutions of one sublayer. Weights (the released names): `base_kernel`
    [2, K, d] (input, output), `kernel_projection` d -> 2·K·G. Initialised as the identity (base tap 0 = 1,
    the rest and the projection 0): a fresh DFlash2 layer computes what a DFlash layer does."""

    def __init__(self, hidden_size: int, block_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.block_size, self.kernel_size, self.groups = block_size, kernel_size, hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.base_kernel.is_meta:
            return
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the input convolution of x, the output convolution's offsets [..., L, K, G])."""
        delta = self.kernel_projection(x).unflatten(-1, (2, self.kernel_size, self.groups))
        return grouped_dynamic_conv(x, delta[..., 0, :, :], self.base_kernel[0], self.block_size), delta[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The output convolution of the sublayer's output y."""
        return grouped_dynamic_conv(y, delta, self.base_kernel[1], self.block_size)
