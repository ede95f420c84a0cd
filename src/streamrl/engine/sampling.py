"""Pure sampling math: next tokens and their log-probs under the (temperature, top-p) distribution."""

from __future__ import annotations

import math

import torch

# The least log-prob the engine can record: log of fp32's smallest positive (subnormal) number. A sampled
# token has a positive fp32 probability, so every recorded log-prob is at least this; a token below it
# has probability 0 and is never sampled.
MIN_LOGPROB = -149 * math.log(2.0)


def floored_temperature(temperature: float) -> float:
    """temperature > 0 -> the one logits are divided by: at least fp32's smallest normal number (a smaller
    one, or a subnormal, would round logits / T to inf or the division to 0). The engine and the trainer
    both take it from here."""
    return max(temperature, torch.finfo(torch.float32).tiny)


def tempered_(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """In place: logits [..., V] -> (logits - their row's largest) / floored_temperature(temperature),
    returned; at temperature 1 untouched. Shifted before the division, a tiny temperature gives 0 for
    the row's top token(s) and very negative or -inf for the rest (never inf or NaN, which logits / T
    would give once |logit| / T passes the dtype's largest number): the softmax tends to its one-hot
    (or tied) limit. temperature > 0; `logits` must be a tensor the caller owns."""
    if temperature == 1.0:
        return logits
    return logits.sub_(logits.amax(-1, keepdim=True)).div_(floored_temperature(temperature))


def sample_next(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [K, V] -> (tokens [B], logprobs [B]), B = K, or one independent draw per entry of
    `rows` [B] from logits[rows] (rows that share a sequence share its logits; the distribution is
    computed once per logits row).

    temperature == 0 is greedy, and its log-prob is taken at temperature 1. With top_p < 1 the
    log-prob is under the renormalised nucleus, i.e. the distribution actually sampled from.
    """
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return (tokens, logprobs) if rows is None else (tokens[rows], logprobs[rows])
    probs = sampling_probs(logits, temperature, top_p)
    if rows is not None:
        probs = probs[rows.to(probs.device)]
    tokens = sample_inverse_cdf(probs, generator)
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()


def sample_rows(
    logits: torch.Tensor,
    params: list[tuple[float, float]],
    generator: torch.Generator | None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_next with each row's own (temperature, top_p): logits [K, V], params [B], rows [B] (each
    row's logits row; None: B = K) -> (tokens [B], logprobs [B]). The rows of one set of parameters
    are drawn together, sets in order of first appearance: with a single set, exactly sample_next's
    draws."""
    if rows is None:
        rows = torch.arange(len(logits))
    groups: dict[tuple[float, float], list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(p, []).append(i)
    if len(groups) == 1:
        ((temperature, top_p),) = groups
        return sample_next(logits, temperature, top_p, generator, rows=rows)
    tokens = torch.empty(len(params), dtype=torch.long, device=logits.device)
    logprobs = torch.empty(len(params), dtype=torch.float32, device=logits.device)
    for (temperature, top_p), idx in groups.items():
        sel = torch.tensor(idx)
        needed, inverse = rows[sel].unique(return_inverse=True)  # each logits row's distribution once
        tok, lp = sample_next(logits[needed.to(logits.device)], temperature, top_p, generator, rows=inverse)
        tokens[sel.to(logits.device)], logprobs[sel.to(logits.device)] = tok, lp
    return tokens, logprobs


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """logits [..., V] -> the distribution sampled from [..., V] (fp32): softmax(logits / temperature)
    restricted to the top-p nucleus and renormalised. temperature > 0."""
    scaled = logits.float()
    if temperature != 1.0:  # tempered in place: on a copy, made once (.float() of bf16 already copied)
        scaled = tempered_(scaled.clone() if scaled is logits else scaled, temperature)
    if top_p < 1.0:
        logp = torch.log_softmax(scaled, dim=-1)
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        cum = sorted_logp.exp().cumsum(-1)
        drop_sorted = cum - sorted_logp.exp() >= top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = logp.masked_fill(drop, float("-inf"))
    # one fused softmax (dropped tokens exactly 0); the log of a sampled token's probability is exact to
    # fp32 rounding (a token below 1e-38, where it would underflow, is never sampled in practice)
    return torch.softmax(scaled, dim=-1)


def sample_inverse_cdf(
    weights: torch.Tensor, generator: torch.Generator | None, block: int = 256
) -> torch.Tensor:
    """weights: [B, V] >= 0, each row with a positive sum -> tokens [B], token i drawn with probability
    weights[i] / sum(weights).

    One uniform per row against the running sum, in two levels: the sums of blocks of `block` tokens
    pick a block, the running sum inside that block picks the token. torch.multinomial draws V
    exponentials per row instead (~55 ms of a 156 ms decode step at batch 64 over a 49k vocabulary on
    this CPU), and one cumsum over the whole vocabulary costs ~4 ms more than the block sums.
    A zero-weight token (or block) is never drawn: the first index whose running sum exceeds the target
    has a positive increment, and each target is kept strictly below its running total.
    """
    rows, vocab = weights.shape
    nblocks = -(-vocab // block)
    if nblocks * block != vocab:
        weights = torch.nn.functional.pad(weights, (0, nblocks * block - vocab))
    blocks = weights.view(rows, nblocks, block)
    block_cdf = blocks.sum(-1).cumsum(-1)  # [B, nblocks]
    u = torch.rand(rows, 1, generator=generator, dtype=weights.dtype).to(weights.device)
    target = _below(u * block_cdf[:, -1:], block_cdf[:, -1:])
    chosen = torch.searchsorted(block_cdf, target, right=True)  # [B, 1]
    before = torch.where(chosen > 0, block_cdf.gather(-1, (chosen - 1).clamp(min=0)), 0.0)
    inner_cdf = blocks[torch.arange(rows, device=weights.device), chosen.squeeze(-1)].cumsum(-1)
    # the block sum and the in-block running sum round differently: clamp into this block's total
    inner_target = _below((target - before).clamp(min=0.0), inner_cdf[:, -1:])
    inner = torch.searchsorted(inner_cdf, inner_target, right=True)
    return (chosen * block + inner).squeeze(-1)


def _below(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """x clamped strictly below total (total > 0): a right-searchsorted index stays in range."""
    return torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))
