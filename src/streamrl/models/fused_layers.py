"""RMSNorm, SwiGLU and rotary embeddings as autograd Functions with hand-written backwards (CPU training).

Why: under autocast the Llama decoder keeps an fp32 residual stream, so transformers' RMSNorm returns
fp32 that every projection casts to bf16 again (q, k, v, gate, up: five casts per layer), RoPE multiplies
bf16 queries by fp32 cos / sin into fp32 tensors that the attention casts back, and each composite
saves several full-size intermediates for autograd's elementwise backwards. Here RMSNorm and RoPE
write their output directly in the compute dtype; RMSNorm saves its input and one scalar per row,
RoPE only its cos / sin tables, and the rest is recomputed in the backward. SwiGLU works on the two
contiguous halves of the fused gate / up projection's output and keeps silu(gate), as autograd does
(recomputing it cost more than it saved). Eager PyTorch on CPU has no fused kernels for these, so
the gain is in passes, casts and layouts, not in a single loop per element.

Formulas (per row, H features; g = the gradient of the output):
    RMSNorm   r = (mean(x^2) + eps)^-1/2,  y = w * x * r
              dw = sum_rows g * x * r,  dx = r * g * w - x * r^3 * sum(g * w * x) / H
    SwiGLU    y = silu(a) * b               (a, b: the halves of the fused gate/up projection's output)
              db = g * silu(a),  da = silu'(a) * g * b
    RoPE      y1 = x1 c1 - x2 s1,  y2 = x2 c2 + x1 s2   (x1, x2: the halves of each head; c, s: cos, sin)
              dx1 = g1 c1 + g2 s2,  dx2 = g2 c2 - g1 s1
RMSNorm and RoPE compute in fp32 (fp64 stays fp64) and round once to the output dtype; SwiGLU runs in
its input dtype with the same roundings as transformers' silu * up (tests/test_fused_layers.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The dtype the arithmetic runs in: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
    ) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            rows = x.reshape(-1, x.shape[-1])
            xf = rows.to(_acc(x.dtype))
            r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True).add_(eps))  # [N, 1]
            y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
            torch.mul(torch.mul(xf, r), weight, out=y.view(-1, x.shape[-1]))  # rounded once
        ctx.save_for_backward(x, weight, r)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, g: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        x, weight, r = ctx.saved_tensors  # type: ignore[attr-defined]
        H = x.shape[-1]
        acc = _acc(x.dtype)
        with torch.autocast(device_type=x.device.type, enabled=False):
            xf = x.reshape(-1, H).to(acc)
            g2 = g.reshape(-1, H)
            w = weight.to(acc)
            gx = torch.mul(g2, xf)  # g * x in fp32 (g may be bf16)
            dw = torch.mv(gx.t(), r.view(-1)) if ctx.needs_input_grad[1] else None  # sum_rows g x r
            dx = None
            if ctx.needs_input_grad[0]:
                c = torch.mv(gx, w).view(-1, 1).mul_(r.pow(3)).div_(H)  # r^3 sum(g w x) / H
                dx = torch.mul(g2, w).mul_(r).addcmul_(xf, c, value=-1.0)
                dx = dx.view(x.shape).to(x.dtype)
        return dx, None if dw is None else dw.to(weight.dtype), None, None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, gate_up: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        a, b = gate_up.chunk(2)
        with torch.autocast(device_type=gate_up.device.type, enabled=False):
            s = torch.nn.functional.silu(a)
            y = torch.mul(s, b)
        # silu(a) is kept rather than recomputed: one pass less in the backward for one [I, ...] tensor
        ctx.save_for_backward(gate_up, s)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: FunctionCtx, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        gate_up, s = ctx.saved_tensors  # type: ignore[attr-defined]
        a, b = gate_up.chunk(2)
        grad = torch.empty_like(gate_up, memory_format=torch.contiguous_format)
        da, db = grad.chunk(2)
        with torch.autocast(device_type=gate_up.device.type, enabled=False):
            torch.mul(g, s, out=db)  # db = g * silu(a)
            torch.ops.aten.silu_backward(torch.mul(g, b), a, grad_input=da)  # da = silu'(a) * g * b
        return grad


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [x2, x1] along the last dim, contiguous."""
    h = x.shape[-1] // 2
    return torch.cat((x[..., h:], x[..., :h]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, table: torch.Tensor, out: torch.Tensor) -> None:
    """out = x * cos + swap_halves(x) * table, computed in the tables' dtype, rounded once into `out`
    (which may be x: both products are taken before it is written).

    RoPE is this with table = [-s1, s2] (rotate_half(x) * sin = swap_halves(x) * [-s1, s2]); its
    backward, with swap_halves its own transpose, is g * cos + swap_halves(g * [-s1, s2]) = g * cos +
    swap_halves(g) * [s2, -s1]. Whole-row operations: per-half slices would run 32-element loops."""
    torch.addcmul(torch.mul(x, cos), _swap_halves(x), table, out=out)


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = cos.shape[-1] // 2
        with torch.autocast(device_type=q.device.type, enabled=False):
            c = cos.unsqueeze(1).to(_acc(q.dtype))  # [B, 1, T, D]
            s = sin.unsqueeze(1).to(_acc(q.dtype))
            table = torch.cat((-s[..., :h], s[..., h:]), dim=-1)
            outs = []
            for x in (q, k):
                # one strided read (x is a transposed view of the projection's output); then contiguous
                # [B, heads, T, D] passes, the result written over the copy
                xc = x.clone(memory_format=torch.contiguous_format)
                _rotate(xc, c, table, xc)
                outs.append(xc)
        ctx.save_for_backward(c, table)
        ctx.layouts = tuple((x.shape, x.dtype) for x in (q, k))  # type: ignore[attr-defined]
        return outs[0], outs[1]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(  # type: ignore[override]
        ctx: FunctionCtx, gq: torch.Tensor | None, gk: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        c, table = ctx.saved_tensors  # type: ignore[attr-defined]
        table = _swap_halves(table)  # [s2, -s1]: swap_halves is its own transpose
        grads: list[torch.Tensor | None] = []
        with torch.autocast(device_type=c.device.type, enabled=False):
            for g, (shape, dtype) in zip((gq, gk), ctx.layouts):  # type: ignore[attr-defined]
                if g is None:
                    grads.append(None)
                    continue
                # [B, T, heads, D] memory, the projection's layout: its backward views it without a copy
                B, n, T, D = shape
                out = torch.empty(B, T, n, D, dtype=dtype, device=g.device).transpose(1, 2)
                _rotate(g, c, table, out)
                grads.append(out)
        return grads[0], grads[1], None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last dim, in `out_dtype` (x, weight: any float dtypes)."""
    return _RMSNorm.apply(x, weight, eps, out_dtype)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """[2I, ...] (gate rows, then up rows) -> silu(gate) * up [I, ...], in the input's dtype. The halves
    are split along the first dim, so that each is one contiguous block (a half of every row of an
    [N, 2I] tensor would be read with gaps: ~2x slower elementwise passes)."""
    return _SwiGLU.apply(gate_up)


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' apply_rotary_pos_emb: q [B, H, T, D], k [B, Hkv, T, D] (any strides), cos / sin
    [B, T, D] -> rotated (q, k), contiguous, each in its input's dtype (the arithmetic in fp32)."""
    return _Rope.apply(q, k, cos, sin)
