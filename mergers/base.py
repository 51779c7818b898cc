"""The Merger interface (defined in the core, `compressor.plugins`), for plugin authors' imports."""

from compressor.plugins import Merger

__all__ = ["Merger"]
