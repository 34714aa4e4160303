"""Build script for tools that still run ``setup.py``: every setting (dependencies, their version ranges, extras,
console scripts) is in pyproject.toml."""

from setuptools import setup

setup()
