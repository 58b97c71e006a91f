"""radixserve: Kubernetes-native LLM serving (engine, cache-aware router, operator).

This top-level package holds only the command line and the wire contracts shared by engine
and router (`radixserve.protocol`); it imports no torch.
"""

__version__ = "0.1.0"
