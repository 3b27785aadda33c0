"""Structural schemas for the core/v1 types a TrainingJob embeds, generated from Kubernetes' own OpenAPI.

`python -m crds.core_schemas` (from the repository's root) rewrites the generated regions of
crds/trainingjobs.kubetrain.io.yaml, the one CRD file: the package's operator/kubetrain/core/crd.yaml and the
chart's charts/kubetrain/crds/ hold links to it. `--check` only says whether it is current. The source is
the OpenAPI v3 document of the Kubernetes version the lab builds (tests/lab/versions.py), read from the Go
module cache that `python -m tests.lab build` fills; only the lab's go.mod and proxy settings locate it, hence
the import of tests.lab. A repository tool beside the file it writes, not part of the shipped package.

A region sits inside a hand-written schema's `properties`, between `# BEGIN generated: core/v1 <Type>` and
`# END generated: core/v1 <Type>`. It holds the core type's properties that the hand-written schema does not
declare itself: kubetrain's own, stricter versions (the volume name's pattern, the toleration enums) win,
and the generator checks that they keep the core type's types and `required`.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from crds.regions import CRD, ROOT, GeneratorError, NoAliasDumper, regions
from crds.regions import main as regions_main
from tests.lab.build import module_source_dir
from tests.lab.versions import KUBERNETES_VERSION, MODULES

Json = Any
COMMAND = "python -m crds.core_schemas"
CORE = "io.k8s.api.core.v1."
REF = "#/components/schemas/"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
# Pod validation allows only labels and annotations in an ephemeral volume's claim template
# (ValidateTemplateObjectMeta); the rest of ObjectMeta (managedFields, ownerReferences, ...) would only
# bloat the CRD with fields the API server refuses anyway.
TRIMMED = {"io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": ("annotations", "labels")}
# The same pattern as the CRD's own quantities: a typo such as `sizeLimit: lots` fails at `kubectl apply`.
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
# Keywords a structural schema keeps, in the order they are written; documentation and the client-side
# patch hints are dropped (they are not validation, and descriptions would triple the CRD's size).
KEPT = ("type", "format", "enum", "required", "x-kubernetes-map-type", "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys", "items", "additionalProperties", "properties")
DROPPED = frozenset({"description", "default", "x-kubernetes-patch-strategy", "x-kubernetes-patch-merge-key",
                     "x-kubernetes-unions", "x-kubernetes-group-version-kind"})
BEGIN = re.compile(r"^(?P<indent> *)# BEGIN generated: core/v1 (?P<name>\w+)\b.*$")
END = "# END generated: core/v1 {}"


def openapi_path() -> Path:
    source = module_source_dir("k8s.io/kubernetes", KUBERNETES_VERSION, MODULES["k8s"].directory)
    return source / "api" / "openapi-spec" / "v3" / "api__v1_openapi.json"


@functools.cache
def _definitions(path: Path) -> Mapping[str, Json]:
    definitions: Mapping[str, Json] = json.loads(path.read_text())["components"]["schemas"]
    return definitions


def _int_or_string(name: str) -> dict[str, Json]:
    # The CRD spelling of IntOrString and Quantity (the API's `oneOf` is not structural).
    node: dict[str, Json] = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    if name == QUANTITY:
        node["pattern"] = QUANTITY_PATTERN
    return node


def structural(schema: Mapping[str, Json], definitions: Mapping[str, Json], stack: tuple[str, ...] = ()) -> Json:
    """``schema`` with every $ref inlined and only the keywords a CRD's structural schema keeps."""
    if "$ref" in schema or "allOf" in schema:
        refs = [schema] if "$ref" in schema else schema["allOf"]
        if len(refs) != 1 or set(refs[0]) != {"$ref"}:
            raise GeneratorError(f"cannot inline {schema}")
        name = refs[0]["$ref"].removeprefix(REF)
        if name in (INT_OR_STRING, QUANTITY):
            return _int_or_string(name)
        if name in stack:
            raise GeneratorError(f"recursive type {' -> '.join([*stack, name])}")
        target = dict(definitions[name])
        if name in TRIMMED:
            target["properties"] = {k: v for k, v in target["properties"].items() if k in TRIMMED[name]}
        return structural(target, definitions, (*stack, name))
    unknown = set(schema) - set(KEPT) - DROPPED
    if unknown or "type" not in schema or schema.get("format") == "int-or-string":
        raise GeneratorError(f"not a structural schema in {' -> '.join(stack)}: {sorted(schema)}")
    result: dict[str, Json] = {}
    for keyword in KEPT:
        if keyword not in schema:
            continue
        value = schema[keyword]
        if keyword == "items":
            value = structural(value, definitions, stack)
        elif keyword == "additionalProperties":
            value = structural(value, definitions, stack) if isinstance(value, dict) else value
        elif keyword == "properties":
            value = {key: structural(child, definitions, stack) for key, child in sorted(value.items())}
        result[keyword] = value
    if result["type"] == "object" and not result.get("properties") and "additionalProperties" not in result:
        raise GeneratorError(f"an object without fields would prune everything: {' -> '.join(stack)}")
    return result


def core_schema(type_name: str, path: Path | None = None) -> Json:
    """The structural schema of core/v1 ``type_name`` (e.g. "Volume")."""
    definitions = _definitions(path or openapi_path())
    return structural({"$ref": REF + CORE + type_name}, definitions)


def _sentinel(type_name: str) -> str:
    return f"__generated_core_{type_name}__"


def _find_parent(node: Json, key: str) -> Json:
    """The schema whose `properties` mapping holds ``key``."""
    if isinstance(node, dict):
        properties = node.get("properties")
        if isinstance(properties, dict) and key in properties:
            return node
        children: Iterator[Json] = iter(node.values())
    elif isinstance(node, list):
        children = iter(node)
    else:
        return None
    for child in children:
        found = _find_parent(child, key)
        if found is not None:
            return found
    return None


def hand_written(text: str) -> dict[str, Mapping[str, Json]]:
    """For each region's type, the hand-written schema around it, without the generated properties."""
    lines = text.split("\n")
    kept: list[str] = []
    position = 0
    for type_name, indent, begin, end in regions(lines, BEGIN, END):
        kept += [*lines[position:begin], f"{indent}{_sentinel(type_name)}: {{}}"]
        position = end + 1
    document = yaml.safe_load("\n".join(kept + lines[position:]))
    schemas: dict[str, Mapping[str, Json]] = {}
    for type_name, _, _, _ in regions(lines, BEGIN, END):
        parent = _find_parent(document, _sentinel(type_name))
        if parent is None:
            raise GeneratorError(f"the core/v1 {type_name} region is not inside a schema's properties")
        properties = {k: v for k, v in parent["properties"].items() if k != _sentinel(type_name)}
        schemas[type_name] = {**parent, "properties": properties}
    return schemas


def _kind(schema: Mapping[str, Json]) -> str:
    return "int-or-string" if schema.get("x-kubernetes-int-or-string") else str(schema.get("type"))


def generated_properties(type_name: str, around: Mapping[str, Json], core: Json) -> dict[str, Json]:
    """The core type's properties that ``around`` (kubetrain's hand-written schema) leaves to the generator."""
    own = around["properties"]
    problems = [f"{name}: not a field of core/v1 {type_name}" for name in own if name not in core["properties"]]
    problems += [f"{name}: is {_kind(own[name])} here but {_kind(core['properties'][name])} in core/v1"
                 for name in own if name in core["properties"] and _kind(own[name]) != _kind(core["properties"][name])]
    if around.get("type") != core["type"]:
        problems.append(f"type: {around.get('type')} here but {core['type']} in core/v1")
    missing = set(core.get("required", [])) - set(around.get("required", []))
    if missing:
        problems.append(f"required: core/v1 also requires {sorted(missing)}")
    if problems:
        raise GeneratorError(f"the hand-written schema around core/v1 {type_name} disagrees: {'; '.join(problems)}")
    return {name: schema for name, schema in core["properties"].items() if name not in own}


def render(text: str, path: Path | None = None) -> str:
    """``text`` (the CRD) with every generated region rewritten from the OpenAPI document at ``path``."""
    lines = text.split("\n")
    around = hand_written(text)
    out: list[str] = []
    position = 0
    for type_name, indent, begin, end in regions(lines, BEGIN, END):
        properties = generated_properties(type_name, around[type_name], core_schema(type_name, path))
        body = yaml.dump(properties, Dumper=NoAliasDumper, default_flow_style=None, sort_keys=False, width=120)
        out += lines[position:begin + 1]
        out += [indent + line for line in body.splitlines() if properties]
        position = end
    return "\n".join(out + lines[position:])


def main(argv: list[str] | None = None) -> int:
    return regions_main(argv, command=COMMAND, description=__doc__.split("\n")[0], render=render, crd=CRD, root=ROOT)


if __name__ == "__main__":
    sys.exit(main())
