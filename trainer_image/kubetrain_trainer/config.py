"""The trainer's configuration: the TrainingJob's trainer/data/checkpoint blocks, typed and defaulted.

The operator passes ``KUBETRAIN_CONFIG`` as JSON with camelCase keys, already defaulted. The trainer
applies the same defaults when a key is missing (so it also runs by hand with ``{}``) and rejects unknown
keys with a message that names the full key path, so a typo never silently trains with a default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_METRICS_PORT",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "OptimizerConfig",
    "RunEnv",
    "TrainerConfig",
    "load_config",
    "parse_config",
]

CONFIG_ENV: Final = "KUBETRAIN_CONFIG"
CHECKPOINT_DIR_ENV: Final = "KUBETRAIN_CHECKPOINT_DIR"
DATA_DIR_ENV: Final = "KUBETRAIN_DATA_DIR"
METRICS_PORT_ENV: Final = "KUBETRAIN_METRICS_PORT"
DEFAULT_METRICS_PORT: Final = 9400

TASKS: Final = ("digits", "gpt", "synthetic")
STRATEGIES: Final = ("ddp", "fsdp")
PRECISIONS: Final = ("bf16", "fp16", "fp32")
OPTIMIZERS: Final = ("adamw", "sgd")
DEFAULT_MAX_STEPS: Final = 100


class ConfigError(ValueError):
    """The configuration is invalid: a user error that retrying cannot fix."""


@dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9


@dataclass(frozen=True)
class TrainerConfig:
    task: str | None = "digits"
    entrypoint: str | None = None
    strategy: str = "ddp"
    max_steps: int | None = DEFAULT_MAX_STEPS
    epochs: int | None = None
    batch_size: int = 32
    grad_accumulation: int = 1
    precision: str = "bf16"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    eval_every_steps: int = 0
    log_every_steps: int = 10
    compile: bool = False
    seed: int = 1234
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DataConfig:
    path: str = "/data"
    workers: int = 2
    prefetch_factor: int = 2
    drop_last: bool = True


@dataclass(frozen=True)
class CheckpointConfig:
    path: str = "/checkpoints"
    every_steps: int = 100
    keep: int = 3
    resume: bool = True


@dataclass(frozen=True)
class Config:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)


@dataclass(frozen=True)
class RunEnv:
    """What the pod tells the trainer about where it runs (all optional outside Kubernetes)."""

    metrics_port: int = DEFAULT_METRICS_PORT  # base port; each rank serves base + LOCAL_RANK; 0 disables
    job_name: str = ""
    namespace: str = ""
    pod_name: str = ""
    node_index: int = 0
    attempt: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunEnv:
        return cls(
            metrics_port=_env_int(env, METRICS_PORT_ENV, DEFAULT_METRICS_PORT),
            job_name=env.get("KUBETRAIN_JOB_NAME", ""),
            namespace=env.get("KUBETRAIN_NAMESPACE", ""),
            pod_name=env.get("KUBETRAIN_POD_NAME", ""),
            node_index=_env_int(env, "KUBETRAIN_NODE_INDEX", 0),
            attempt=_env_int(env, "KUBETRAIN_ATTEMPT", 0),
        )


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


# camelCase key -> (snake_case field, expected type(s)).
_TRAINER_KEYS: Final[dict[str, tuple[str, tuple[type, ...]]]] = {
    "task": ("task", (str,)),
    "entrypoint": ("entrypoint", (str,)),
    "strategy": ("strategy", (str,)),
    "maxSteps": ("max_steps", (int,)),
    "epochs": ("epochs", (int,)),
    "batchSize": ("batch_size", (int,)),
    "gradAccumulation": ("grad_accumulation", (int,)),
    "precision": ("precision", (str,)),
    "warmupSteps": ("warmup_steps", (int,)),
    "minLrRatio": ("min_lr_ratio", (int, float)),
    "gradClip": ("grad_clip", (int, float)),
    "evalEverySteps": ("eval_every_steps", (int,)),
    "logEverySteps": ("log_every_steps", (int,)),
    "compile": ("compile", (bool,)),
    "seed": ("seed", (int,)),
}
_OPTIMIZER_KEYS: Final[dict[str, tuple[str, tuple[type, ...]]]] = {
    "name": ("name", (str,)),
    "lr": ("lr", (int, float)),
    "weightDecay": ("weight_decay", (int, float)),
    "momentum": ("momentum", (int, float)),
}
_DATA_KEYS: Final[dict[str, tuple[str, tuple[type, ...]]]] = {
    "path": ("path", (str,)),
    "workers": ("workers", (int,)),
    "prefetchFactor": ("prefetch_factor", (int,)),
    "dropLast": ("drop_last", (bool,)),
}
_CHECKPOINT_KEYS: Final[dict[str, tuple[str, tuple[type, ...]]]] = {
    "path": ("path", (str,)),
    "everySteps": ("every_steps", (int,)),
    "keep": ("keep", (int,)),
    "resume": ("resume", (bool,)),
}


def _section(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected an object, got {type(raw).__name__}")
    return raw


def _convert(
    raw: dict[str, Any], keys: Mapping[str, tuple[str, tuple[type, ...]]], where: str, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Map camelCase keys to fields, checking names and types (bool is not accepted as an int)."""
    unknown = sorted(set(raw) - set(keys) - set(extra))
    if unknown:
        allowed = ", ".join(sorted([*keys, *extra]))
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {allowed})")
    out: dict[str, Any] = {}
    for key, (name, types) in keys.items():
        if key not in raw or raw[key] is None:
            continue
        value: Any = raw[key]
        if isinstance(value, bool) and bool not in types:
            raise ConfigError(f"{where}.{key}: expected {types[0].__name__}, got a boolean")
        if not isinstance(value, types):
            raise ConfigError(f"{where}.{key}: expected {types[0].__name__}, got {type(value).__name__}")
        out[name] = float(cast(float, value)) if float in types else value
    return out


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _parse_trainer(raw: dict[str, Any]) -> TrainerConfig:
    fields = _convert(raw, _TRAINER_KEYS, "trainer", extra=("optimizer", "options"))
    optimizer = OptimizerConfig(**_convert(_section(raw.get("optimizer"), "trainer.optimizer"),
                                           _OPTIMIZER_KEYS, "trainer.optimizer"))
    options = _section(raw.get("options"), "trainer.options")
    for key, value in options.items():
        _check(isinstance(value, str), f"trainer.options.{key}: expected a string, got {type(value).__name__}")
    if "entrypoint" in fields and "task" in fields:
        raise ConfigError("trainer: set either task or entrypoint, not both")
    if "entrypoint" in fields:
        fields["task"] = None
        _check(":" in fields["entrypoint"], "trainer.entrypoint: expected 'package.module:function'")
    if "epochs" in fields and "max_steps" in fields:
        raise ConfigError("trainer: set either maxSteps or epochs, not both")
    if "epochs" in fields:
        fields["max_steps"] = None
    cfg = TrainerConfig(**fields, optimizer=optimizer, options=dict(options))
    _check(cfg.task is None or cfg.task in TASKS, f"trainer.task: {cfg.task!r} is not one of {', '.join(TASKS)}")
    _check(cfg.strategy in STRATEGIES, f"trainer.strategy: {cfg.strategy!r} is not one of {', '.join(STRATEGIES)}")
    _check(cfg.precision in PRECISIONS,
           f"trainer.precision: {cfg.precision!r} is not one of {', '.join(PRECISIONS)}")
    _check(optimizer.name in OPTIMIZERS,
           f"trainer.optimizer.name: {optimizer.name!r} is not one of {', '.join(OPTIMIZERS)}")
    _check(optimizer.lr > 0, "trainer.optimizer.lr: must be > 0")
    _check(cfg.max_steps is None or cfg.max_steps >= 1, "trainer.maxSteps: must be >= 1")
    _check(cfg.epochs is None or cfg.epochs >= 1, "trainer.epochs: must be >= 1")
    _check(cfg.batch_size >= 1, "trainer.batchSize: must be >= 1")
    _check(cfg.grad_accumulation >= 1, "trainer.gradAccumulation: must be >= 1")
    _check(cfg.warmup_steps >= 0, "trainer.warmupSteps: must be >= 0")
    _check(0.0 <= cfg.min_lr_ratio <= 1.0, "trainer.minLrRatio: must be within [0, 1]")
    _check(cfg.grad_clip >= 0, "trainer.gradClip: must be >= 0 (0 disables clipping)")
    _check(cfg.eval_every_steps >= 0, "trainer.evalEverySteps: must be >= 0")
    _check(cfg.log_every_steps >= 1, "trainer.logEverySteps: must be >= 1")
    return cfg


def parse_config(raw: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """Build a validated :class:`Config` from the operator's JSON; env overrides the two paths."""
    env = os.environ if env is None else env
    top = dict(raw)
    unknown = sorted(set(top) - {"trainer", "data", "checkpoint"})
    _check(not unknown, f"config: unknown key(s) {', '.join(unknown)} (allowed: checkpoint, data, trainer)")
    trainer = _parse_trainer(_section(top.get("trainer"), "trainer"))
    data_fields = _convert(_section(top.get("data"), "data"), _DATA_KEYS, "data")
    ckpt_fields = _convert(_section(top.get("checkpoint"), "checkpoint"), _CHECKPOINT_KEYS, "checkpoint")
    if env.get(DATA_DIR_ENV):
        data_fields["path"] = env[DATA_DIR_ENV]
    if env.get(CHECKPOINT_DIR_ENV):
        ckpt_fields["path"] = env[CHECKPOINT_DIR_ENV]
    data = DataConfig(**data_fields)
    ckpt = CheckpointConfig(**ckpt_fields)
    _check(data.workers >= 0, "data.workers: must be >= 0")
    _check(data.prefetch_factor >= 1, "data.prefetchFactor: must be >= 1")
    _check(ckpt.every_steps >= 0, "checkpoint.everySteps: must be >= 0 (0 disables periodic checkpoints)")
    _check(ckpt.keep >= 1, "checkpoint.keep: must be >= 1")
    return Config(trainer=trainer, data=data, checkpoint=ckpt)


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """Read ``KUBETRAIN_CONFIG`` (JSON) from the environment; a missing variable means all defaults."""
    env = os.environ if env is None else env
    text = env.get(CONFIG_ENV, "").strip()
    if not text:
        return parse_config({}, env)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{CONFIG_ENV} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{CONFIG_ENV}: expected a JSON object, got {type(raw).__name__}")
    return parse_config(raw, env)
