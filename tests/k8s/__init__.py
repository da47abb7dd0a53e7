"""Kubernetes adapter tests and the API server emulator they run against."""
