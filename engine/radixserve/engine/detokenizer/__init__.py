"""The detokenizer process: incremental detokenization of each request's tokens; stop strings."""
