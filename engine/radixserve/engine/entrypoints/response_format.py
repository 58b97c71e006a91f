"""OpenAI's `response_format` as the engine's grammar fields (SGLang's mapping).

`{"type": "text"}` constrains nothing; `json_object` is the schema `{"type": "object"}` (any
object, as SGLang: not any JSON value); `json_schema` is its `schema` (also taken from a bare
top-level `schema`; `strict` true or false alike is enforced, as plain chat templates never show
the schema to the model); `structural_tag` is the whole object, compiled as xgrammar's
structural tag. A schema that does not parse is a 400 naming `response_format.json_schema`.
Runs in the main process.
"""

from __future__ import annotations

import json
from typing import Any

from radixserve.engine.constrained import GrammarKey, grammar_error
from radixserve.engine.entrypoints.request_builder import InvalidRequest

JSON_OBJECT_SCHEMA = '{"type": "object"}'
TYPES = ("text", "json_object", "json_schema", "structural_tag")


def response_format_params(fmt: dict[str, Any] | None) -> dict[str, Any]:
    """The sampling parameters a `response_format` adds (none for text)."""
    if fmt is None:
        return {}
    kind = fmt.get("type")
    if kind not in TYPES:
        raise InvalidRequest(f"response_format.type: must be one of {', '.join(TYPES)}")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": JSON_OBJECT_SCHEMA}
    if kind == "structural_tag":
        text = json.dumps({k: v for k, v in fmt.items() if k != "type"})
        _check(GrammarKey("structural_tag", text), "response_format")
        return {"structural_tag": text}
    text = json.dumps(_schema(fmt))
    _check(GrammarKey("json", text), "response_format.json_schema.schema")
    return {"json_schema": text}


def _schema(fmt: dict[str, Any]) -> Any:
    spec = fmt.get("json_schema")
    if spec is None and "schema" in fmt:  # SGLang also takes the schema at the top level
        spec = {"schema": fmt["schema"]}
    if not isinstance(spec, dict):
        raise InvalidRequest("response_format.json_schema: expected an object with a schema")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("response_format.json_schema.strict: expected a boolean")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidRequest("response_format.json_schema.name: expected a string")
    schema = spec.get("schema", {"type": "object"})
    if not isinstance(schema, dict | bool):
        raise InvalidRequest("response_format.json_schema.schema: expected a JSON schema object")
    return schema


def _check(key: GrammarKey, field: str) -> None:
    error = grammar_error(key)
    if error is not None:
        raise InvalidRequest(f"{field}: {error}")
