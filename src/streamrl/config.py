"""Run configuration: dataclasses, a YAML file and `key=value` overrides, validated before any work.

Every key is a dataclass field: Config's top-level keys here, its sections' in config_sections.py
(re-exported here), addressed with dots (`train.lr=1e-5`). A field's comment is its documentation:
`streamrl config [SECTION]` prints it (config_docs.py). An unknown key, a value of the wrong type or
outside its range (config_bounds.py) raises ConfigError with one line that names the key and what is
accepted.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from streamrl.config_parse import ConfigError, apply_key, parse_override, read_yaml
from streamrl.config_resume import RESUME_FIXED, refuse_a_fixed_change
from streamrl.config_rewards import JUDGE_FIT_KEYS, RESPONSE_KEYS, judge_kept_warning
from streamrl.config_sections import (
    AdvantageConfig,
    CheckpointConfig,
    EnvConfig,
    EvalConfig,
    LossConfig,
    ObserveConfig,
    RayConfig,
    RewardConfig,
    RolloutConfig,
    RuntimeConfig,
    TaskConfig,
    TrainConfig,
    VLLMConfig,
)
from streamrl.config_validate import LORA_ONLY, is_data_source, resolve_eval_length, validate
from streamrl.run_dirs import RUN_MARKERS, has_saved_state, holds_run, no_run_to_resume_message, started_only

__all__ = [
    "AdvantageConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "LossConfig",
    "ObserveConfig",
    "RESUME_FIXED",
    "RayConfig",
    "RewardConfig",
    "RolloutConfig",
    "RuntimeConfig",
    "TaskConfig",
    "TrainConfig",
    "VLLMConfig",
    "config_yaml",
    "from_dict",
    "load_config",
    "parse_override",
    "refuse_changes_a_resume_would_ignore",
    "to_dict",
]


@dataclass
class Config:
    model: str = "smollm2-135m-instruct"  # smollm2-135m-instruct, tiny-random or an HF model directory
    task: str = "rg:chain_sum"  # rg:NAME, data:PATH, mix, code[:PATH], env:NAME or agent:MODULE:FUNCTION
    algo: str = ""  # an algorithm preset (configs/NAME.yaml: grpo, dapo, ...) layered under these settings
    max_steps: int = 20  # training steps (0: evaluate only)
    max_time: float = 0.0  # stop training after this many seconds (0: no limit); for equal budgets
    max_staleness: int = 1  # eta: tokens at most this many policy versions old; 0 = synchronous
    run_dir: str = ""  # where the run writes everything (empty: runs/<timestamp>)
    resume: str = ""  # a run directory to continue from
    overwrite: bool = False  # run_dir already holds a run: delete it and start over
    seed: int = 0  # seeds the task split, sampling and initialisation
    device: str = "cpu"  # the torch device of the trainer and engine: cpu, cuda, cuda:1
    engine: Literal["hf", "vllm"] = "hf"  # rollout engine: hf = streamrl's own (HFEngine); vllm = vLLM
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    task_config: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


def from_dict(data: dict[str, Any]) -> Config:
    """A Config from a plain dict (e.g. a run directory's config.yaml), validated."""
    cfg = Config()
    for k, v in data.items():
        apply_key(cfg, str(k), v)
    validate(cfg, keep_saved_judge=bool(cfg.resume))  # a resumed run's, as load_config accepted it
    return cfg


def _not_a_config_file(path: Path) -> str:
    """Why `path`, given as the config file, is none: a model or a run's directory, or a model's name,
    are common slips (the evaluation's first argument is the model)."""
    if path.is_dir():
        if (path / "config.json").is_file():
            return f"config file '{path}' is a model directory: give it as model={path}"
        if (path / "config.yaml").is_file():  # a run's directory, or one of yours
            said = f"config file '{path}' is a directory: give the config file in it, {path / 'config.yaml'}"
            resumable = holds_run(path) and has_saved_state(path)  # a run with a saved state
            return said + (f" (or resume={path} to continue the run saved there)" if resumable else "")
        return f"config file '{path}' is a directory, not a YAML file"
    if path.suffix.lower() not in (".yaml", ".yml", ".json"):  # tiny-random, org/name-0.5B: a model's name
        return f"config file '{path}' not found (a model is given as model={path})"
    return f"config file '{path}' not found"


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    values: dict[str, Any] | list[tuple[str, Any]] | None = None,
    base: dict[str, Any] | None = None,
) -> Config:
    """Defaults <- preset (algo) <- base <- YAML file <- overrides (`key=value` strings, then `values`:
    Python values by dotted key or section dicts, as the Python API passes them, applied in order: a
    section dict sets only its own keys), then validate. `base`: settings under the file's and the
    overrides' (`streamrl eval` of a run's checkpoint: the run's task settings, eval_settings.py)."""
    cfg = Config()
    given = list(values.items()) if isinstance(values, dict) else list(values or [])
    parsed = [parse_override(o) for o in overrides] + given
    resume = next((str(v) for k, v in reversed(parsed) if k == "resume"), "")  # the last, as applied
    if resume:  # continue a run: its resolved config is the base, the overrides still apply
        if path is not None:
            raise ConfigError(
                "resume=RUN_DIR takes its config from RUN_DIR/config.yaml; drop the config file"
            )
        path = _saved_config(resume)
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(_not_a_config_file(path))
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping of keys to values")
        if data.get("resume") and not any(k == "resume" for k, _ in parsed):  # a resumed run's records it
            raise ConfigError(
                f"config file '{path}' sets resume: {data['resume']}: to continue that run give "
                f"resume={data['resume']} alone; to start a new run from this file, add resume= (empty) or "
                "delete its resume line"
            )
    algo = next((str(v) for k, v in reversed(parsed) if k == "algo"), str(data.get("algo", "")))
    preset: dict[str, Any] = {}
    if algo and not resume:  # a resumed run's config.yaml already holds the resolved preset
        from streamrl.presets import load_preset

        try:
            preset = load_preset(algo)
        except ValueError as e:
            raise ConfigError(f"config key 'algo': {e}") from e
        for k, v in preset.items():
            apply_key(cfg, str(k), v)
    for k, v in (base or {}).items():
        apply_key(cfg, str(k), v)
    for k, v in data.items():
        apply_key(cfg, str(k), v)
    for k, v in parsed:
        apply_key(cfg, k, v)
    given_pairs = [{k: v} for k, v in parsed]  # each on its own: a section given twice sets both's keys
    if preset:  # a key only the preset set, which the loss or estimator chosen over it does not read
        _drop_preset_keys_unread(cfg, preset, [data, *given_pairs])
    if resume:  # the saved config.yaml is what sets the run's keys, the overrides are the user's
        _drop_reward_keys_unread(cfg, [data], given_pairs)
        _refuse_another_run_dir(parsed, resume)
        cfg.run_dir = resume
        refuse_changes_a_resume_would_ignore(cfg)
        _note_dropped(_drop_data_keys_unread(cfg, given_pairs), f"resume: {resume}/config.yaml")
        _drop_lora_keys_unread(cfg, given_pairs)
        if cfg.eval.k and not _sets(["eval", "n"], *given_pairs):  # the saved eval.n is a resolved one
            cfg.eval.n = max(cfg.eval.n, *cfg.eval.k)
    else:
        _drop_reward_keys_unread(cfg, [preset], [data, *given_pairs])
        n_from_k(cfg, preset, data, *given_pairs)
        if base:  # a trained run's task settings: saved, as a resumed run's are
            dropped = _drop_data_keys_unread(cfg, [data, *given_pairs])
            _note_dropped(dropped, "eval: the trained run's config.yaml")
    # the judge timeouts a resumed run saved are its own; one the user gives is checked as in a new run
    keep_judge = bool(resume) and not any(_sets(["reward", k], *given_pairs) for k in JUDGE_FIT_KEYS)
    validate(cfg, keep_saved_judge=keep_judge)
    if keep_judge and (warning := judge_kept_warning(cfg.reward, f"{resume}/config.yaml")):
        print(warning, file=sys.stderr, flush=True)
    return cfg


def _refuse_another_run_dir(parsed: list[tuple[str, Any]], resume: str) -> None:
    given = next((str(v) for k, v in reversed(parsed) if k == "run_dir"), None)
    if given is not None and Path(given).resolve() != Path(resume).resolve():
        raise ConfigError(
            f"resume: run_dir={given!r} is not the run resumed, {resume!r}: a resumed run continues in its "
            "own directory; drop run_dir (to train again elsewhere, start a new run from its checkpoint)"
        )


def _saved_config(resume: str) -> Path:
    """RUN_DIR/config.yaml of the run `resume` names; one line if `resume` holds no run (a config.yaml of
    your own, beside no file a run writes, is a config to train with, not a run to continue)."""
    path = Path(resume) / "config.yaml"
    if Path(resume).is_file():  # RUN/config.yaml for RUN, or a config file of yours
        run = Path(resume).parent
        raise ConfigError(
            f"resume: '{resume}' is a file of a run: give its directory, resume={run}"
            if holds_run(run)
            else f"resume: '{resume}' is a file, not a run directory: to train with it, give it as the "
            "config file and drop resume"
        )
    if started_only(Path(resume)):
        raise ConfigError(
            f"resume: '{resume}' holds a run killed at its start, before its config.yaml and any saved "
            f"state: start it again with your config file and settings and run_dir={resume}"
        )
    if not path.is_file():
        raise ConfigError(no_run_to_resume_message(Path(resume)))
    if not holds_run(Path(resume)):
        raise ConfigError(
            f"resume: '{resume}' holds a config.yaml but no run (none of {', '.join(RUN_MARKERS)}): to "
            f"train with it, give {path} as the config file and drop resume"
        )
    return path


def refuse_changes_a_resume_would_ignore(cfg: Config) -> None:
    """A resumed run (cfg.resume) changes no key its saved state fixes (RESUME_FIXED): one line naming the
    first that differs from RUN_DIR/config.yaml, however it was changed (an override, a keyword of
    streamrl.train, a Config's attribute set after it was made). Both sides are compared as a resume
    reads them: the keys the run's data sources or model never read are dropped from each (given again,
    validate refuses them). load_config runs it for its overrides, make_config for those put on a Config
    made before, preflight for every training run (a Config changed since)."""
    if not cfg.resume:
        return
    data = read_yaml(_saved_config(cfg.resume)) or {}
    saved = Config()
    for k, v in data.items() if isinstance(data, dict) else []:
        apply_key(saved, str(k), v)
    refuse_a_fixed_change(_as_resumed(saved), _as_resumed(copy.deepcopy(cfg)), cfg.resume)


def _as_resumed(cfg: Config) -> Config:
    """`cfg` without the data and LoRA keys its run never read (as a resume drops them when not given),
    its held-out reply length resolved as validate resolves it (a config.yaml written unvalidated keeps
    eval.max_new_tokens 0)."""
    _drop_data_keys_unread(cfg, [])
    _drop_lora_keys_unread(cfg, [])
    resolve_eval_length(cfg)
    return cfg


def _note_dropped(dropped: list[str], saved: str) -> None:
    """One line naming the data keys dropped from the config.yaml `saved` names."""
    if dropped:
        print(
            f"streamrl: note: {saved} sets {', '.join(dropped)}, which the run's data sources never "
            "read: dropped (a new run refuses them)",
            file=sys.stderr,
            flush=True,
        )


def _drop_data_keys_unread(cfg: Config, given: list[dict[str, Any]]) -> list[str]:
    """A resumed data task (hf:, data:), or a mixture's data source, saved with args, or with a shuffle
    buffer and no streaming, keys its source never read and that are refused today: back to their
    defaults, as the run used them; returns the keys dropped (given again on the command line, they are
    refused). So too in `streamrl eval` of a run's export."""
    tc, default = cfg.task_config, TaskConfig()
    dropped = []
    if is_data_source(cfg.task):
        if tc.args != default.args and not _sets(["task_config", "args"], *given):
            tc.args = dict(default.args)
            dropped.append("task_config.args")
        if not tc.streaming and tc.shuffle_buffer != default.shuffle_buffer:
            if not _sets(["task_config", "shuffle_buffer"], *given):
                tc.shuffle_buffer = default.shuffle_buffer
                dropped.append("task_config.shuffle_buffer")
    if cfg.task == "mix" and not _sets(["task_config", "sources"], *given):
        sources = []
        for i, src in enumerate(tc.sources):
            if isinstance(src, dict) and is_data_source(str(src.get("task", ""))):
                unread = [k for k in ("args", "shuffle_buffer") if _unread_by_data(src, k)]
                src = {k: v for k, v in src.items() if k not in unread}
                dropped += [f"task_config.sources[{i}].{k}" for k in unread]
            sources.append(src)
        tc.sources = tuple(sources)
    return dropped


def _unread_by_data(source: dict[str, Any], key: str) -> bool:
    """Whether a mixture's data source sets `key` without reading it (config_validate's _refuse_unread)."""
    if key == "args":
        return bool(source.get("args"))
    return key in source and not source.get("streaming", False)


def _drop_lora_keys_unread(cfg: Config, given: list[dict[str, Any]]) -> None:
    """A resumed run without LoRA (train.lora_rank=0) saved with LoRA keys it never read, refused today:
    back to their defaults, as the run used none (given again on the command line, they are refused)."""
    if cfg.train.lora_rank:
        return
    for key in LORA_ONLY:
        if not _sets(["train", key], *given):
            setattr(cfg.train, key, getattr(TrainConfig(), key))


def _drop_preset_keys_unread(cfg: Config, preset: dict[str, Any], given: list[dict[str, Any]]) -> None:
    """algo=grpo loss.name=reinforce: grpo's loss.eps_high, which reinforce does not read, goes back to
    its default instead of being refused as a key the user set."""
    import streamrl.algo  # noqa: F401  (registers every piece)
    from streamrl.algo import registry
    from streamrl.config_algo import unread_keys

    if cfg.loss.name not in registry.POLICY_LOSSES or cfg.advantage.name not in registry.ADVANTAGES:
        return  # validate names the unknown piece
    if cfg.loss.rollout_correction not in registry.CORRECTIONS:
        return
    for section, key in unread_keys(cfg, registry):
        if _sets([section, key], preset) and not _sets([section, key], *given):
            part = getattr(cfg, section)
            setattr(part, key, getattr(type(part)(), key))


def _drop_reward_keys_unread(cfg: Config, found: list[dict[str, Any]], given: list[dict[str, Any]]) -> None:
    """An env: or agent: episode's reward never reads the keys that score or shape one response: those
    `found` sets (a preset's DAPO shaping; a resumed run's config.yaml saved before they were refused)
    go back to their defaults; one the user gives is refused (config_rewards.py)."""
    if not cfg.task.startswith(("env:", "agent:")):
        return
    for key in RESPONSE_KEYS:
        if _sets(["reward", key], *found) and not _sets(["reward", key], *given):
            setattr(cfg.reward, key, getattr(type(cfg.reward)(), key))


def n_from_k(cfg: Config, *sources: dict[str, Any]) -> None:
    """eval.k alone asks for max(k) samples per problem (k=4 -> eval.n=4), unless a source sets eval.n."""
    if cfg.eval.k and not _sets(["eval", "n"], *sources):
        cfg.eval.n = max(0, *cfg.eval.k)


def given_key(key: str, source: dict[str, Any]) -> bool:
    """Whether `source` sets the dotted `key`, as 'a.b' or {'a': {'b': ...}}."""
    return _sets(key.split("."), source)


def given_value(key: str, source: dict[str, Any]) -> Any:
    """The value `source` sets for the dotted `key`, found as given_key finds it ('a.b' before
    {'a': {'b': ...}}); None if it sets none."""
    if key in source:
        return source[key]
    head, _, rest = key.partition(".")
    section = source.get(head)
    return given_value(rest, section) if rest and isinstance(section, dict) else None


def _sets(key: list[str], *sources: dict[str, Any]) -> bool:
    """Whether any source sets the dotted key, as 'a.b' or nested {'a': {'b': ...}}."""
    for src in sources:
        if ".".join(key) in src:
            return True
        head = src.get(key[0])
        if len(key) > 1 and isinstance(head, dict) and _sets(key[1:], head):
            return True
    return False


def to_dict(cfg: Config) -> dict[str, Any]:
    def plain(x: Any) -> Any:
        if isinstance(x, tuple):
            return list(x)
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}


def config_yaml(cfg: Config) -> str:
    """The config as the YAML text a run records in config.yaml (load_config reads it back)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
