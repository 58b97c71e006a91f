"""Fixtures for the chart and manifest tests: the CRD as the operator engineer wrote it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.render import CRD_SOURCE
from tests.deploy.validate import load_crd


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    if not CRD_SOURCE.exists():
        pytest.fail(f"{CRD_SOURCE} is missing: the InferenceService CRD is the oracle here")
    return load_crd(CRD_SOURCE)
