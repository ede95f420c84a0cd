"""Compute precision: which dtype the engine decodes in and the trainer computes in, and casting a
model's weights to it without touching its buffers.

`rollout.precision` and `train.precision` take `bf16`, `fp32` or `auto` (the default). `auto` is bf16
where the device multiplies bf16 matrices natively and fp32 elsewhere: on a CPU without a bf16 path
(an AVX2-only x86, e.g. AMD Zen 2/3 or most laptop Intel cores) torch falls back to a reference bf16
GEMM tens of times slower than its fp32 one, so bf16 there would make the run slower, not faster. The
choice is made in each process that computes (`resolve_precision`), so a run resumed on another
machine, or a Ray actor on a GPU node, picks for its own hardware; config.yaml keeps `auto`.
"""

from __future__ import annotations

from typing import Any

import torch

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


# CPU features whose bf16 instructions make a bf16 matmul faster than fp32 (x86: AVX512_BF16, AMX; Arm:
# the BF16 extension), as /proc/cpuinfo names them
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags (x86 `flags`, Arm `Features`), or None where there is no such file."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        return None
    return frozenset()


def _cpu_bf16_matmul() -> bool:
    """A CPU whose bf16 matmul is fast: bf16 instructions in its flags (BF16_CPU_FLAGS). oneDNN also
    reports bf16 support on plain AVX-512, where bf16 runs several times slower than fp32
    (docs/benchmarks.md#precision), so that report is used only where the flags cannot be read."""
    flags = cpu_flags()
    if flags is not None:
        return bool(flags & BF16_CPU_FLAGS)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def native_bf16(device: str | torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices natively: a CUDA GPU that supports bf16 (Ampere and
    later), a CPU with a bf16 matmul path; anything else (MPS, an older GPU) is taken as not."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return kind == "cpu" and _cpu_bf16_matmul()


def resolve_precision(name: str, device: str | torch.device) -> str:
    """A config's precision ('auto', 'bf16' or 'fp32') -> 'bf16' or 'fp32' on this device."""
    if name == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if name not in PRECISIONS:
        raise ValueError(f"precision '{name}': use one of auto, {', '.join(PRECISIONS)}")
    return name


def precision_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """The torch dtype of resolve_precision(name, device)."""
    return PRECISIONS[resolve_precision(name, device)]


def dtype_name(dtype: torch.dtype) -> str:
    """'float32', 'bfloat16': a dtype as printed beside a measured figure."""
    return str(dtype).removeprefix("torch.")


def precision_warning(name: str, key: str, device: str | torch.device) -> str | None:
    """One line when bf16 was asked for explicitly on a device that only emulates it, else None."""
    if name != "bf16" or native_bf16(device):
        return None
    return (
        f"{key}=bf16 on a device without bf16 matrix units ({torch.device(device).type}): torch emulates "
        f"bf16 there, many times slower than fp32; {key}=auto picks fp32 on this machine"
    )


def precision_line(
    rollout: str, train: str, device: str | torch.device, vllm_dtype: str | None = None
) -> str:
    """The start-up line: the precision each side computes in, and why where `auto` chose it. vllm_dtype
    (engine=vllm): the rollouts decode in it, and rollout.precision sets only the trainer process's own
    engine, which evaluates the held-out set."""
    engine, trainer = resolve_precision(rollout, device), resolve_precision(train, device)
    why = ""
    if "auto" in (rollout, train):
        has = "has" if native_bf16(device) else "has no"
        why = f" (auto: this {torch.device(device).type} {has} bf16 matrix units)"
    autocast = " autocast on fp32 weights" if trainer == "bf16" else ""
    if vllm_dtype is not None:
        engine = f"vLLM {vllm_dtype} (vllm.dtype), held-out evaluation {engine}"
    return f"precision: engine {engine}, trainer {trainer}{autocast}{why}"


def run_precision_line(cfg: Any) -> str:
    """precision_line of a run's config (engine=vllm: its rollouts decode in vllm.dtype)."""
    vllm_dtype = cfg.vllm.dtype if cfg.engine == "vllm" else None
    return precision_line(cfg.rollout.precision, cfg.train.precision, cfg.device, vllm_dtype)


def precision_record(cfg: Any) -> dict[str, str]:
    """environment.json's precisions of a run: the rollout engine's (engine=vllm: vllm.dtype, as vLLM
    names it, and the held-out evaluation's engine apart), the trainer's."""
    own = resolve_precision(cfg.rollout.precision, cfg.device)
    record = {"rollout_precision": own, "train_precision": resolve_precision(cfg.train.precision, cfg.device)}
    if cfg.engine == "vllm":
        record.update(rollout_precision=f"{cfg.vllm.dtype} (vllm.dtype)", eval_precision=own)
    return record


def cast_params(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast the parameters of `module` to `dtype` in place; buffers keep their dtype.

    `module.to(torch.bfloat16)` would also round RoPE's `inv_freq` buffer to bf16 (8 bits of mantissa):
    with SmolLM2's rotary base the angle moves by up to 0.14 rad at position 100 and 1.4 rad at position
    1000, a long-context disagreement with the trainer's fp32 RoPE (on the ~100-token default job the
    engine/trainer log-prob gap was the same either way). transformers and vLLM keep it fp32 in bf16 too.
    Tied parameters stay tied (each Parameter is cast once)."""
    for p in module.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return module
