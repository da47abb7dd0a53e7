from tests.testbed.fixtures import healthy_links, lab

__all__ = ["healthy_links", "lab"]
