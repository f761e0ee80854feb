"""Math whose per-row result does not depend on which other rows are in the batch.

Why: the executors' outputs must match the serial executor bit for bit on CPU, yet a micro-batch
holds a different set of rows than the full batch. On CPU float32 two things break that:
- `x @ w.T` picks its kernel and blocking by M, so a row's dot products can be summed in a
  different order for M = 1, 2 than for larger M (measured with torch 2.14 / oneDNN);
- vectorised elementwise kernels run the tail of a tensor (numel not a multiple of the vector
  width) through a scalar path, and `torch.sigmoid` / `F.silu` round differently there.
So on CPU: a linear is an elementwise product and a sum over the contiguous last dimension (the
reduction order depends only on H), and sigmoid is built from `exp`, add and divide, which
round identically on both paths. On CUDA these fall back to the fast library calls: GPU results
are checked against an fp64 reference within tolerance, not bit for bit.

Shapes: x [..., K], w [N, K] -> [..., N].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows per chunk of the CPU product, to bound the [rows, N, K] temporary (about 32 MB fp32).
_CPU_CHUNK_ELEMS = 1 << 23


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types and float32; float64 stays float64 (the fp64 references)."""
    return torch.promote_types(dtype, torch.float32)


def exact(t: torch.Tensor) -> bool:
    """Whether the batch-independent CPU formulation is used for this tensor."""
    return t.device.type == "cpu"


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., K] @ w[N, K].T -> [..., N]; on CPU each output element is an independent sum."""
    if not exact(x):
        return F.linear(x, w)
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])  # [M, K]
    n, k = w.shape
    step = max(1, _CPU_CHUNK_ELEMS // max(1, n * k))
    outs = [
        (rows[i : i + step, None, :] * w[None, :, :]).sum(-1)  # [m, N, K] -> [m, N]
        for i in range(0, rows.shape[0], step)
    ]
    out = torch.cat(outs) if outs else rows.new_empty((0, n))
    return out.reshape(*lead, n)


def batched_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-group linear: x [G, M, K], w [G, N, K] -> [G, M, N]."""
    if not exact(x):
        return torch.bmm(x, w.transpose(1, 2))
    return torch.stack([linear(x[g], w[g]) for g in range(x.shape[0])]) if x.shape[0] else (
        x.new_empty((0, x.shape[1], w.shape[1]))
    )


def gathered_linear(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Row r times w[idx[r]]: x [M, K], w [G, N, K], idx [M] int64 in [0, G) -> [M, N]."""
    if not exact(x):
        return torch.bmm(w[idx], x[:, :, None])[:, :, 0]
    g, n, k = w.shape
    step = max(1, _CPU_CHUNK_ELEMS // max(1, n * k))
    outs = [
        (x[i : i + step, None, :] * w[idx[i : i + step]]).sum(-1)  # [m, N, K] -> [m, N]
        for i in range(0, x.shape[0], step)
    ]
    return torch.cat(outs) if outs else x.new_empty((0, n))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    if not exact(x):
        return torch.sigmoid(x)
    return 1.0 / (1.0 + torch.exp(-x))


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] (gate, up) -> [..., I]: silu(gate) * up, SGLang's `SiluAndMul`."""
    gate, up = gate_up.chunk(2, dim=-1)
    if not exact(gate_up):
        return F.silu(gate) * up
    return gate * sigmoid(gate) * up
