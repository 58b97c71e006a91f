"""Validation oracles for deploy objects: Kubernetes' own OpenAPI schemas and the CRD's schema.

Built-in kinds go through `kubernetes-validate` (the API server's OpenAPI for one Kubernetes
version, strict: unknown fields are errors). InferenceService objects go through the CRD's own
`openAPIV3Schema` with jsonschema, made as strict as `kubectl apply` (server-side field
validation rejects unknown fields), after the API server's structural defaulting. The
third-party kinds we ship (KEDA ScaledObject, ServiceMonitor, PodMonitor) are not in
kubernetes-validate: they go through the small closed schemas of `crd_schemas.py`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from tests.deploy.crd_schemas import SCHEMAS

K8S_VERSION = "1.31.0"
ISVC_GROUP = "radixserve.io"
ISVC_KIND = "InferenceService"
ISVC_VERSION = "v1alpha1"

Obj = dict[str, Any]


def object_id(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name')}"


def is_isvc(obj: Obj) -> bool:
    return obj.get("kind") == ISVC_KIND and str(obj.get("apiVersion", "")).startswith(ISVC_GROUP)


def validate_k8s(obj: Obj) -> None:
    """Raise AssertionError naming the object and the failing field."""
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path) or "<root>"
        raise AssertionError(f"{object_id(obj)}: {where}: {exc.message}") from None


def load_crd(path: Path) -> Obj:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert len(docs) == 1, f"{path}: expected one CustomResourceDefinition, got {len(docs)}"
    return docs[0]


def crd_version_schema(crd: Obj, version: str = ISVC_VERSION) -> Obj:
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise AssertionError(f"CRD {crd['metadata']['name']} has no version {version}")


def _closed(schema: Any) -> Any:
    """Structural schema → jsonschema that rejects unknown fields like strict field validation."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed(value) for key, value in schema.items()}
    open_ended = (
        schema.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in schema
    )
    if "properties" in schema and not open_ended:
        out["additionalProperties"] = False
    return out


def isvc_validator(crd: Obj) -> jsonschema.protocols.Validator:
    """OpenAPI v3.0 schemas use draft-4 semantics (boolean exclusiveMinimum, no const)."""
    schema = copy.deepcopy(crd_version_schema(crd))
    # The API server checks ObjectMeta itself; the CRD schema leaves it as a bare object.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return jsonschema.Draft4Validator(_closed(schema))


def apply_defaults(obj: Any, schema: Obj) -> Any:
    """The API server's structural defaulting: fill `default` for absent properties, recursively."""
    if isinstance(obj, dict):
        props = schema.get("properties", {})
        for key, sub in props.items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                obj[key] = apply_defaults(obj[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in obj.keys() - props.keys():
                obj[key] = apply_defaults(obj[key], extra)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in obj]
    return obj


def validate_isvc(obj: Obj, crd: Obj) -> Obj:
    """Validate an InferenceService as the API server would; return it with defaults applied."""
    assert obj.get("apiVersion") == f"{ISVC_GROUP}/{ISVC_VERSION}", object_id(obj)
    defaulted = apply_defaults(copy.deepcopy(obj), crd_version_schema(crd))
    errors = sorted(isvc_validator(crd).iter_errors(defaulted), key=lambda e: list(e.path))
    if errors:
        lines = [f"{'/'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors]
        raise AssertionError(f"{object_id(obj)} fails the CRD schema:\n  " + "\n  ".join(lines))
    return defaulted


def validate_third_party(obj: Obj) -> None:
    """A KEDA or Prometheus Operator object against its closed schema (crd_schemas.py)."""
    schema = SCHEMAS[(obj["apiVersion"], obj["kind"])]
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        lines = [f"{'/'.join(map(str, e.path)) or '<root>'}: {e.message}" for e in errors]
        raise AssertionError(f"{object_id(obj)} fails its schema:\n  " + "\n  ".join(lines))


def validate_any(obj: Obj, crd: Obj) -> None:
    if is_isvc(obj):
        validate_isvc(obj, crd)
    elif (obj.get("apiVersion"), obj.get("kind")) in SCHEMAS:
        validate_third_party(obj)
    else:
        validate_k8s(obj)
