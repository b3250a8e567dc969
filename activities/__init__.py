"""Every side effect of the engine: Kubernetes reads and writes, events, owner state."""
