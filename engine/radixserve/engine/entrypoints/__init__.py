"""Entry points of a replica: the offline Engine (and, later, the HTTP server)."""
