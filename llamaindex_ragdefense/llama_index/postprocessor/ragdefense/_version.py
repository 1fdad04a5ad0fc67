"""The version: written here only, read by the build and by ``__version__``."""

__version__ = "0.2.0"
