"""Processes: the Temporal worker, the intake controller, the CLI and their configuration."""
