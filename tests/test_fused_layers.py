"""Fused RMSNorm / SwiGLU / RoPE (models/fused_layers.py), compute weights (models/compute_weights.py) and
the CPU trainer's fused Llama path (models/fused_llama.py): fp64 gradchecks, bf16 against transformers'
own modules, a whole model's logits and gradients with and without the fused path, and the trainer's
use of it (weights cast once per optimizer step, the same step as transformers' modules)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from trajectories import make_traj
from transformers.models.llama import modeling_llama as llama

from streamrl.config import load_config
from streamrl.models import compute_weights as cw_module
from streamrl.models.compute_weights import compute_weights, installed, master_linear
from streamrl.models.fused_layers import rms_norm, rope, swiglu
from streamrl.models.fused_llama import install
from streamrl.models.precision import precision_dtype
from streamrl.trainer import trainer as trainer_module
from streamrl.trainer.trainer import Trainer
from streamrl.types import TrainBatch

F64 = torch.float64
BF16 = torch.bfloat16


def _qk(dtype: torch.dtype, B: int = 2, T: int = 5, H: int = 4, Hkv: int = 2, D: int = 6):
    """q [B, H, T, D], k [B, Hkv, T, D] as transposed views of one [B, T, heads, D] projection output, as
    the attention passes them."""
    base = torch.randn(B, T, H + Hkv, D, dtype=dtype)
    q = base[:, :, :H].transpose(1, 2).detach().requires_grad_(True)
    k = base[:, :, H:].transpose(1, 2).detach().requires_grad_(True)
    return q, k


# ---- fp64 gradchecks ------------------------------------------------------------------------------
def test_gradcheck_rms_norm() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, dtype=F64, requires_grad=True)
    w = torch.randn(8, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, 1e-6, F64), (x, w))


def test_gradcheck_swiglu() -> None:
    torch.manual_seed(1)
    gate_up = torch.randn(10, 2, 3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(swiglu, (gate_up,))


def test_gradcheck_rope_on_strided_views_with_distinct_cos_sin_halves() -> None:
    torch.manual_seed(2)
    q, k = _qk(F64)
    cos, sin = torch.randn(2, 5, 6, dtype=F64), torch.randn(2, 5, 6, dtype=F64)  # halves differ
    assert torch.autograd.gradcheck(lambda q, k: rope(q, k, cos, sin), (q, k))
    assert torch.autograd.gradcheck(lambda q: rope(q, k.detach(), cos, sin)[0], (q,))


def test_gradcheck_master_linear_input_and_master_gradients() -> None:
    torch.manual_seed(3)
    x = torch.randn(2, 3, 4, dtype=F64, requires_grad=True)
    masters = [torch.randn(n, 4, dtype=F64, requires_grad=True) for n in (5, 2, 3)]
    weight = torch.cat(masters).detach()
    assert torch.autograd.gradcheck(lambda x: master_linear(x, weight, *masters), (x,))
    # the weight gradient goes to each master, its own rows: the gradient of x @ cat(masters).T
    r = torch.randn(2, 3, 10, dtype=F64)
    (master_linear(x, weight, *masters) * r).sum().backward()
    got = [m.grad.clone() for m in masters]
    assert weight.grad is None
    for m in masters:
        m.grad = None
    (torch.nn.functional.linear(x, torch.cat(masters)) * r).sum().backward()
    for a, m in zip(got, masters):
        torch.testing.assert_close(a, m.grad, rtol=0, atol=1e-12)


def test_forward_values_equal_the_textbook_formulas_in_fp64() -> None:
    torch.manual_seed(4)
    x, w = torch.randn(3, 8, dtype=F64), torch.randn(8, dtype=F64)
    ref = w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(rms_norm(x, w, 1e-5, F64), ref, rtol=0, atol=1e-12)
    gu = torch.randn(10, 3, dtype=F64)
    a, b = gu[:5], gu[5:]
    torch.testing.assert_close(swiglu(gu), a / (1 + torch.exp(-a)) * b, rtol=0, atol=1e-12)
    q, k = _qk(F64)
    cos, sin = torch.randn(2, 5, 6, dtype=F64), torch.randn(2, 5, 6, dtype=F64)
    rq, rk = rope(q, k, cos, sin)
    hq, hk = llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert rq.is_contiguous() and rk.is_contiguous()
    torch.testing.assert_close(rq, hq, rtol=0, atol=1e-12)
    torch.testing.assert_close(rk, hk, rtol=0, atol=1e-12)


# ---- bf16 against transformers' modules under autocast ----------------------------------------------
ULP = 2.0**-8  # one bf16 unit in the last place, relative


def test_bf16_rms_norm_matches_transformers_under_autocast() -> None:
    """The residual stream is fp32; transformers' RMSNorm returns fp32 that the projections cast to
    bf16. The fused norm returns that bf16 directly (within one rounding), and its gradients for the
    same bf16 upstream gradient agree to fp32 precision."""
    torch.manual_seed(5)
    norm = llama.LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = (torch.randn(4, 7, 64) * 3).requires_grad_(True)
    g = torch.randn(4, 7, 64).to(BF16)
    with torch.autocast("cpu", dtype=BF16):
        ref = norm(x)
    assert ref.dtype == torch.float32
    ref.backward(g.float())
    ref_dx, ref_dw = x.grad.clone(), norm.weight.grad.clone()
    x.grad, norm.weight.grad = None, None
    with torch.autocast("cpu", dtype=BF16):
        out = rms_norm(x, norm.weight, 1e-5, BF16)
    assert out.dtype == BF16
    torch.testing.assert_close(out.float(), ref.detach().to(BF16).float(), rtol=ULP, atol=0)
    out.backward(g)
    torch.testing.assert_close(x.grad, ref_dx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.weight.grad, ref_dw, rtol=1e-5, atol=1e-5)


def test_bf16_swiglu_matches_transformers_mlp_activation() -> None:
    torch.manual_seed(6)
    gu = torch.randn(2 * 48, 4, 7).to(BF16).requires_grad_(True)  # gate rows, then up rows
    g = torch.randn(48, 4, 7).to(BF16)
    ref = torch.nn.functional.silu(gu[:48]) * gu[48:]  # LlamaMLP: act_fn(gate) * up
    ref.backward(g)
    ref_grad, gu.grad = gu.grad.clone(), None
    out = swiglu(gu)
    out.backward(g)
    assert out.dtype == BF16 and gu.grad.dtype == BF16
    torch.testing.assert_close(out.float(), ref.detach().float(), rtol=2 * ULP, atol=1e-6)
    torch.testing.assert_close(gu.grad.float(), ref_grad.float(), rtol=2 * ULP, atol=1e-6)


def _rope_grads_fp64(q, k, cos, sin, gq, gk):
    """The gradients of transformers' RoPE w.r.t. q and k, all in fp64."""
    q64, k64 = (x.detach().double().requires_grad_(True) for x in (q, k))
    out = llama.apply_rotary_pos_emb(q64, k64, cos.double(), sin.double())
    return torch.autograd.grad(out, (q64, k64), (gq.double(), gk.double()))


def test_bf16_rope_matches_transformers_with_fp32_cos_sin() -> None:
    """Under autocast transformers' RoPE turns bf16 queries into fp32 (its cos / sin are fp32) that the
    attention casts back; the fused RoPE rounds once to bf16, and its bf16 gradient is transformers'
    fp32 one rounded."""
    torch.manual_seed(7)
    q, k = _qk(BF16, B=2, T=9, H=6, Hkv=2, D=16)
    rotary = llama.LlamaRotaryEmbedding(llama.LlamaConfig(hidden_size=96, num_attention_heads=6))
    pos = torch.arange(9).expand(2, 9) + 30
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos)
    gq, gk = torch.randn(2, 6, 9, 16).to(BF16), torch.randn(2, 2, 9, 16).to(BF16)
    hq, hk = llama.apply_rotary_pos_emb(q, k, cos, sin)
    assert hq.dtype == torch.float32
    torch.autograd.backward((hq, hk), (gq.float(), gk.float()))
    ref_q, ref_k = q.grad.clone(), k.grad.clone()
    q.grad, k.grad = None, None
    rq, rk = rope(q, k, cos, sin)
    assert rq.dtype == BF16 and rk.dtype == BF16
    torch.testing.assert_close(rq.float(), hq.detach().to(BF16).float(), rtol=ULP, atol=1e-6)
    torch.testing.assert_close(rk.float(), hk.detach().to(BF16).float(), rtol=ULP, atol=1e-6)
    torch.autograd.backward((rq, rk), (gq, gk))
    # transformers rounds each of the two products' gradients to bf16 and sums them in bf16; the fused
    # backward rounds once: within one rounding of the fp64 gradient, transformers' within a few
    tq, tk = _rope_grads_fp64(q, k, cos, sin, gq, gk)
    for got, hf, truth in ((q.grad, ref_q, tq), (k.grad, ref_k, tk)):
        torch.testing.assert_close(got.double(), truth, rtol=ULP, atol=1e-6)
        assert (hf.double() - got.double()).abs().max() <= 4 * ULP * truth.abs().max()


# ---- a whole model -----------------------------------------------------------------------------------
def _model_pass(model, fused: torch.dtype | None, autocast: bool = False):
    """Logits and parameter gradients of one forward + backward on a left-padded batch; -> (logits,
    grads, the autograd node names)."""
    torch.manual_seed(8)
    ids = torch.randint(0, model.config.vocab_size, (3, 17))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    model.zero_grad(set_to_none=True)
    ctx = compute_weights(model, fused) if fused is not None else contextlib.nullcontext()
    amp = torch.autocast("cpu", dtype=BF16) if autocast else contextlib.nullcontext()
    with ctx, amp:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        (logits.float().sin() * mask[..., None]).sum().backward()
    seen, todo = set(), [logits.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            todo += [f for f, _ in fn.next_functions]
    nodes = {type(fn).__name__ for fn in seen}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logits.detach().float(), grads, nodes


FUSED_NODES = {"_RMSNormBackward", "_SwiGLUBackward", "_RopeBackward", "_MasterLinearBackward"}


def test_load_model_installs_the_fused_classes(tiny) -> None:
    model, _ = tiny
    layer = model.model.layers[0]
    assert installed(model)
    assert [type(m).__name__ for m in (layer.self_attn, layer.mlp, layer.input_layernorm, model.lm_head)] == [
        "FusedLlamaAttention",
        "FusedLlamaMLP",
        "FusedRMSNorm",
        "FusedHead",
    ]
    biased = llama.LlamaForCausalLM(
        llama.LlamaConfig(
            vocab_size=16,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            mlp_bias=True,
        )
    )
    assert install(biased) is False and not installed(biased)


def test_model_logits_and_gradients_equal_with_and_without_the_fused_path_fp32(tiny) -> None:
    model = copy.deepcopy(tiny[0]).float()
    ref_logits, ref_grads, ref_nodes = _model_pass(model, None)
    logits, grads, nodes = _model_pass(model, torch.float32)
    assert FUSED_NODES <= nodes and not FUSED_NODES & ref_nodes  # each path ran what it claims
    torch.testing.assert_close(logits, ref_logits, rtol=1e-6, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():  # fp32 summation order only: ~1e-7 of each tensor's largest entry
        scale = ref_grads[name].abs().max().item()
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6 * scale, msg=name)


def test_model_bf16_logits_equal_autocast_and_gradients_within_bf16_rounding(tiny) -> None:
    """bf16 compute weights against autocast on the fp32 model: the forward rounds the same values
    (the logits agree to one bf16 unit); the gradients differ by bf16 roundings of the backward
    (autocast sums the q / k / v input gradients in fp32, the fused GEMM accumulates them inside)."""
    model = copy.deepcopy(tiny[0]).float()
    ref_logits, ref_grads, _ = _model_pass(model, None, autocast=True)
    logits, grads, _ = _model_pass(model, BF16, autocast=True)
    torch.testing.assert_close(logits, ref_logits, rtol=ULP, atol=1e-3)
    for name, g in grads.items():
        assert g.dtype == torch.float32, name  # fp32 master gradients
        scale = ref_grads[name].abs().max()
        assert (g - ref_grads[name]).abs().max() <= 0.02 * scale, name


def test_compute_weights_are_released_and_follow_the_weights(tiny) -> None:
    """Outside the context the modules run transformers' forward on the live weights: a context's cast
    copies are never reused once the weights have changed."""
    model = copy.deepcopy(tiny[0]).float()
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    with compute_weights(model, torch.float32), torch.no_grad():
        model(input_ids=ids)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
        after = model(input_ids=ids).logits
    assert all(m._cw is None for m in model.modules() if isinstance(m, cw_module.Fused))
    plain = llama.LlamaForCausalLM(model.config)
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(after, plain(input_ids=ids).logits, rtol=0, atol=0)


# ---- the trainer -----------------------------------------------------------------------------------
def _trainer(model, *overrides: str) -> Trainer:
    cfg = load_config(None, ["model=tiny-random", "train.lr=1e-2", *overrides])
    return Trainer.from_config(model, cfg, pad_id=0)


def _batch() -> TrainBatch:
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]
    trajs = [
        make_traj(i, prompts[i % 3], [20 + i, 30 + i, 40 + i][: 1 + i % 3], logprobs=[-1.0] * (1 + i % 3))
        for i in range(6)
    ]
    return TrainBatch(trajs, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0])


def test_trainer_selects_the_fused_path_except_with_lora_or_data_parallel(tiny) -> None:
    model = tiny[0]
    assert _trainer(copy.deepcopy(model), "train.precision=bf16").compute_dtype == BF16
    assert _trainer(copy.deepcopy(model), "train.precision=fp32").compute_dtype == torch.float32
    assert _trainer(copy.deepcopy(model)).compute_dtype == precision_dtype("auto", "cpu")  # the default
    assert _trainer(copy.deepcopy(model), "train.lora_rank=2").compute_dtype is None
    assert _trainer(copy.deepcopy(model), "train.strategy=ddp").compute_dtype is None


def test_trainer_casts_once_per_optimizer_step_and_steps_like_transformers(tiny, monkeypatch) -> None:
    """Two optimizer steps (mini-batches) of several micro-batches each: one cast per optimizer step
    (not per micro-batch), fresh after each step; the weights after Trainer.step equal those of the
    same step through transformers' modules (fp32 and plain SGD, whose update is linear in the
    gradient: AdamW's first steps move every weight by about +-lr whatever the gradient's size, so a
    rounding-level gradient near zero could flip; a stale weight in the second step would show)."""
    keys = [
        "train.precision=fp32",
        "train.mini_batches=2",
        "train.token_budget=12",
        "train.shared_prompt=false",
    ]
    plain = _trainer(copy.deepcopy(tiny[0]), *keys)
    plain.compute_dtype = None
    fused = _trainer(copy.deepcopy(tiny[0]), *keys)
    for t in (plain, fused):
        t.optimizer = torch.optim.SGD(t.params, lr=20.0)  # moves the weights by ~1e-2
        t.scheduler = torch.optim.lr_scheduler.LambdaLR(t.optimizer, lambda s: 1.0)
    entries: list[int] = []
    real = trainer_module.compute_weights

    def counting(model, dtype):
        entries.append(1)
        return real(model, dtype)

    monkeypatch.setattr(trainer_module, "compute_weights", counting)
    batch = _batch()
    assert len(fused.prepare(batch)[0]) >= 4
    out_plain, out_fused = plain.step(batch), fused.step(batch)
    # one cast per optimizer step, and one for pi_old's pass before them (decoupled PPO recomputes it)
    assert fused._needs_trainer_old() and len(entries) == 3 and out_fused["optimizer_steps"] == 2
    assert out_fused["loss"] == pytest.approx(out_plain["loss"], rel=1e-5)
    start = dict(tiny[0].named_parameters())
    for (name, a), b in zip(fused.model.named_parameters(), plain.model.parameters()):
        moved = (b - start[name]).abs().max().item()
        assert moved > 0, name
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4 * moved, msg=name)


def test_fused_attention_honours_the_kv_cache_on_both_paths(tiny) -> None:
    """Prefill 6 tokens into a DynamicCache, then decode 3 one at a time: the logits equal one forward
    over all 9 tokens, with and without the fused path (the cache reaches the fused attention under
    whichever keyword the installed transformers passes it by)."""
    from transformers import DynamicCache

    from streamrl.models.cache_kwarg import cache_kwargs

    model = copy.deepcopy(tiny[0]).float()
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    for fused in (None, torch.float32):
        ctx = compute_weights(model, fused) if fused is not None else contextlib.nullcontext()
        with ctx, torch.no_grad():
            full = model(input_ids=ids).logits[:, 5:]
            cache = DynamicCache()
            steps = [model(input_ids=ids[:, :6], **cache_kwargs(model, cache)).logits[:, -1]]
            for t in range(6, 9):
                out = model(input_ids=ids[:, t : t + 1], **cache_kwargs(model, cache))
                steps.append(out.logits[:, -1])
        assert cache.get_seq_length() == 9, fused
        torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-5, atol=1e-5, msg=str(fused))


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_proximal_policy_is_computed_on_the_training_forwards_path(tiny, precision) -> None:
    """Several optimizer steps per batch need pi_old from a pass of its own: on the training forward's
    kernels (the fused bf16 layers, its attention at any length), with weights that do not move (lr 0)
    every ratio pi_theta / pi_old is exactly 1 (not the rounding of another kernel path)."""
    keys = [f"train.precision={precision}", "train.mini_batches=2", "train.token_budget=48"]
    tr = _trainer(copy.deepcopy(tiny[0]), *keys, "loss.rollout_correction=token_tis")
    assert tr._needs_trainer_old()
    tr.optimizer = torch.optim.SGD(tr.params, lr=0.0)
    tr.scheduler = torch.optim.lr_scheduler.LambdaLR(tr.optimizer, lambda s: 1.0)
    # 20 positions: past the length from which a no-grad forward would take another attention kernel
    trajs = [make_traj(i, list(range(5 + i, 17 + i)), list(range(40 + i, 48 + i))) for i in range(6)]
    out = tr.step(TrainBatch(trajs, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0]))
    assert out["optimizer_steps"] == 2
    assert out["ratio_max"] == out["ratio_min"] == 1.0 and out["approx_kl"] == 0.0


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_trainer_turns_the_policys_dropout_off(arch) -> None:
    """A checkpoint with dropout (GPT-2's modules keep 0.1; a Llama attention reads its
    attention_dropout at each forward): two training-mode passes over the same tokens give the same
    log-probs, so the ratios compare policies, not dropout masks."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32))
    else:
        shape = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "vocab_size": 64}
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, attention_dropout=0.5, **shape))
    model.train()
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)  # dropout on
    _trainer(model)
    model.train()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
