"""Wire contracts shared by engine and router (KV events, block hashing); imports no torch."""
