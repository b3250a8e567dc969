"""Deterministic code only: the RollbackWorkflow and the pure core it drives.

Nothing in this package performs I/O or reads the wall clock; ``import-linter`` (see
``pyproject.toml``) fails CI if a module here imports ``kubernetes``, ``activities``, ``worker``
or an I/O library. That keeps every module safe to import inside Temporal's workflow sandbox.
"""
