#!/usr/bin/env bash
# Install the router peer that docs/benchmarks.md compares radixserve's router against:
# sglang-router 0.3.2 (SGLang's Rust router, from PyPI) in its own venv in a scratch folder.
#
#   PEERS_DIR=/some/scratch scripts/peers/setup_sglang_router.sh
#
# Then `bench router` runs it as a peer with
#   --peer-name sglang-router --peer-router-cmd "$PEERS_DIR/venv_sglr/bin/python -m \
#       sglang_router.launch_router --worker-urls {worker_urls} --port {port} --policy cache_aware"
set -euo pipefail
: "${PEERS_DIR:?set PEERS_DIR to a scratch folder outside the checkout}"
mkdir -p "$PEERS_DIR"
cd "$PEERS_DIR"
[[ -x venv_sglr/bin/python ]] || python3 -m venv venv_sglr
venv_sglr/bin/pip install -q sglang-router==0.3.2
echo "sglang-router ready: $PEERS_DIR/venv_sglr/bin/python -m sglang_router.launch_router"
