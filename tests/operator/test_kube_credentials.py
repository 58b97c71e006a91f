"""The operator's API client and the PEM files it writes for inline kubeconfig credentials:
none is left behind once the client is closed (by the operator's cleanup or a re-login)."""

from __future__ import annotations

import asyncio
import base64
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kopf
import pytest

from radixserve.operator.config import OperatorConfig
from radixserve.operator.handlers import Runtime
from radixserve.operator.kube import CredentialFiles, Kube


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a throwaway self-signed certificate (it is its own CA)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    out = tmp_path_factory.mktemp("pki")
    cert, key = out / "cert.pem", out / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-subj", "/CN=radixserve-test", "-keyout", str(key),
         "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert.read_bytes(), key.read_bytes()


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where `tempfile` puts new files during the test (so the test sees exactly those)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _inline_info(cert: bytes, key: bytes) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(
        server="https://127.0.0.1:6443",
        ca_data=base64.b64encode(cert),  # kubeconfig style: base64 of the PEM
        certificate_data=cert,  # already PEM
        private_key_data=base64.b64encode(key).decode(),
    )


def test_close_deletes_the_pem_files(temp_dir: Path, self_signed: tuple[bytes, bytes]) -> None:
    async def scenario() -> None:
        kube = Kube.connect(_inline_info(*self_signed))
        written = sorted(temp_dir.iterdir())
        assert len(written) == 3 and all(p.suffix == ".pem" for p in written)
        assert sorted(Path(p) for p in kube.files.paths) == written
        assert written[0].stat().st_mode & 0o077 == 0  # private to the operator
        await kube.close()
        assert list(temp_dir.iterdir()) == []
        await kube.close()  # twice is harmless

    asyncio.run(scenario())


def test_operator_cleanup_and_relogin_leave_no_file(
    temp_dir: Path, self_signed: tuple[bytes, bytes]
) -> None:
    def login(**_: Any) -> kopf.ConnectionInfo:
        return _inline_info(*self_signed)

    async def scenario() -> None:
        runtime = Runtime(OperatorConfig(), login=login)
        await runtime.login()
        await runtime.login()  # a re-login replaces the client: the old files go with it
        assert len(list(temp_dir.iterdir())) == 3
        await runtime.cleanup()
        assert list(temp_dir.iterdir()) == []

    asyncio.run(scenario())


def test_a_failed_connect_leaves_no_file(temp_dir: Path) -> None:
    info = kopf.ConnectionInfo(server="https://127.0.0.1:6443", ca_data=b"-----BEGIN junk")

    async def scenario() -> None:
        with pytest.raises(ssl.SSLError):  # the CA file holds no certificate
            Kube.connect(info)

    asyncio.run(scenario())
    assert list(temp_dir.iterdir()) == []


def test_paths_given_by_the_kubeconfig_are_used_as_is(temp_dir: Path) -> None:
    with CredentialFiles() as files:
        assert files.pem("/etc/ca.pem", b"ignored") == "/etc/ca.pem"
        assert files.pem(None, None) is None
        assert files.paths == ()
    assert list(temp_dir.iterdir()) == []
