"""The sandbox's settings: the minimum isolation level (a weaker level refused in one line, by a code
task when it is built too, rlimits accepted when allowed; its config key), the limits' checks and the
executor registry."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from streamrl.config import ConfigError, RewardConfig, load_config
from streamrl.rewards import sandbox, sandbox_probe
from streamrl.rewards.sandbox import (
    EXECUTORS,
    ExecResult,
    Limits,
    LocalSandbox,
    SandboxIsolationError,
    get_executor,
    register_executor,
)
from streamrl.tasks import task_from_config

NS_FAILED = "error: sandbox setup failed: mount_setattr(/, read-only): Operation not permitted"


@pytest.fixture
def no_namespace_level(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """A fresh probe in which every namespace level fails; returns the list of programs run."""
    monkeypatch.setattr(sandbox_probe, "_probes", {})
    monkeypatch.setattr(sandbox, "_probe_level", lambda iso, python: NS_FAILED)
    ran: list[tuple] = []
    monkeypatch.setattr(sandbox, "_run", lambda *args: ran.append(args))
    return ran


def _refusal(minimum: str, reached: str) -> str:
    return (
        f"the code sandbox requires namespace isolation (reward.sandbox_min_isolation={minimum}) but "
        f"{reached}; to run model code with rlimits only, set reward.sandbox_min_isolation=rlimits"
    )


def test_min_isolation_refuses_a_weaker_level(
    no_namespace_level: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox_probe, "namespaces_possible", lambda: True)
    failed = "; ".join(f"{c.name} failed: {NS_FAILED}" for c in sandbox_probe.candidates()[:-1])
    reached = f"the probe reached only 'rlimits' ({failed})"
    for minimum, said in (
        ("namespaces", "namespaces"),
        ("auto", "auto, and this machine can create namespaces"),
    ):
        with pytest.raises(SandboxIsolationError) as e:
            LocalSandbox(min_isolation=minimum)
        assert str(e.value) == _refusal(said, reached)
    with pytest.raises(SandboxIsolationError) as e:
        LocalSandbox()  # the default minimum is auto
    assert str(e.value) == _refusal("auto, and this machine can create namespaces", reached)
    with pytest.raises(SandboxIsolationError) as e:
        LocalSandbox(isolation="rlimits")  # a forced level is checked too
    assert str(e.value) == _refusal(
        "auto, and this machine can create namespaces", "LocalSandbox(isolation='rlimits') forces 'rlimits'"
    )
    assert no_namespace_level == []  # nothing ran


def test_code_task_refuses_when_built(no_namespace_level: list, tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "p", "tests": [{"input": "", "output": "1"}]}\n')
    for task in ("code", f"data:{rows}"):
        overrides = [f"task={task}", "reward.sandbox_min_isolation=namespaces"]
        if task.startswith("data:"):  # the code task reads its own rows; a data file maps its columns
            overrides.append("task_config.columns.tests=tests")
        cfg = load_config(None, overrides)
        with pytest.raises(SandboxIsolationError, match=r"^the code sandbox requires namespace isolation"):
            task_from_config(cfg)
        cfg.reward.sandbox_min_isolation = "rlimits"
        assert task_from_config(cfg).executor.isolation.name == "rlimits"  # type: ignore[attr-defined]
    assert no_namespace_level == []


def test_min_isolation_accepts_rlimits_when_allowed(
    no_namespace_level: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert LocalSandbox(min_isolation="rlimits").isolation.name == "rlimits"
    monkeypatch.setattr(sandbox_probe, "namespaces_possible", lambda: False)
    assert LocalSandbox().isolation.name == "rlimits"  # auto: no namespaces on this machine
    assert no_namespace_level == []


def test_min_isolation_config_key() -> None:
    assert RewardConfig().sandbox_min_isolation == "auto"
    hint = typing.get_type_hints(RewardConfig)["sandbox_min_isolation"]
    assert typing.get_args(hint) == sandbox_probe.MIN_ISOLATION
    with pytest.raises(ConfigError) as e:
        load_config(None, ["reward.sandbox_min_isolation=chroot"])
    assert str(e.value) == (
        "config key 'reward.sandbox_min_isolation' expects one of 'auto', 'namespaces', 'rlimits', "
        "got 'chroot'"
    )
    with pytest.raises(ValueError, match=r"^sandbox min_isolation must be one of auto, namespaces, rlimits"):
        LocalSandbox(min_isolation="strict")


def test_limits_and_registry_errors() -> None:
    with pytest.raises(ValueError, match=r"Limits.wall_s must be > 0, got 0"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="unknown sandbox executor 'nope'; choose from local"):
        get_executor("nope")
    with pytest.raises(ValueError, match="sandbox isolation 'chroot' is not available here"):
        LocalSandbox(isolation="chroot")
    assert isinstance(get_executor("local"), LocalSandbox)


def test_register_custom_executor() -> None:
    class Echo:
        name = "echo"

        def run(self, program: str, stdin: str = "", limits: Limits | None = None) -> ExecResult:
            return ExecResult(stdin, "", 0, "ok", 0.0, "none")

    register_executor("echo", Echo)
    try:
        assert get_executor("echo").run("print(1)", "hi").stdout == "hi"
    finally:
        del EXECUTORS["echo"]
