"""Concrete backends, loaded by name through the ``fiberexec.backends`` entry-point group."""
