"""The package version (its own module, so that importing it runs nothing else)."""

__version__ = "0.1.0"
