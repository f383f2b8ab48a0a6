# SPDX-License-Identifier: Apache-2.0
"""Bitwise comparison of torch tensors for the drop-in GPU tests (torch passed in, so that
collecting those tests needs no torch)."""


def bits(torch, t):
    t = t.contiguous()
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def same(torch, a, b, what):
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert torch.equal(bits(torch, a), bits(torch, b)), what
