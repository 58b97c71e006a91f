"""Entry points of a replica (main process): the HTTP server and its routes, the offline
`Engine` and `EngineCore`, and the edge's request validation and output formatting."""
