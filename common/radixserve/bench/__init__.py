"""`radixserve bench …`: benchmarks that print a table and write JSON (offline, serving, router)."""
