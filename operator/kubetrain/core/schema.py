"""Local validation that evaluates the CRD itself: its OpenAPI schema, defaults and CEL rules.

The API server is the authority; this module runs the very same rules (read from the CRD file that
is installed in the cluster) so that `kubetrain validate` and `kubectl apply` cannot drift apart.
It mimics the server's order: unknown fields, defaulting, schema, then CEL rules.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import jsonschema

__all__ = ["Problem", "apply_defaults", "crd", "crd_schema", "field_problems", "validate_object"]

Json = Any


@dataclass(frozen=True, order=True)
class Problem:
    """One reason an object is invalid: the field path (as the API server writes it) and why."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@functools.cache
def crd() -> Mapping[str, Json]:
    """The TrainingJob CustomResourceDefinition shipped with the package."""
    # Beside this module, as the package installs it (importlib.resources would add 0.2 MB to the operator).
    text = (Path(__file__).parent / "crd.yaml").read_text(encoding="utf-8")
    # libyaml's loader, where PyYAML has it: the operator loads this at start-up, and the pure-Python loader's
    # garbage stays in the process as fragmented memory.
    loaded: Mapping[str, Json] = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return loaded


def crd_schema() -> Mapping[str, Json]:
    """The openAPIV3Schema of the served version."""
    schema: Mapping[str, Json] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _child_schema(schema: Mapping[str, Json], key: str) -> Mapping[str, Json] | None:
    properties = schema.get("properties", {})
    if key in properties:
        child: Mapping[str, Json] = properties[key]
        return child
    additional = schema.get("additionalProperties")
    if isinstance(additional, dict):
        return additional
    return None


def apply_defaults(schema: Mapping[str, Json], value: Json) -> Json:
    """Return a copy of ``value`` with the schema's defaults filled in, as the API server does.

    A default applies where the field is absent and its parent object is present; defaults of
    nested objects (``default: {}``) are themselves defaulted.
    """
    if isinstance(value, dict):
        result = dict(value)
        for key, prop in schema.get("properties", {}).items():
            if key not in result and "default" in prop:
                result[key] = copy.deepcopy(prop["default"])
        for key, item in result.items():
            child = _child_schema(schema, key)
            if child is not None:
                result[key] = apply_defaults(child, item)
        return result
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def _path(parts: Iterator[str | int] | list[str | int]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _unknown_fields(schema: Mapping[str, Json], value: Json, where: list[str | int]) -> Iterator[Problem]:
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields") or where == ["metadata"]:
            return
        for key, item in value.items():
            child = _child_schema(schema, key)
            if child is None:
                yield Problem(_path([*where, key]), "unknown field (check its spelling and indentation)")
            else:
                yield from _unknown_fields(child, item, [*where, key])
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _unknown_fields(schema["items"], item, [*where, index])


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string",
               "boolean": "true or false", "object": "a mapping", "array": "a list"}


def _schema_message(error: jsonschema.ValidationError) -> str:
    schema = error.schema if isinstance(error.schema, dict) else {}
    return _keyword_message(str(error.validator), schema, error.instance) or error.message


def _keyword_message(keyword: str, schema: Mapping[str, Json], instance: Json) -> str | None:
    """What the CLI says when ``instance`` breaks the schema's ``keyword``; None: jsonschema's own words."""
    if keyword == "minimum":
        exclusive = schema.get("exclusiveMinimum") is True
        return f"must be {'greater than' if exclusive else 'at least'} {schema['minimum']} (got {instance})"
    if keyword == "maximum":
        return f"must be at most {schema['maximum']} (got {instance})"
    if keyword == "enum":
        return f"must be one of {', '.join(map(str, schema['enum']))} (got {instance!r})"
    if keyword == "type":
        return f"must be {_TYPE_WORDS.get(str(schema['type']), schema['type'])} (got {instance!r})"
    if keyword == "pattern":
        return f"must match the pattern {schema['pattern']} (got {instance!r})"
    if keyword == "minLength":
        return f"must be at least {schema['minLength']} characters long"
    if keyword == "maxLength":
        return f"must be at most {schema['maxLength']} characters long"
    if keyword == "minItems":
        return f"must have at least {schema['minItems']} items"
    if keyword == "maxItems":
        return f"must have at most {schema['maxItems']} items"
    if keyword == "maxProperties":
        return f"must have at most {schema['maxProperties']} entries"
    if keyword == "anyOf" and schema.get("x-kubernetes-int-or-string"):
        return f"must be an integer or a quantity string such as 8Gi (got {instance!r})"
    return None


def _schema_problems(schema: Mapping[str, Json], value: Json) -> Iterator[Problem]:
    # Imported here: the operator never validates (the API server did), and it is a few MiB it need not hold.
    import jsonschema

    # The CRD schema is OpenAPI 3.0, whose keywords (boolean exclusiveMinimum) are draft 4's.
    validator = jsonschema.Draft4Validator(schema)
    for error in validator.iter_errors(value):
        parts: list[str | int] = list(error.absolute_path)
        if error.validator == "required":
            missing = re.findall(r"'([^']+)' is a required property", error.message)
            yield Problem(_path([*parts, *missing]), "is required")
        elif error.validator == "pattern" and isinstance(error.schema, dict) and \
                error.schema.get("x-kubernetes-int-or-string"):
            yield Problem(_path(parts), f"must be a quantity such as 8Gi or 500m (got {error.instance!r})")
        else:
            yield Problem(_path(parts), _schema_message(error))


def _list_problems(schema: Mapping[str, Json], value: Json, where: list[str | int]) -> Iterator[Problem]:
    """Uniqueness of x-kubernetes-list-type: map keys, which the server checks beside the schema."""
    if isinstance(value, dict):
        for key, item in value.items():
            child = _child_schema(schema, key)
            if child is not None:
                yield from _list_problems(child, item, [*where, key])
    elif isinstance(value, list) and "items" in schema:
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen: set[tuple[Json, ...]] = set()
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    continue
                key_value = tuple(item.get(k) for k in keys)
                if key_value in seen:
                    yield Problem(_path([*where, index]), f"duplicate entry for {', '.join(keys)} {key_value[0]!r}")
                seen.add(key_value)
        for index, item in enumerate(value):
            yield from _list_problems(schema["items"], item, [*where, index])


# Kubernetes' CEL quantity library (quantity(), isGreaterThan, isLessThan, sign), for the rules that use it.
_SUFFIXES: dict[str, int | Decimal] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")


def _quantity(text: Json) -> Decimal:
    match = _QUANTITY.fullmatch(str(text))
    if match is None:
        raise ValueError(f"invalid quantity {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return Decimal(number + suffix)
    return Decimal(number) * _SUFFIXES[suffix]


@functools.cache
def _program(rule: str) -> Any:
    import celpy  # the CLI's check only; the operator never loads the CEL interpreter (about 5 MiB)

    quantity_functions: dict[str, Callable[..., Any]] = {
        "quantity": _quantity,
        "isGreaterThan": lambda left, right: celpy.celtypes.BoolType(left > right),
        "isLessThan": lambda left, right: celpy.celtypes.BoolType(left < right),
        "sign": lambda value: celpy.celtypes.IntType((value > 0) - (value < 0)),
    }
    environment = celpy.Environment()
    return environment.program(environment.compile(rule), functions=quantity_functions)


def _cel_problems(
    schema: Mapping[str, Json], value: Json, old: Json, where: list[str | int]
) -> Iterator[Problem]:
    from celpy.adapter import json_to_cel

    for validation in schema.get("x-kubernetes-validations", []):
        rule = validation["rule"]
        is_transition = "oldSelf" in rule
        if is_transition and old is None:
            continue  # transition rules apply to updates only
        activation = {"self": json_to_cel(value)}
        if is_transition:
            activation["oldSelf"] = json_to_cel(old)
        result = _program(rule).evaluate(activation)
        if isinstance(result, Exception) or not bool(result):
            field = validation.get("fieldPath", "")
            base = _path(where)
            path = (base + field) if base else field.lstrip(".")
            yield Problem(path or "<root>", validation.get("message", f"failed rule: {rule}"))
    if isinstance(value, dict):
        for key, item in value.items():
            child = _child_schema(schema, key)
            if child is not None:
                old_item = old.get(key) if isinstance(old, dict) else None
                yield from _cel_problems(child, item, old_item, [*where, key])
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            old_item = _correlate(schema, item, old)
            yield from _cel_problems(schema["items"], item, old_item, [*where, index])


def _correlate(schema: Mapping[str, Json], item: Json, old: Json) -> Json:
    """The old list item that the server pairs with ``item`` for transition rules (map lists only)."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(old, list) or not isinstance(item, dict):
        return None
    keys = schema.get("x-kubernetes-list-map-keys", [])
    for candidate in old:
        if isinstance(candidate, dict) and all(candidate.get(k) == item.get(k) for k in keys):
            return candidate
    return None


def field_problems(path: str, value: Json) -> list[Problem]:
    """Problems of ``value`` as the TrainingJob field at ``path`` (e.g. "spec.image"), by that field's schema.

    For settings that stand in for a field (the operator's default trainer image), so they obey its bounds.
    """
    schema: Mapping[str, Json] | None = crd_schema()
    for key in path.split("."):
        schema = _child_schema(schema, key) if schema is not None else None
    if schema is None or schema.get("type") != "string":
        raise KeyError(f"the CRD has no string field {path}")
    return [Problem(path, message) for message in _string_problems(schema, value)]


def _string_problems(schema: Mapping[str, Json], value: Json) -> Iterator[str]:
    """A string field's bounds, checked without jsonschema: the operator checks its settings this way at
    start-up, and importing jsonschema (with its metaschemas) would cost the process about 1 MiB for good."""
    if not isinstance(value, str):
        yield _keyword_message("type", schema, value) or "type"
        return
    for keyword, broken in (("minLength", lambda bound: len(value) < bound),
                            ("maxLength", lambda bound: len(value) > bound),
                            ("pattern", lambda pattern: re.search(pattern, value) is None)):
        if keyword in schema and broken(schema[keyword]):
            yield _keyword_message(keyword, schema, value) or keyword


def validate_object(obj: Json, old: Json = None) -> tuple[Json, list[Problem]]:
    """Default and validate a TrainingJob object; return the defaulted object and its problems.

    ``old`` is the stored object for an update, which enables the CEL transition rules.
    """
    schema = crd_schema()
    if not isinstance(obj, dict):
        return obj, [Problem("<root>", "must be a mapping with apiVersion, kind, metadata and spec")]
    problems = sorted(set(_unknown_fields(schema, obj, [])))
    defaulted = apply_defaults(schema, obj)
    old_defaulted = apply_defaults(schema, old) if old is not None else None
    problems += sorted(set(_schema_problems(schema, defaulted)))
    problems += list(_list_problems(schema, defaulted, []))
    if not problems:
        problems += list(_cel_problems(schema, defaulted, old_defaulted, []))
    return defaulted, problems
