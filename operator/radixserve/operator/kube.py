"""The one module that talks to the Kubernetes API (kubernetes_asyncio), for the handlers.

Children are applied like `kubectl apply` does it client-side: a JSON merge patch of the
desired object, plus nulls for the fields we set last time and no longer want (remembered in
the `radixserve.io/last-applied` annotation). A child is patched only when one of the fields
we own differs from the live object, so a resync of a settled service costs only GETs. Merge
patch (not strategic merge or server-side apply) keeps the operator testable against an API
emulator; lists we own (containers, ports, env) are replaced whole, which is what we want.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from radixserve.operator.config import GROUP
from radixserve.operator.kinds import BY_TYPE, INFERENCE_SERVICE

LAST_APPLIED = f"{GROUP}/last-applied"
MERGE_PATCH = "application/merge-patch+json"


class ForeignObjectError(RuntimeError):
    """A child's name is taken by an object that this InferenceService does not own."""


def describe(exc: BaseException) -> str:
    """A short account of a failed API call, for the status and the log (no bodies)."""
    if isinstance(exc, ApiException):
        reason, message = str(exc.reason or ""), ""
        try:
            body = json.loads(exc.body) if exc.body else None
        except (TypeError, ValueError):
            body = None
        if isinstance(body, Mapping):
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or "")
        text = f"HTTP {exc.status} {reason}".rstrip() + (f": {message}" if message else "")
    elif isinstance(exc, asyncio.TimeoutError):
        text = "the API server did not answer in time"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:200]


class ApplyError(RuntimeError):
    """One step of applying the children failed on the API (transient: retried); the message
    names the step, e.g. `apply Deployment/chat-engine failed: HTTP 500 InternalError`."""

    def __init__(self, step: str, cause: BaseException) -> None:
        super().__init__(f"{step} failed: {describe(cause)}")
        self.step = step


def _path(api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
    """The URL of one namespaced object (or of its collection); only of the kinds in
    `kinds.BY_TYPE`: those the operator builds, and the InferenceService."""
    resource = BY_TYPE[(api_version, kind)]
    path = f"{resource.url_prefix}/namespaces/{namespace}/{resource.plural}"
    return f"{path}/{name}" if name else path


class CredentialFiles:
    """The PEM files written for a kubeconfig's inline credentials; `close()` deletes them.

    kubernetes_asyncio loads certificates and keys only from files, so inline (base64) data is
    written to private temporary files (mode 0600) that live as long as the client using them:
    `Kube.close()`, called from the operator's cleanup and on re-login, closes this too.
    """

    def __init__(self) -> None:
        self._paths: list[str] = []

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._paths)

    def pem(self, path: Any, data: str | bytes | None) -> str | None:
        """The file to give the client: `path` as is, else a new file holding `data`."""
        if path:
            return os.fsdecode(path)
        if not data:
            return None
        raw = data.encode() if isinstance(data, str) else data
        pem = raw if raw.startswith(b"-----BEGIN ") else base64.b64decode(raw)
        with tempfile.NamedTemporaryFile(
            "wb", prefix="radixserve-", suffix=".pem", delete=False
        ) as f:
            self._paths.append(f.name)
            f.write(pem)
        return f.name

    def close(self) -> None:
        """Delete every file written; safe to call more than once."""
        while self._paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._paths.pop())

    def __enter__(self) -> CredentialFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def configuration(info: kopf.ConnectionInfo, files: CredentialFiles) -> Configuration:
    """The client configuration for the same endpoint and credentials kopf logged in with;
    inline PEM data goes to `files`, which the caller closes when the client is closed."""
    cfg = Configuration(host=info.server.rstrip("/"))
    cfg.verify_ssl = not info.insecure
    cfg.ssl_ca_cert = files.pem(info.ca_path, info.ca_data)
    cfg.cert_file = files.pem(info.certificate_path, info.certificate_data)
    cfg.key_file = files.pem(info.private_key_path, info.private_key_data)
    if info.token:
        cfg.api_key = {"BearerToken": info.token}
        cfg.api_key_prefix = {"BearerToken": info.scheme or "Bearer"}
    if info.username:
        cfg.username, cfg.password = info.username, info.password or ""
    return cfg


def is_subset(want: Any, have: Any) -> bool:
    """Every field of `want` is in `have` with the same value (the API adds defaults)."""
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(
            key in have and is_subset(value, have[key]) for key, value in want.items()
        )
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(want) == len(have)
            and all(is_subset(w, h) for w, h in zip(want, have, strict=True))
        )
    return bool(want == have)


def removals(last: Any, desired: Any) -> dict[str, Any]:
    """Merge-patch nulls for the keys we applied last time and no longer want."""
    if not isinstance(last, Mapping) or not isinstance(desired, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in last.items():
        if key not in desired:
            out[key] = None
        elif nested := removals(value, desired[key]):
            out[key] = nested
    return out


def _leave_scaled_replicas(obj: Mapping[str, Any], dropped: dict[str, Any]) -> None:
    """A Deployment whose replicas we set last time and no longer do is scaled by an HPA now:
    its count is the HPA's, not to be nulled (which would drop it to 1 until the HPA acts)."""
    spec = dropped.get("spec")
    if obj.get("kind") == "Deployment" and isinstance(spec, dict) and "replicas" in spec:
        del spec["replicas"]
        if not spec:
            del dropped["spec"]


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def with_last_applied(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), LAST_APPLIED: json.dumps(obj)}
    return {**obj, "metadata": meta}


def owned_by(live: Mapping[str, Any], owner_uid: str) -> bool:
    refs = (live.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in refs)


class Kube:
    """Typed-enough access to the few kinds the operator manages; bodies are plain dicts."""

    def __init__(self, api: ApiClient, files: CredentialFiles | None = None) -> None:
        self.api = api
        self.files = files or CredentialFiles()

    @classmethod
    def connect(cls, info: kopf.ConnectionInfo) -> Kube:
        """A client for `info`; its credential files are deleted by `close()` (or right away
        when the client cannot be built)."""
        files = CredentialFiles()
        try:
            return cls(ApiClient(configuration(info, files)), files)
        except BaseException:
            files.close()
            raise

    async def close(self) -> None:
        """Close the HTTP session and delete the credential files; safe to call twice."""
        try:
            await self.api.close()
        finally:
            self.files.close()

    async def _call(self, method: str, path: str, body: Any = None, patch: bool = False) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = MERGE_PATCH if patch else "application/json"
        return await self.api.call_api(
            path,
            method,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            response_types_map={200: "object", 201: "object", 202: "object"},
            _return_http_data_only=True,
        )

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        """The live object, or None when it does not exist."""
        try:
            return await self._call("GET", _path(api_version, kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def create(self, obj: Mapping[str, Any]) -> Any:
        ns = obj["metadata"]["namespace"]
        return await self._call("POST", _path(obj["apiVersion"], obj["kind"], ns), dict(obj))

    async def patch(self, ref: Mapping[str, Any], patch: Mapping[str, Any], sub: str = "") -> Any:
        meta = ref["metadata"]
        path = _path(ref["apiVersion"], ref["kind"], meta["namespace"], meta["name"])
        return await self._call("PATCH", f"{path}/{sub}" if sub else path, dict(patch), True)

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete (children go in the background); False when it was already gone."""
        try:
            await self._call("DELETE", _path(api_version, kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def apply(self, obj: Mapping[str, Any], owner_uid: str) -> str:
        """Create or patch one child so it matches `obj`: 'created', 'patched' or 'unchanged'."""
        desired = with_last_applied(obj)
        meta = obj["metadata"]
        live = await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if live is None:
            try:
                await self.create(desired)
                return "created"
            except ApiException as exc:
                if exc.status != 409:  # created meanwhile (e.g. by a concurrent resync)
                    raise
            live = await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if live is None:
            raise kopf.TemporaryError(f"{obj['kind']} {meta['name']} vanished during apply", 1)
        if not owned_by(live, owner_uid):
            raise ForeignObjectError(
                f"{obj['kind']} {meta['name']} already exists and is not owned by this "
                "InferenceService; delete or rename it"
            )
        annotations = (live.get("metadata") or {}).get("annotations") or {}
        last = json.loads(annotations.get(LAST_APPLIED, "{}"))
        dropped = removals(last, obj)
        _leave_scaled_replicas(obj, dropped)
        if not dropped and is_subset(desired, live):
            return "unchanged"
        await self.patch(obj, _merge(desired, dropped))
        return "patched"

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Any:
        meta = {"namespace": namespace, "name": name}
        ref = {**INFERENCE_SERVICE.type_meta(), "metadata": meta}
        return await self.patch(ref, {"status": dict(status)}, sub="status")
