"""The package version, in a module of its own: anything may import it without loading the rest of bertflow."""

__version__ = "0.1.0"
