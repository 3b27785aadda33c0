"""The CRD's spec.trainer, spec.data and spec.checkpoint properties, generated from the trainer's own schema.

`python -m crds.trainer_schema` (from the repository's root) rewrites the regions of
crds/trainingjobs.kubetrain.io.yaml between `# BEGIN generated: kubetrain_trainer <section>` and
`# END generated: kubetrain_trainer <section>` from trainer_image/kubetrain_trainer/config_schema.json, the
schema the trainer validates KUBETRAIN_CONFIG against; `--check` only says whether the CRD is current. So
`kubectl apply`, `kubetrain validate` and the trainer check the same bounds, enums and keys. What only the
operator reads (claimName) and the cross-field CEL rules stay hand-written around the regions.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from crds.regions import CRD, ROOT, GeneratorError, NoAliasDumper, regions
from crds.regions import main as regions_main

Json = Any
SCHEMA = ROOT / "trainer_image" / "kubetrain_trainer" / "config_schema.json"
COMMAND = "python -m crds.trainer_schema"
BEGIN = re.compile(r"^(?P<indent> *)# BEGIN generated: kubetrain_trainer (?P<name>\w+)\b.*$")
END = "# END generated: kubetrain_trainer {}"


def load_schema(path: Path | None = None) -> Mapping[str, Json]:
    schema: Mapping[str, Json] = json.loads((path or SCHEMA).read_text(encoding="utf-8"))
    return schema


def render(text: str, schema: Mapping[str, Json]) -> str:
    """``text`` (the CRD) with every region rewritten from ``schema`` (the trainer's config schema)."""
    lines = text.split("\n")
    sections = schema["properties"]
    out: list[str] = []
    position = 0
    seen = []
    for section, indent, begin, end in regions(lines, BEGIN, END):
        if section not in sections:
            raise GeneratorError(f"line {begin + 1}: the trainer's schema has no section {section!r}")
        seen.append(section)
        body = yaml.dump(sections[section]["properties"], Dumper=NoAliasDumper, default_flow_style=None,
                         sort_keys=False, width=4096)  # no wrapped flow mappings
        out += lines[position:begin + 1]
        out += [indent + line for line in body.splitlines()]
        position = end
    if sorted(seen) != sorted(sections):
        raise GeneratorError(f"the CRD needs exactly one region for each of {sorted(sections)}; it has {seen}")
    return "\n".join(out + lines[position:])


def main(argv: list[str] | None = None) -> int:
    return regions_main(argv, command=COMMAND, description=__doc__.split("\n")[0],
                        render=lambda text: render(text, load_schema()), crd=CRD, root=ROOT)


if __name__ == "__main__":
    sys.exit(main())
