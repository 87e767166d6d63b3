"""The click types of the commands' input and output paths (a leaf: options and completion both use them)."""

from __future__ import annotations

import click

__all__ = ["INPUT", "OUTPUT"]

# An input path: checked by blobtool when it is opened, not by click, so that
# a folder or an unreadable file is exit 3 (bad input) with blobtool's one
# line, whichever command reads it.
INPUT = click.Path(allow_dash=True, readable=False)
# An output path: not a folder; a write-only FIFO or device is fine.
OUTPUT = click.Path(dir_okay=False, allow_dash=True, readable=False)
