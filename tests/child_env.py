"""The environment of every process the tests start: this process's own, minus the variables
that are the test process's business only.

`TRITON_INTERPRET=1` is one: tests/conftest.py sets it (on a machine without CUDA) so that the
kernel tests run Triton's interpreter in this process. An engine, router, bench or soak run
the tests start must run as it would when deployed: inheriting the variable, an engine would
pick the interpreted Triton paths on the CPU (orders of magnitude slower) or interpret its
kernels on a GPU instead of compiling them. tests/architecture/test_child_env.py holds every
process launch under tests/ to this helper.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TEST_ONLY_VARS = frozenset({"TRITON_INTERPRET"})


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of os.environ without TEST_ONLY_VARS, then `extra` on top (a test that means a
    child to have one of them says so there)."""
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_VARS}
    env.update(extra or {})
    return env
