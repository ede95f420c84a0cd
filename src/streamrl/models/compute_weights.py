"""Compute weights: a model's GEMM weights cast once per optimizer step, gradients to the fp32 masters.

Autocast casts every fp32 weight to bf16 again in each micro-batch's forward. Inside
`compute_weights(model, dtype)` each `Fused` module of the model (models/fused_llama.py) holds its GEMM
weights in `dtype`, the rows of several projections concatenated into one tensor where one GEMM serves
them (q | k | v, gate | up). `master_linear` runs a GEMM on such a tensor; its backward gives each
fp32 parameter its rows of the weight gradient in fp32, which autograd accumulates over the
micro-batches as it did autocast's (the optimizer and its fp32 state see the masters only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class _MasterLinear(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, x_t: bool, y_t: bool, *masters: torch.Tensor
    ) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            xm = (x.t() if x_t else x.reshape(-1, x.shape[-1])).to(weight.dtype)  # [N, K] (maybe a view)
            y = torch.mm(weight, xm.t()) if y_t else torch.mm(xm, weight.t())
        ctx.save_for_backward(xm, weight)
        ctx.x_t, ctx.y_t, ctx.x_shape = x_t, y_t, x.shape
        ctx.rows = [m.shape[0] for m in masters]
        ctx.master_dtype = masters[0].dtype
        return y if y_t or x_t else y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        xm, weight = ctx.saved_tensors
        with torch.autocast(device_type=g.device.type, enabled=False):
            gm = (g.t() if ctx.y_t else g.reshape(-1, g.shape[-1])).to(weight.dtype)  # [N, out]
            gx = None
            if ctx.needs_input_grad[0]:
                gx = torch.mm(weight.t(), gm.t()) if ctx.x_t else torch.mm(gm, weight).view(ctx.x_shape)
            grads: list[torch.Tensor | None] = [None] * len(ctx.rows)
            if any(ctx.needs_input_grad[4:]):
                gw = torch.mm(gm.t(), xm).to(ctx.master_dtype)  # one cast per micro-batch, as autocast's
                grads = list(gw.split(ctx.rows))
        return (gx, None, None, None, *grads)


def master_linear(
    x: torch.Tensor, weight: torch.Tensor, *masters: torch.Tensor, x_t: bool = False, y_t: bool = False
) -> torch.Tensor:
    """x @ weight.T with `weight` the row-concatenation of `masters` in the compute dtype (no bias). The
    gradient goes to the masters (each its rows, in their dtype), not to `weight`.

    x [..., K] -> [..., out]; x_t: x is given transposed, [K, N]; y_t: return the output transposed,
    [out, N] (row blocks of the masters' outputs are then contiguous: the MLP's gate and up)."""
    return _MasterLinear.apply(x, weight, x_t, y_t, *masters)


class Fused:
    """A module whose fused forward runs while `compute_weights` has set `_cw` (its GEMM weights)."""

    _cw: dict[str, torch.Tensor] | None = None
    _dtype: torch.dtype = torch.float32

    def _groups(self) -> dict[str, list[torch.Tensor]]:
        """name -> the parameters whose rows one compute weight concatenates."""
        return {}


def installed(model: Any) -> bool:
    return any(isinstance(m, Fused) for m in model.modules())


@torch.no_grad()
def _concat(params: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The params' rows stacked in `dtype`: one cast-and-copy pass, no fp32 intermediate."""
    out = torch.empty(
        sum(p.shape[0] for p in params), params[0].shape[1], dtype=dtype, device=params[0].device
    )
    row = 0
    for p in params:
        out[row : row + p.shape[0]].copy_(p)
        row += p.shape[0]
    return out


@contextlib.contextmanager
def compute_weights(model: Any, dtype: torch.dtype) -> Iterator[None]:
    """Within: the fused modules of `model` run their fused forward on `dtype` copies of the current
    weights (one optimizer step's micro-batches: the weights must not change inside)."""
    mods = [m for m in model.modules() if isinstance(m, Fused)]
    try:
        for m in mods:
            m._cw = {name: _concat(ps, dtype) for name, ps in m._groups().items()}
            m._dtype = dtype
        yield
    finally:
        for m in mods:
            m._cw = None
