"""A simulated cluster: a Kubernetes API emulator served over real HTTP, and (on top of it) a
small control plane and kubelet model. The tests, the demo and the benchmarks talk to it with the
official ``kubernetes`` client exactly as they would talk to a real API server.
"""
