"""The ``attnlab`` command line: one module per command, an explicit command table in
:mod:`~attnlab.cli.app`, shared argument parsers in :mod:`~attnlab.cli.args`.
"""

from .app import main

__all__ = ["main"]
