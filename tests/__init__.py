"""The test suite. ``CLUSTER``: the name of the cluster the tests' engines serve (each process
of the engine serves one cluster of a fleet)."""

CLUSTER = "test"
