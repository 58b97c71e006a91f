"""The detokenizer process: incremental detokenization of each request's token stream."""
