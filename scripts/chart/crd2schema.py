#!/usr/bin/env python3
"""CustomResourceDefinitions -> strict JSON schemas for kubeconform (offline).

    crd2schema.py OUT_DIR CRD.yaml...

Writes OUT_DIR/<group>/<kind lowercased>_<version>.json for every served version, which kubeconform finds with
    -schema-location 'OUT_DIR/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json'

Strict like kubeconform's own openapi2jsonschema in strict mode: an object that lists its properties gets
`additionalProperties: false` unless it says x-kubernetes-preserve-unknown-fields; `nullable` becomes a null
type; apiVersion and kind must be this CRD's. Nothing is fetched: the CRDs are the repository's own files.
"""
import json
import os
import sys

import yaml


def convert(node):
    if isinstance(node, list):
        return [convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: convert(v) for k, v in value.items()}
        else:
            out[key] = convert(value)
    if node.get("nullable"):
        out.pop("nullable", None)
        if "type" in out:
            out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    for path in sys.argv[2:]:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for crd in docs:
            if crd.get("kind") != "CustomResourceDefinition":
                sys.exit(f"{path}: not a CustomResourceDefinition")
            spec = crd["spec"]
            group, kind = spec["group"], spec["names"]["kind"]
            for version in spec["versions"]:
                if not version.get("served", True):
                    continue
                schema = convert(version["schema"]["openAPIV3Schema"])
                props = schema.setdefault("properties", {})
                props["apiVersion"] = {"type": "string", "enum": [f"{group}/{version['name']}"]}
                props["kind"] = {"type": "string", "enum": [kind]}
                props.setdefault("metadata", {"type": "object"})
                schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
                schema["additionalProperties"] = False
                schema["$schema"] = "http://json-schema.org/draft-07/schema#"
                target = os.path.join(out_dir, group, f"{kind.lower()}_{version['name']}.json")
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "w", encoding="utf-8") as f:
                    json.dump(schema, f, indent=1, sort_keys=True)
                print(target)


if __name__ == "__main__":
    main()
