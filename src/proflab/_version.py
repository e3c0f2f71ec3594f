"""proflab's version, in a module of its own: the package's modules read it from here, never
from ``proflab/__init__.py``, which sits above every layer (it names the public API)."""

__version__ = "0.1.0"
