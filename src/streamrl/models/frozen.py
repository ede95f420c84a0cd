"""Models that only run forward: the engine's own copy, the rollout worker's model, the KL reference."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

# an fp32 LM head on one CPU thread runs a product of 7 to 15 rows as one of 16 (padded_rows)
PAD_ROWS = (7, 16)
# the other fp32 Linear layers of at least FEW_ROWS_WEIGHT values on a CPU run 8 to 15 rows as the weight
# times their transpose (few_rows_linear)
FEW_ROWS = (8, 15)
FEW_ROWS_WEIGHT = 1 << 18  # 1 MiB in fp32


@dataclasses.dataclass
class Tuning:
    """The engine's paths for products of few rows, on unless turned off (benchmarks/head_rows.py and
    benchmarks/body_rows.py turn each off to measure it)."""

    pad_head: bool = True  # padded_rows
    transpose_body: bool = True  # few_rows_linear


TUNING = Tuning()


def freeze(model: Any) -> Any:
    """eval mode, no gradients, and the engine's products (engine_products); -> model."""
    model.eval().requires_grad_(False)
    engine_products(model)
    return model


def engine_products(model: Any) -> None:
    """The model's matrix products as the engine runs them: the LM head's (engine_head) and every other
    Linear layer's (engine_body)."""
    engine_head(model)
    engine_body(model)


def engine_body(model: Any) -> None:
    """Every nn.Linear of the model but its LM head runs few_rows_linear (installing it again changes
    nothing)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module in model.modules():
        if type(module) is torch.nn.Linear and module is not head:
            module.forward = functools.partial(few_rows_linear, module)
            module._few_rows = True


def few_rows_linear(linear: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """linear(input), computed as weight @ rows^T when input has FEW_ROWS[0] to FEW_ROWS[1] rows, the
    weight has FEW_ROWS_WEIGHT values or more, both are fp32 on a CPU, and no gradient is taken.

    Below 16 rows, MKL's fp32 product rows @ weight^T streams the weight once per few rows, and
    weight @ rows^T is faster once there are 8 of them and the weight outgrows the core's cache: over
    SmolLM2's 30 layers on one thread, 0.45-0.97x the time for its [1536, 576], [576, 1536] and
    [576, 576] weights at 8-15 rows, while its [192, 576] ones (110,592 values) take longer
    (`benchmarks/body_rows.py`). From 16 rows MKL runs another kernel. A decode step runs every layer's
    products on its cache rows. Each output row is the same dot products as the usual one's, up to
    rounding."""
    weight, bias = linear.weight, linear.bias
    rows = input.numel() // input.shape[-1] if input.dim() and input.shape[-1] else 0
    lo, hi = FEW_ROWS
    if (
        torch.is_grad_enabled()
        or not TUNING.transpose_body
        or not lo <= rows <= hi
        or weight.numel() < FEW_ROWS_WEIGHT
        or input.device.type != "cpu"
        or (input.dtype, weight.dtype) != (torch.float32, torch.float32)
    ):
        return torch.nn.functional.linear(input, weight, bias)
    flat = input.reshape(rows, input.shape[-1]).t()
    out = torch.mm(weight, flat) if bias is None else torch.addmm(bias.unsqueeze(1), weight, flat)
    return out.t().contiguous().reshape(*input.shape[:-1], weight.shape[0])


def engine_head(model: Any) -> None:
    """The LM head as the engine runs it: a densely strided input (contiguous_head_input) and, on one
    CPU thread in fp32, a few rows padded to PAD_ROWS[1] (padded_rows)."""
    contiguous_head_input(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_streamrl_padded_rows", False) or not isinstance(head, torch.nn.Linear):
        return
    head.forward = functools.partial(padded_rows, head.forward)
    head._streamrl_padded_rows = True


def padded_rows(forward: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
    """forward(x) (x positional or nn.Linear's `input=`), x's rows padded with zeros to PAD_ROWS[1] when
    it has PAD_ROWS[0] to PAD_ROWS[1] - 1 of them, the head is fp32 on a CPU running one thread, and no
    gradient is taken.

    MKL's single-threaded fp32 product of fewer than 16 rows by a large transposed weight streams the
    weight once per 3 rows: SmolLM2's [49152, 576] head costs 38-72 ms for 7-15 rows against 25-37 ms
    padded to 16 (`benchmarks/head_rows.py`), and a decode step of 7-15 cache rows runs the head once.
    On two threads the unpadded product is the faster but for 13-15 rows, so the padding is for one
    thread only. Each row's logits are its own whatever the others hold: the output is the unpadded
    one's up to rounding."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or len(args) + len(kwargs) != 1:
        return forward(*args, **kwargs)
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    lo, hi = PAD_ROWS
    if (
        not TUNING.pad_head
        or not lo <= rows < hi
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or torch.is_grad_enabled()
        or torch.get_num_threads() != 1
    ):
        return forward(*args, **kwargs)
    flat = x.new_zeros(hi, x.shape[-1])
    flat[:rows] = x.reshape(rows, x.shape[-1])
    out = forward(flat)
    return out[:rows].reshape(*x.shape[:-1], out.shape[-1])


def contiguous_head_input(model: Any) -> None:
    """Hand the LM head a contiguous input (the hook is added once per model).

    transformers runs the head on the last positions only (`logits_to_keep`): a [R, K, H] view whose
    rows are T x H apart. For such a view and a bf16 weight that does not require grad, torch's linear
    does not fold it into one matrix product: it broadcasts the [V, H] weight to a contiguous [R, H, V]
    copy for a batched product (R x 56 MB for SmolLM2: 7 GB for a 128-row prefill). A one-row view
    [1, 1, H] counts as contiguous (the strides of size-1 dimensions are ignored) and takes the same
    path, so the hook looks at the strides themselves (`dense`). A copy of the input costs R x K x H
    values."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_streamrl_contiguous_input", False):
        return
    head.register_forward_pre_hook(_contiguous_input, with_kwargs=True)
    head._streamrl_contiguous_input = True


def _contiguous_input(
    _module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The forward pre-hook: the input tensor, positional or `input=`, with dense strides (`dense`)."""
    if args and isinstance(args[0], torch.Tensor):
        return (dense(args[0]), *args[1:]), kwargs
    if isinstance(kwargs.get("input"), torch.Tensor):
        return args, {**kwargs, "input": dense(kwargs["input"])}
    return args, kwargs


def dense(x: torch.Tensor) -> torch.Tensor:
    """x itself if its strides are those of a new tensor of its shape, else such a copy of it."""
    strides, step = [], 1
    for n in reversed(x.shape):
        strides.append(step)
        step *= n
    if x.stride() == tuple(reversed(strides)):
        return x
    return x.clone(memory_format=torch.contiguous_format)
