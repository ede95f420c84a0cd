"""The config's `device`, checked before any work: a torch device this machine has."""

from __future__ import annotations

from typing import Any

KINDS = "cpu, cuda, cuda:N, mps or xpu"


def _available(torch: Any, kind: str) -> bool:
    if kind == "cpu":
        return True
    if kind == "cuda":
        return torch.cuda.is_available()
    if kind == "mps":
        return torch.backends.mps.is_available()
    if kind == "xpu":
        return hasattr(torch, "xpu") and torch.xpu.is_available()
    return False


def check_device(device: str) -> None:
    """One line (ValueError) naming the key and the fix when `device` is not a torch device, or one this
    machine does not have (device=cuda on a CPU-only machine or with a CPU build of torch)."""
    if device == "cpu":  # the default: no torch import needed to know it
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"config key 'device': '{device}' is not a torch device: use {KINDS}") from None
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ValueError(f"config key 'device': streamrl does not run on '{device}': use {KINDS}")
    if not _available(torch, dev.type):
        build = " (this torch is a CPU build)" if dev.type == "cuda" and torch.version.cuda is None else ""
        raise ValueError(f"config key 'device': this machine has no {dev.type} device{build}: use device=cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(
            f"config key 'device': {device}, but this machine has {torch.cuda.device_count()} CUDA "
            f"device(s): use cuda:0 .. cuda:{torch.cuda.device_count() - 1}"
        )
