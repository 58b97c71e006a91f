"""The main process's request side: TokenizerManager, the DP controller, metrics, the request
log, and the GenerateInput/GenerateChunk types the HTTP edge builds and reads."""
