"""What a command's argument chooses: an output's format by name or extension, a value's type, an input's shape."""

from ..formats.numpy import cast_for
from ..formats.origin import written_type
from ..formats.targets import chosen_format, output_target
from ..forward.deploy import parse_shape

__all__ = ["cast_for", "chosen_format", "output_target", "parse_shape", "written_type"]
