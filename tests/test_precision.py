"""Precision: `auto` resolved per device, the warning and start-up line, and cast_params (bf16 weights for
the engines with RoPE's inv_freq kept in fp32)."""

import copy

import pytest
import torch

from streamrl.engine.hf import HFEngine
from streamrl.models import precision
from streamrl.models.precision import (
    cast_params,
    precision_dtype,
    precision_line,
    precision_warning,
    resolve_precision,
)


def test_cast_params_casts_weights_only_and_keeps_ties(tiny):
    model = cast_params(copy.deepcopy(tiny[0]), torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    buffers = dict(model.named_buffers())
    assert buffers["model.rotary_emb.inv_freq"].dtype == torch.float32
    torch.testing.assert_close(buffers["model.rotary_emb.inv_freq"], tiny[0].model.rotary_emb.inv_freq)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def test_bf16_engine_keeps_fp32_rope(tiny):
    eng = HFEngine(tiny[0], tiny[1], dtype=torch.bfloat16)
    assert eng.model.model.rotary_emb.inv_freq.dtype == torch.float32


# ---- precision=auto: bf16 only where the device multiplies bf16 natively ---------------------------


@pytest.fixture(params=[True, False], ids=["bf16-units", "no-bf16-units"])
def units(request, monkeypatch):
    """This CPU with (True) or without (False) a native bf16 matmul path."""
    monkeypatch.setattr(precision, "_cpu_bf16_matmul", lambda: request.param)
    return request.param


def test_auto_is_bf16_exactly_where_the_cpu_has_bf16_units(units):
    assert resolve_precision("auto", "cpu") == ("bf16" if units else "fp32")
    assert precision_dtype("auto", "cpu") == (torch.bfloat16 if units else torch.float32)
    assert resolve_precision("bf16", "cpu") == "bf16" and resolve_precision("fp32", "cpu") == "fp32"
    assert precision_dtype("fp32", torch.device("cpu")) == torch.float32


AVX512_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize(
    ("cpuinfo", "fast"), [(AVX512_ONLY, False), (SAPPHIRE_RAPIDS, True), (GRAVITON3, True), ("", False)]
)
def test_bf16_is_fast_only_with_bf16_instructions_not_on_plain_avx512(tmp_path, monkeypatch, cpuinfo, fast):
    """oneDNN reports bf16 support on plain AVX-512, where a bf16 matmul is about 3x slower than fp32."""
    f = tmp_path / "cpuinfo"
    f.write_text(cpuinfo)
    real = precision.cpu_flags
    monkeypatch.setattr(precision, "cpu_flags", lambda: real(str(f)))
    assert precision._cpu_bf16_matmul() is fast
    assert resolve_precision("auto", "cpu") == ("bf16" if fast else "fp32")
    assert real(str(tmp_path / "none")) is None  # not Linux: torch's oneDNN report decides


def test_auto_on_a_gpu_asks_the_gpu_and_elsewhere_is_fp32(monkeypatch):
    monkeypatch.setattr(precision, "_cpu_bf16_matmul", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for supported, want in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        assert resolve_precision("auto", "cuda:1") == want
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_precision("auto", "cuda") == "fp32"
    assert resolve_precision("auto", "mps") == "fp32"


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(ValueError, match="precision 'fp16': use one of auto, fp32, bf16"):
        resolve_precision("fp16", "cpu")


def test_explicit_bf16_without_units_warns_in_one_line_naming_the_key(units):
    warning = precision_warning("bf16", "train.precision", "cpu")
    if units:
        assert warning is None
    else:
        assert warning == (
            "train.precision=bf16 on a device without bf16 matrix units (cpu): torch emulates bf16 there, "
            "many times slower than fp32; train.precision=auto picks fp32 on this machine"
        )
    assert precision_warning("auto", "train.precision", "cpu") is None
    assert precision_warning("fp32", "train.precision", "cpu") is None


def test_the_startup_line_says_what_each_side_computes_in_and_why(units):
    line = precision_line("auto", "auto", "cpu")
    if units:
        assert line == (
            "precision: engine bf16, trainer bf16 autocast on fp32 weights "
            "(auto: this cpu has bf16 matrix units)"
        )
    else:
        assert line == "precision: engine fp32, trainer fp32 (auto: this cpu has no bf16 matrix units)"
    assert (
        precision_line("fp32", "bf16", "cpu")
        == "precision: engine fp32, trainer bf16 autocast on fp32 weights"
    )


def test_the_trainer_computes_in_what_auto_resolves_to(tiny, units):
    from streamrl.config import load_config
    from streamrl.trainer.trainer import Trainer

    trainer = Trainer.from_config(
        copy.deepcopy(tiny[0]), load_config(None, ["train.precision=auto"]), pad_id=0
    )
    assert trainer.bf16 is units
    assert trainer.compute_dtype == (torch.bfloat16 if units else torch.float32)
    with trainer._autocast():
        assert torch.is_autocast_enabled("cpu") is units
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # master weights stay fp32


def test_the_engine_of_the_job_decodes_in_what_auto_resolves_to(units):
    from streamrl.config import load_config
    from streamrl.loop.job import build_components

    cfg = load_config(None, ["model=tiny-random", "eval.size=4", "rollout.precision=auto"])
    parts = build_components(cfg)
    assert {p.dtype for p in parts.engine.model.parameters()} == {torch.bfloat16 if units else torch.float32}


def test_with_vllm_the_startup_line_and_record_give_vllm_dtype(units):
    """engine=vllm: the rollouts decode in vllm.dtype; rollout.precision (auto) sets only the trainer
    process's engine, which evaluates the held-out set."""
    from streamrl.config import Config
    from streamrl.models.precision import precision_record, run_precision_line

    cfg = Config()  # engine=vllm needs vLLM installed to validate; these read only the keys
    cfg.engine, cfg.vllm.dtype = "vllm", "bfloat16"
    own = "bf16" if units else "fp32"
    autocast = " autocast on fp32 weights" if units else ""
    why = "has" if units else "has no"
    assert run_precision_line(cfg) == (
        f"precision: engine vLLM bfloat16 (vllm.dtype), held-out evaluation {own}, trainer {own}{autocast} "
        f"(auto: this cpu {why} bf16 matrix units)"
    )
    assert precision_record(cfg) == {
        "rollout_precision": "bfloat16 (vllm.dtype)",
        "train_precision": own,
        "eval_precision": own,
    }
    cfg.engine = "hf"
    assert precision_record(cfg) == {"rollout_precision": own, "train_precision": own}
    assert run_precision_line(cfg) == precision_line("auto", "auto", "cpu")
