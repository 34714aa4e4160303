"""The package's version, on the lowest floor so that every module can read it without importing the package root."""

__version__ = "0.1.0"
