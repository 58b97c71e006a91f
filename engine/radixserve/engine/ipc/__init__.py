"""Inter-process messages (msgspec structs, no pickle) and typed ZMQ channels."""
