"""The names the operator checks InferenceService specs against, written by the components
that define them: the choices of every `radixserve serve` and `radixserve router` flag that
has choices (ServerArgs' and RouterConfig's field metadata; the routing policies are the keys
of the router's policy registry). The operator may import neither component, so it reads them
from the committed file this writes:

    python -m radixserve.golden_names > operator/radixserve/operator/flag_choices.json

tests/operator/test_flag_choices.py fails when that file differs from what this writes.
"""

from __future__ import annotations

import json
import sys

from radixserve.config_options import flag_choices
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.router.config import RouterConfig


def render() -> str:
    """The golden file's text: `{"engine": {"--flag": [names]}, "router": {...}}`."""
    golden = {"engine": flag_choices(ServerArgs), "router": flag_choices(RouterConfig)}
    return json.dumps(golden, indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
