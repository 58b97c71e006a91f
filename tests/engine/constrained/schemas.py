"""The grammars the structured-output tests ask for: 24 JSON schemas of varied shape (nested
objects, arrays, enums, anyOf, $ref, string patterns, numeric bounds), 8 regexes and 2 EBNF
grammars, each with a prompt that invites it. Strings and arrays are bounded so that a small
model sampling at temperature 1 still closes its JSON within the token budget."""

from __future__ import annotations

from typing import Any

NAME = {"type": "string", "maxLength": 24}
SHORT = {"type": "string", "maxLength": 12}
INT = {"type": "integer", "minimum": -999, "maximum": 999}
COUNT = {"type": "integer", "minimum": 0, "maximum": 99999999}
NUMBER = {"type": "number", "minimum": 0, "maximum": 100}

SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("A person as JSON:", {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    }),
    ("A city as JSON:", {
        "type": "object",
        "properties": {"city": NAME, "country": NAME, "population": COUNT},
        "required": ["city", "country"],
        "additionalProperties": False,
    }),
    ("A color:", {"type": "string", "enum": ["red", "green", "blue"]}),
    ("A boolean flag as JSON:", {
        "type": "object", "properties": {"enabled": {"type": "boolean"}}, "required": ["enabled"],
    }),
    ("Three small numbers:", {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 3, "maxItems": 3,
    }),
    ("A list of tags:", {"type": "array", "items": SHORT, "minItems": 1, "maxItems": 4}),
    ("A product as JSON:", {
        "type": "object",
        "properties": {
            "name": NAME,
            "price": {"type": "number", "minimum": 0, "maximum": 1000},
            "currency": {"enum": ["USD", "EUR", "GBP"]},
        },
        "required": ["name", "price", "currency"],
    }),
    ("A nested address as JSON:", {
        "type": "object",
        "properties": {
            "name": NAME,
            "address": {
                "type": "object",
                "properties": {"street": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "zip"],
            },
        },
        "required": ["name", "address"],
    }),
    ("A date as JSON:", {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
        "required": ["date"],
    }),
    ("An id or a name:", {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 999}, NAME]}),
    ("A shape as JSON:", {
        "anyOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "circle"}, "radius": NUMBER},
                "required": ["kind", "radius"],
            },
            {
                "type": "object",
                "properties": {"kind": {"const": "square"}, "side": INT},
                "required": ["kind", "side"],
            },
        ]
    }),
    ("A team with members as JSON:", {
        "$defs": {
            "member": {
                "type": "object",
                "properties": {"name": NAME, "role": {"enum": ["dev", "ops", "lead"]}},
                "required": ["name", "role"],
            }
        },
        "type": "object",
        "properties": {
            "team": SHORT,
            "members": {"type": "array", "items": {"$ref": "#/$defs/member"}, "maxItems": 2},
        },
        "required": ["team", "members"],
    }),
    ("A point as JSON:", {
        "type": "object",
        "properties": {
            "x": {"type": "number", "minimum": -10, "maximum": 10},
            "y": {"type": "number", "minimum": -10, "maximum": 10},
        },
        "required": ["x", "y"],
    }),
    ("A rating:", {"type": "integer", "minimum": 1, "maximum": 5}),
    ("An optional nickname as JSON:", {
        "type": "object",
        "properties": {"nickname": {"anyOf": [SHORT, {"type": "null"}]}},
        "required": ["nickname"],
    }),
    ("A matrix:", {
        "type": "array",
        "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                  "minItems": 2, "maxItems": 2},
        "minItems": 2, "maxItems": 2,
    }),
    ("An HTTP response as JSON:", {
        "type": "object",
        "properties": {
            "status": {"type": "integer", "enum": [200, 404, 500]},
            "headers": {"type": "object", "properties": {"content-type": SHORT},
                        "required": ["content-type"]},
        },
        "required": ["status", "headers"],
    }),
    ("A username as JSON:", {
        "type": "object",
        "properties": {"username": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,11}$"}},
        "required": ["username"],
    }),
    ("A temperature reading as JSON:", {
        "type": "object",
        "properties": {
            "celsius": {"type": "number", "minimum": -50, "maximum": 60},
            "unit": {"const": "C"},
        },
        "required": ["celsius", "unit"],
    }),
    ("A tree node as JSON:", {
        "$defs": {
            "leaf": {"type": "object", "properties": {"value": INT},
                     "required": ["value"]},
        },
        "type": "object",
        "properties": {
            "value": INT,
            "children": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "maxItems": 3},
        },
        "required": ["value", "children"],
    }),
    ("An event as JSON:", {
        "type": "object",
        "properties": {
            "title": NAME,
            "day": {"enum": ["mon", "tue", "wed", "thu", "fri"]},
            "hour": {"type": "integer", "minimum": 0, "maximum": 23},
            "public": {"type": "boolean"},
        },
        "required": ["title", "day", "hour", "public"],
    }),
    ("A version as JSON:", {
        "type": "object",
        "properties": {"version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"}},
        "required": ["version"],
    }),
    ("A score between 0 and 1:", {"type": "number", "minimum": 0, "maximum": 1}),
    ("An order as JSON:", {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 9999},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": SHORT, "qty": {"type": "integer", "minimum": 1,
                                                         "maximum": 9}},
                    "required": ["sku", "qty"],
                },
                "minItems": 1,
                "maxItems": 2,
            },
            "note": {"anyOf": [SHORT, {"type": "null"}]},
        },
        "required": ["id", "items"],
    }),
]  # fmt: skip

REGEXES: list[tuple[str, str]] = [
    ("Phone number:", r"\(\d{3}\) \d{3}-\d{4}"),
    ("Email address:", r"[a-z]{3,8}@[a-z]{3,8}\.(com|org|net)"),
    (
        "An IPv4 address:",
        r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)",
    ),
    ("Answer yes or no:", r"(yes|no)"),
    ("A date:", r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"),
    ("A hex color:", r"#[0-9a-fA-F]{6}"),
    ("A capitalised word:", r"[A-Z][a-z]{1,10}"),
    ("A time:", r"([01]\d|2[0-3]):[0-5]\d"),
]

# (prompt, grammar, oracle name): each oracle parses the output in Python (tests decide).
EBNFS: list[tuple[str, str, str]] = [
    (
        "An arithmetic expression:",
        'root ::= expr\nexpr ::= term (("+" | "-") term){0,3}\nterm ::= num | "(" expr ")"\n'
        "num ::= [1-9] [0-9]{0,2}",
        "arithmetic",
    ),
    (
        "A shopping list:",
        'root ::= item ("," " " item){0,3}\nitem ::= qty " " fruit\nqty ::= [1-9]\n'
        'fruit ::= "apples" | "pears" | "plums"',
        "shopping",
    ),
]
