"""The package's version, in a module of its own so that any module can read it without
importing the whole package (pyproject.toml states the same number; a test keeps them equal)."""

__version__ = "0.19.1"
