"""A status as the API server would take it: valid JSON (no NaN or infinities), and valid against the CRD's
status schema (types, bounds, lengths, enums; integers that fit an int64). This module holds no tests."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD = Path(__file__).resolve().parent.parent / "crds" / "trainingjobs.kubetrain.io.yaml"
INT64 = 2**63
Json = Any


@functools.cache
def status_schema() -> Mapping[str, Json]:
    crd = yaml.safe_load(CRD.read_text())
    schema: Mapping[str, Json] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def _integers_fit(schema: Mapping[str, Json], value: Json, path: str) -> None:
    if schema.get("type") == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), f"{path}: {value!r} is not an integer"
        assert -INT64 <= value < INT64, f"{path}: {value} does not fit an int64"
    for key, sub in (schema.get("properties") or {}).items():
        if isinstance(value, Mapping) and key in value:
            _integers_fit(sub, value[key], f"{path}.{key}")
    if schema.get("type") == "array" and isinstance(value, list):
        for index, item in enumerate(value):
            _integers_fit(schema.get("items") or {}, item, f"{path}[{index}]")


def assert_valid_status(status: Mapping[str, Json]) -> None:
    json.dumps(status, allow_nan=False)  # raises on NaN and infinities, which the API server cannot read
    jsonschema.validate(dict(status), dict(status_schema()))
    _integers_fit(status_schema(), status, "status")
