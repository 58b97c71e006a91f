"""Cache-aware router: mirrors replica radix trees from KV events; imports no torch."""
