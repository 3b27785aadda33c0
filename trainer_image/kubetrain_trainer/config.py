"""The trainer's configuration: the TrainingJob's trainer/data/checkpoint blocks, typed and defaulted.

The operator passes ``KUBETRAIN_CONFIG`` as JSON with camelCase keys, already defaulted. The trainer
applies the same defaults when a key is missing (so it also runs by hand with ``{}``) and rejects unknown
keys with a message that names the full key path, so a typo never silently trains with a default. Types,
bounds, enums and patterns come from config_schema.json, from which the CRD's matching properties are
generated: the trainer accepts what the API server accepts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

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


# The one schema of these blocks: the CRD's spec.trainer/data/checkpoint are generated from it
# (python -m crds.trainer_schema), so the trainer and the API server accept and reject the same configs.
SCHEMA_FILE: Final = Path(__file__).with_name("config_schema.json")
_SCHEMA: Final[dict[str, Any]] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
_SECTIONS: Final = ("trainer", "data", "checkpoint")
_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "integer": (int,), "number": (int, float), "string": (str,), "boolean": (bool,), "object": (dict,),
}
_TYPE_NAMES: Final = {"integer": "int", "number": "float", "string": "str", "boolean": "bool", "object": "object"}
# Keywords the checks below implement; a schema using another one fails loudly instead of checking less.
_KEYWORDS: Final = frozenset({"type", "description", "default", "enum", "minimum", "exclusiveMinimum", "maximum",
                              "minLength", "maxLength", "pattern", "properties", "additionalProperties",
                              "maxProperties"})


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_value(schema: Mapping[str, Any], value: Any, where: str) -> None:
    """Raise ConfigError unless ``value`` satisfies ``schema`` (the CRD's OpenAPI subset, as the server reads it)."""
    unsupported = sorted(set(schema) - _KEYWORDS)
    _check(not unsupported, f"{where}: the config schema uses unsupported keyword(s) {', '.join(unsupported)}")
    kind = schema["type"]
    expected = _TYPE_NAMES[kind]
    # JSON booleans are Python ints; the API server does not take one for a number.
    _check(not isinstance(value, bool) or kind == "boolean", f"{where}: expected {expected}, got a boolean")
    _check(isinstance(value, _TYPES[kind]), f"{where}: expected {expected}, got {type(value).__name__}")
    if kind == "object":
        _check_object(schema, value, where)
        return
    _check_scalar(schema, value, where)


def _check_scalar(schema: Mapping[str, Any], value: Any, where: str) -> None:
    if "enum" in schema:
        _check(value in schema["enum"], f"{where}: {value!r} is not one of {', '.join(map(str, schema['enum']))}")
    if "minimum" in schema:
        if schema.get("exclusiveMinimum"):
            _check(value > schema["minimum"], f"{where}: must be > {schema['minimum']}")
        else:
            _check(value >= schema["minimum"], f"{where}: must be >= {schema['minimum']}")
    if "maximum" in schema:
        _check(value <= schema["maximum"], f"{where}: must be <= {schema['maximum']}")
    if "minLength" in schema:
        _check(len(value) >= schema["minLength"], f"{where}: must be at least {schema['minLength']} characters long")
    if "maxLength" in schema:
        _check(len(value) <= schema["maxLength"], f"{where}: must be at most {schema['maxLength']} characters long")
    if "pattern" in schema:
        hint = f" ({schema['description']})" if "description" in schema else ""
        _check(re.search(schema["pattern"], value) is not None,
               f"{where}: {value!r} does not match the pattern {schema['pattern']}{hint}")


def _check_object(schema: Mapping[str, Any], value: Mapping[str, Any], where: str) -> None:
    """Closed objects: a key the schema does not name is a typo, never silently a default."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    additional = schema.get("additionalProperties")
    if additional is None:
        unknown = sorted(set(value) - set(properties))
        _check(not unknown, f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(properties))})")
    if "maxProperties" in schema:
        _check(len(value) <= schema["maxProperties"], f"{where}: must have at most {schema['maxProperties']} entries")
    for key, item in value.items():
        if item is not None:  # null is "unset", as the API server prunes it
            _check_value(properties.get(key, additional), item, f"{where}.{key}")


def _fields(schema: Mapping[str, Any], value: Mapping[str, Any]) -> dict[str, Any]:
    """The dataclass fields of a checked object's scalar keys: snake_case names, numbers as floats."""
    fields: dict[str, Any] = {}
    for key, item in value.items():
        kind = schema["properties"][key]["type"]
        if item is not None and kind != "object":
            fields[_snake(key)] = float(item) if kind == "number" else item
    return fields


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _parse_trainer(raw: Mapping[str, Any]) -> TrainerConfig:
    schema = _SCHEMA["properties"]["trainer"]
    fields = _fields(schema, raw)
    optimizer = OptimizerConfig(**_fields(schema["properties"]["optimizer"], raw.get("optimizer") or {}))
    # The CRD's CEL rules require one of task/entrypoint; by hand ({}) the default task runs.
    if "entrypoint" in fields and "task" in fields:
        raise ConfigError("trainer: set either task or entrypoint, not both")
    if "entrypoint" in fields:
        fields["task"] = None
    if "epochs" in fields and "max_steps" in fields:
        raise ConfigError("trainer: set either maxSteps or epochs, not both")
    if "epochs" in fields:
        fields["max_steps"] = None
    return TrainerConfig(**fields, optimizer=optimizer, options=dict(raw.get("options") or {}))


def parse_config(raw: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """Build a validated :class:`Config` from the operator's JSON; env overrides the two paths."""
    env = os.environ if env is None else env
    top = dict(raw)
    unknown = sorted(set(top) - set(_SECTIONS))
    _check(not unknown, f"config: unknown key(s) {', '.join(unknown)} (allowed: checkpoint, data, trainer)")
    sections = {name: {} if top.get(name) is None else top[name] for name in _SECTIONS}
    for name, value in sections.items():
        _check_value(_SCHEMA["properties"][name], value, name)
    data_fields = _fields(_SCHEMA["properties"]["data"], sections["data"])
    ckpt_fields = _fields(_SCHEMA["properties"]["checkpoint"], sections["checkpoint"])
    if env.get(DATA_DIR_ENV):
        data_fields["path"] = env[DATA_DIR_ENV]
    if env.get(CHECKPOINT_DIR_ENV):
        ckpt_fields["path"] = env[CHECKPOINT_DIR_ENV]
    return Config(trainer=_parse_trainer(sections["trainer"]), data=DataConfig(**data_fields),
                  checkpoint=CheckpointConfig(**ckpt_fields))


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
