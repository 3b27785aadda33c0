"""The TrainingJob field reference (docs/trainingjob-reference.md), generated from the CRD itself.

`python -m kubetrain.core.reference > docs/trainingjob-reference.md`; a test keeps the file in step.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kubetrain.core.schema import crd_schema

__all__ = ["render_reference"]

Json = Any


def _type(schema: Mapping[str, Json]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "integer or string"
    kind = str(schema.get("type", "object"))
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map of {_type(schema['additionalProperties'])}"
    return kind


def _allowed(schema: Mapping[str, Json]) -> str:
    parts = []
    if "enum" in schema:
        parts.append(" \\| ".join(f"`{v}`" for v in schema["enum"]))
    if "minimum" in schema:
        parts.append(f"{'>' if schema.get('exclusiveMinimum') else '≥'} {schema['minimum']}")
    if "maximum" in schema:
        parts.append(f"≤ {schema['maximum']}")
    if "maxLength" in schema:
        parts.append(f"≤ {schema['maxLength']} chars")
    if "maxItems" in schema:
        parts.append(f"≤ {schema['maxItems']} items")
    for rule in schema.get("x-kubernetes-validations", []):
        parts.append(f"rule: {rule['message']}")
    return "; ".join(parts)


def _rows(schema: Mapping[str, Json], path: str, required: set[str]) -> Iterator[str]:
    for name, child in schema.get("properties", {}).items():
        field = f"{path}.{name}"
        default = f"`{child['default']}`" if "default" in child and child["default"] != {} else ""
        description = str(child.get("description", "")).replace("|", "\\|").replace("\n", " ")
        mark = " (required)" if name in required else ""
        yield (f"| `{field}`{mark} | {_type(child)} | {default} | {_allowed(child)} | {description} |")
        nested = child.get("items", child) if child.get("type") == "array" else child
        # Embedded Kubernetes types are documented by Kubernetes (`kubectl explain pod.spec.volumes`).
        if "core/v1" in description:
            continue
        if nested.get("properties") and not nested.get("x-kubernetes-preserve-unknown-fields"):
            suffix = "[]" if child.get("type") == "array" else ""
            yield from _rows(nested, field + suffix, set(nested.get("required", [])))


def render_reference() -> str:
    """Markdown: one table row per field of spec and status, with type, default, bounds and rules."""
    schema = crd_schema()
    spec, status = schema["properties"]["spec"], schema["properties"]["status"]
    header = "| field | type | default | allowed | description |\n| --- | --- | --- | --- | --- |"
    lines = [
        "# TrainingJob reference (kubetrain.io/v1alpha1)",
        "",
        "Generated from `crds/trainingjobs.kubetrain.io.yaml` by `python -m kubetrain.core.reference`;",
        "`tests/test_reference.py` fails when this file and the CRD disagree.",
        "",
        "Rules on the whole spec:",
        "",
        *(f"- {rule['message']}" for rule in spec.get("x-kubernetes-validations", [])),
        "- Fields that shape the pods cannot change while the job is active (suspend it first); `nodes` of an"
        " elastic job can.",
        "- Fields of an embedded core/v1 type are Kubernetes' own, checked against its schema at `kubectl apply`"
        " (`kubectl explain pod.spec.volumes`, `pod.spec.affinity`, `pod.spec.containers.env.valueFrom`).",
        "",
        "## spec",
        "",
        header,
        *_rows(spec, "spec", set(spec.get("required", []))),
        "",
        "## status (written by the operator)",
        "",
        status.get("description", ""),
        "",
        header,
        *_rows(status, "status", set()),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_reference(), end="")
