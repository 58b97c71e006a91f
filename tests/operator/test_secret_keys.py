"""API keys from Secrets: the operator wires `spec.apiKeySecretRef` and
`spec.router.adminKeySecretRef` into the pods as env vars from secretKeyRefs, never as
arguments. The oracle is the engine's and the router's own parsers: the rendered args plus
the env (each secretKeyRef resolved against a Secret the way the kubelet does) give both
processes the keys, and the args alone give them none."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from radixserve.operator.builders import build_children
from radixserve.operator.config import OperatorConfig
from radixserve.operator.meta import Owner
from radixserve.operator.schema import SpecError
from radixserve.operator.spec import parse_spec
from tests.operator.cases import SMOLLM_CPU, SMOLLM_KEYS, UID

OWNER = Owner(name="chat", namespace="llm", uid=UID)
SECRETS = {"chat-keys": {"api-key": "k-3f9a-client", "admin": "k-77c1-admin"}}


def _containers(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    children = build_children(OWNER, parse_spec(spec, "chat"), OperatorConfig())
    out = {}
    for child in children:
        if child["kind"] == "Deployment":
            container = child["spec"]["template"]["spec"]["containers"][0]
            out[container["name"]] = container
    return out


def resolve_env(container: dict[str, Any], secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """What the kubelet puts in the container's environment (value or secretKeyRef)."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def _engine_args(args: list[str], env: dict[str, str]) -> Any:
    from radixserve.engine.configs.cli_args import add_server_args, server_args_from_namespace

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    return server_args_from_namespace(parser.parse_args(args[1:]), env)


def _router_config(args: list[str], env: dict[str, str]) -> Any:
    from radixserve.router.config import add_router_args, config_from_namespace

    parser = argparse.ArgumentParser()
    add_router_args(parser)
    return config_from_namespace(parser.parse_args(args[1:]), env)


def test_keys_reach_engine_and_router_through_env_only() -> None:
    c = _containers(SMOLLM_KEYS)
    engine_env = resolve_env(c["engine"], SECRETS)
    router_env = resolve_env(c["router"], SECRETS)
    assert _engine_args(c["engine"]["args"], engine_env).api_key == "k-3f9a-client"
    router = _router_config(c["router"]["args"], router_env)
    assert (router.api_key, router.worker_api_key) == ("k-3f9a-client", "k-3f9a-client")
    assert router.admin_key == "k-77c1-admin"
    # the args alone carry no key, and no key is in the rendered objects at all
    assert _engine_args(c["engine"]["args"], {}).api_key is None
    bare = _router_config(c["router"]["args"], {})
    assert (bare.api_key, bare.admin_key, bare.worker_api_key) == (None, None, None)
    rendered = repr(build_children(OWNER, parse_spec(SMOLLM_KEYS, "chat"), OperatorConfig()))
    assert "k-3f9a" not in rendered and "k-77c1" not in rendered


def test_keys_are_not_in_the_repr_of_the_parsed_configs() -> None:
    c = _containers(SMOLLM_KEYS)
    engine = _engine_args(c["engine"]["args"], resolve_env(c["engine"], SECRETS))
    router = _router_config(c["router"]["args"], resolve_env(c["router"], SECRETS))
    assert "k-3f9a" not in repr(engine) and "k-3f9a" not in repr(router)
    assert "k-77c1" not in repr(router)


def test_without_secret_refs_no_key_env_is_rendered() -> None:
    c = _containers(SMOLLM_CPU)
    engine_env = [e for e in c["engine"].get("env", []) if "valueFrom" in e]
    assert engine_env == [] and "env" not in c["router"]


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"apiKeySecretRef": {}}, "spec.apiKeySecretRef.name", "Secret name"),
        ({"apiKeySecretRef": {"name": "Bad_Name"}}, "spec.apiKeySecretRef.name", "DNS subdomain"),
        ({"apiKeySecretRef": {"name": "s", "key": "a/b"}}, "spec.apiKeySecretRef.key", "data key"),
        ({"apiKeySecretRef": {"name": "s", "value": "x"}}, "spec.apiKeySecretRef.value", "unknown"),
        ({"apiKeySecretRef": "s"}, "spec.apiKeySecretRef", "must be an object"),
        (
            {"router": {"adminKeySecretRef": {"name": ""}}},
            "spec.router.adminKeySecretRef.name",
            "non-empty",
        ),
        (
            {"engine": {"extraArgs": ["--api-key=hunter2"]}},
            "spec.engine.extraArgs[0]",
            "spec.apiKeySecretRef",
        ),
        (
            {"engine": {"env": [{"name": "RADIXSERVE_API_KEY", "value": "hunter2"}]}},
            "spec.engine.env[0].name",
            "spec.apiKeySecretRef",
        ),
    ],
)
def test_bad_secret_refs_name_the_field(patch: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**SMOLLM_CPU, **patch}, "chat")
    assert err.value.field == field
    assert words in str(err.value)
