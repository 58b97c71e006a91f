"""Cache-aware router: mirrors its workers' radix trees from KV events; imports no torch."""
