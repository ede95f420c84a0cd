"""Token selections that span a mini-batch: loss.entropy_top_q's entropy threshold and M2PO's cut.

Both are defined over the batch an optimizer step trains on: "Beyond the 80/20 rule" (Wang et al. 2025)
keeps the tokens above the batch's (1 - q) entropy quantile, M2PO (Zheng et al. 2025) bounds the mean
(log r)^2 over the batch's tokens. A micro-batch sees only its own rows (train.token_budget sorts them
by length, data-parallel ranks split them), so taken per micro-batch both would depend on the token
budget and the world size. When one mini-batch spans several micro-batches, one no-grad forward of its
micro-batches under the weights its optimizer step starts from gives every loss token's entropy and
log-ratio; the threshold and the cut taken over all of them (gathered across ranks) decide the tokens
of every micro-batch. One micro-batch per mini-batch needs no extra pass: its own forward holds them
all. The pass costs one forward of the mini-batch (about a third of its training), only with these
options and several micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from streamrl.algo.losses_m2po import m2_cut, m2_keep
from streamrl.algo.token_weights import quantile
from streamrl.models.attention import training_kernels
from streamrl.trainer.batching import MicroBatch
from streamrl.trainer.logprobs import completion_forward
from streamrl.trainer.objective import ratio_base


@dataclass(frozen=True)
class MiniBatchCuts:
    """Per micro-batch index, the loss tokens each rule keeps ([B, C] float masks) as the pass over the
    whole mini-batch decided them: entropy (entropy_top_q), m2 (M2PO). Empty: each micro-batch decides
    over its own tokens. The masks come from the pass's values themselves, not from a threshold
    compared with the training forward's, whose last bits may differ (grad mode, another batch shape)."""

    entropy: dict[int, torch.Tensor] = field(default_factory=dict)
    m2: dict[int, torch.Tensor] = field(default_factory=dict)


OWN = MiniBatchCuts()  # one micro-batch is the whole mini-batch


def mini_batch_cuts(
    tr: Any,
    mbs: list[MicroBatch],
    mine: list[tuple[int, float]],
    n_micro: int,
    prox: list[torch.Tensor | None],
) -> MiniBatchCuts:
    """The selections of one mini-batch of `n_micro` micro-batches, of which this process runs `mine`
    ((index, loss weight); weight 0: a pass that only joins the collectives, whose values do not count).
    Reads the Trainer `tr`: its loss config, forward model, temperature and autocast; gathers the
    values of every rank through `tr._gather_values`."""
    lc = tr.loss
    top_q, m2 = lc.entropy_top_q < 1.0, tr.loss_spec.name == "m2po"
    if n_micro <= 1 or not (top_q or m2):
        return OWN
    entropies: dict[int, torch.Tensor] = {}
    squares: dict[int, torch.Tensor] = {}
    masks: dict[int, torch.Tensor] = {}
    dev = next(tr.model.parameters()).device
    with torch.no_grad(), tr._autocast(), training_kernels():  # as the training forward computes them
        for i, weight in mine:
            mb = mbs[i]
            logprobs, entropy, _ = completion_forward(
                tr.forward_model, mb, tr.temperature, return_entropy=True, entropy_grad=lc.entropy_coef != 0
            )
            if weight == 0:
                continue
            masks[i] = mb.loss_mask.to(dev)
            if top_q:
                assert entropy is not None
                entropies[i] = entropy.float()
            if m2:
                trainer_old = prox[i].to(dev) if prox[i] is not None else logprobs
                old = ratio_base(tr.correction, mb.old_logprobs.to(dev), trainer_old)
                squares[i] = (logprobs - old).float() ** 2
    out = MiniBatchCuts()
    if top_q:
        values = tr._gather_values(_valid(entropies, masks))
        if len(values):
            threshold = quantile(values, 1.0 - lc.entropy_top_q)
            out.entropy.update({i: ((masks[i] > 0) & (e >= threshold)).float() for i, e in entropies.items()})
    if m2:
        cut = m2_cut(tr._gather_values(_valid(squares, masks)), lc.m2_threshold)
        out.m2.update({i: m2_keep(sq, masks[i], cut) for i, sq in squares.items()})
    return out


def _valid(values: dict[int, torch.Tensor], masks: dict[int, torch.Tensor]) -> torch.Tensor:
    """The loss tokens' values of this process's micro-batches, flat, on the CPU."""
    parts = [v[masks[i] > 0].cpu() for i, v in values.items()]
    return torch.cat(parts) if parts else torch.zeros(0)
