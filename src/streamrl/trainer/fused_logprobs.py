"""Log-probs and entropy of sampled tokens from LM-head logits, in row chunks, with a hand-written backward.

Why: the plain autograd path (`x.float()`, logsumexp or log_softmax, a second log_softmax for the entropy,
gather; backward: zeros + scatter, softmax, add, cast) makes ~15 passes over an fp32 copy of the whole
[N, V] logits (V = 49152 for SmolLM2: 0.4 GB at N = 2000). Here each chunk of rows is cast, reduced and
differentiated while it is still in cache, and the backward recomputes softmax from the saved logsumexp
instead of keeping fp32 [N, V] activations. SmolLM2 at N = 2000, one thread, fwd + bwd: 0.47 s against
1.19 s for one autograd log_softmax (benchmarks/logprob_kernel.py) and ~1.9 s with a second for the entropy.

Formulas, with x = logits / T (per row), lse = logsumexp(x), p = softmax(x), t = the sampled token:
    logprob  = max(x_t - lse, MIN_LOGPROB)
    entropy  = -sum_j p_j log p_j
    d logprob / d x_j = [j = t] - p_j  (0 where the floor holds)
    d entropy / d x_j = -p_j (log p_j + entropy)
and d / d logits = (d / d x) / T.

The temperature is applied as the engine samples (engine/sampling.py tempered_): each row shifted by its
largest logit, then divided by floored_temperature(T), so at any T > 0 (1e-39 included) the log-probs are
the engine's: 0 for a row's top token, -log k for a k-way tie at the top, and no inf or NaN in the values.
The gradients are finite too, but where top logits tie they grow as 1/T (inf near fp32's floor once
multiplied by a weight above ~7): training takes rollout.temperature 0 (greedy) or >= 1e-4
(config_bounds.py), while evaluation samples at any T > 0. A log-prob is floored at MIN_LOGPROB,
the least one the engine can record (log of fp32's smallest positive number): a token below it has
engine probability 0 and is never sampled, and a finite floor keeps the loss's log-ratios, KL terms and
masked sums finite where the token is padding, or where a stale sample's token is no longer the top one
at a tiny T (-inf there would give inf - inf = NaN, or -inf * 0 = NaN under a mask).
"""

from __future__ import annotations

import torch

from streamrl.engine.sampling import MIN_LOGPROB, floored_temperature, tempered_

CHUNK_ELEMENTS = 16 * 49152  # fp32 3 MB per chunk: its passes stay in L2/L3 (best of 8..1024 rows, V 49152)
# an accelerator: a chunk is a few kernel launches, so far fewer, larger chunks (fp32 50 MB at V 49152)
DEVICE_CHUNK_ELEMENTS = 256 * 49152


def _chunks(x: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """[B, C, V] -> (first flat row, rows [n, V]) pieces of ~CHUNK_ELEMENTS, covering the B * C rows in order.
    A contiguous input is one block; a strided view (logits[:, :-1]) is cut per batch row, never copied."""
    V = x.shape[-1]
    step = max(1, (CHUNK_ELEMENTS if x.device.type == "cpu" else DEVICE_CHUNK_ELEMENTS) // V)
    blocks = [x.reshape(-1, V)] if x.is_contiguous() else list(x)
    out, base = [], 0
    for block in blocks:
        out += [(base + s, block[s : s + step]) for s in range(0, block.shape[0], step)]
        base += block.shape[0]
    return out


def _rows(x: torch.Tensor, temperature: float) -> torch.Tensor:
    """A chunk of logits [n, V] -> fp32 (fp64 stays fp64) tempered as the engine samples (tempered_);
    always a fresh tensor."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    return tempered_(x.to(dtype, copy=True), temperature)


class _LogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        tokens: torch.Tensor,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        B, C, _ = logits.shape
        dtype = torch.promote_types(logits.dtype, torch.float32)
        lp = torch.empty(B * C, dtype=dtype, device=logits.device)
        ent = torch.zeros(B * C, dtype=dtype, device=logits.device)
        lse = torch.empty(B * C, dtype=dtype, device=logits.device)
        tok = tokens.reshape(-1, 1)
        with torch.autocast(device_type=logits.device.type, enabled=False):
            for s, rows in _chunks(logits):
                e = s + rows.shape[0]
                x = _rows(rows, temperature)
                m = torch.logsumexp(x, dim=-1)
                lse[s:e] = m
                lp[s:e] = (x.gather(-1, tok[s:e]).squeeze(-1) - m).clamp_(min=MIN_LOGPROB)
                if with_entropy:  # a -inf logit (a masked token) adds 0, not 0 * -inf
                    logp = x.sub_(m[:, None]).clamp_(min=torch.finfo(x.dtype).min)
                    ent[s:e] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(logits, tok, lse, ent)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return lp.view(B, C), ent.view(B, C)

    @staticmethod
    @torch.autograd.function.once_differentiable  # in-place ops below: no double backward
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, g_lp: torch.Tensor | None, g_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None]:
        logits, tok, lse, ent = ctx.saved_tensors  # type: ignore[attr-defined]
        temperature: float = ctx.temperature  # type: ignore[attr-defined]
        if g_lp is None and g_ent is None:
            return None, None, None, None
        g_lp = g_lp.reshape(-1, 1) if g_lp is not None else None
        g_ent = g_ent.reshape(-1, 1) if g_ent is not None else None
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # contiguous
        flat = grad.view(-1, logits.shape[-1])
        with torch.autocast(device_type=logits.device.type, enabled=False):
            for s, rows in _chunks(logits):
                e = s + rows.shape[0]
                logp = _rows(rows, temperature).sub_(lse[s:e, None])
                floored = logp.gather(-1, tok[s:e]) < MIN_LOGPROB  # the forward's floor held: no gradient
                p = logp.exp()
                if g_ent is not None:  # -p (log p + H) * g_ent
                    logp.clamp_(min=torch.finfo(logp.dtype).min)  # as in the forward: 0, not 0 * -inf
                    g = logp.add_(ent[s:e, None]).mul_(p).mul_(-g_ent[s:e])
                else:
                    g = torch.zeros_like(p)
                if g_lp is not None:  # (onehot - p) * g_lp; 0 where the forward's floor held
                    w = g_lp[s:e].masked_fill(floored, 0.0)
                    g.sub_(p.mul_(w)).scatter_add_(-1, tok[s:e], w.to(g.dtype))
                if temperature != 1.0:
                    g.div_(floored_temperature(temperature))
                flat[s:e] = g
        return grad, None, None, None


def token_logprobs_entropy(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [B, C, V] or [N, V] (any float dtype, may be a strided view), tokens [B, C] or [N] ->
    (log softmax(logits / T)[tokens], entropy of softmax(logits / T) or None), fp32 (fp64 for fp64 logits),
    shaped like tokens. The log-probs are differentiable w.r.t. logits, the entropy too with entropy_grad
    (an entropy bonus needs it; else it is detached); temperature <= 0 means 1 (greedy, whose log-probs
    the engine records at temperature 1). Log-probs are floored at MIN_LOGPROB (module docstring)."""
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match tokens {tuple(tokens.shape)}: need [..., V]"
        )
    flat = logits.dim() == 2
    x3 = logits.unsqueeze(0) if flat else logits
    t3 = tokens.unsqueeze(0) if flat else tokens
    lp, ent = _LogprobEntropy.apply(x3, t3.long(), temperature if temperature > 0 else 1.0, with_entropy)
    if flat:
        lp, ent = lp[0], ent[0]
    if not with_entropy:
        return lp, None
    return lp, ent if entropy_grad else ent.detach()
