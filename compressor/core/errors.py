"""One error hierarchy: every error this project raises on purpose is a `CompressorError`.

The CLI prints a `CompressorError` as one line on stderr (no traceback unless `--debug`) and exits
with its `exit_code`: 2 when the input is wrong (a recipe, a file, an option, a model this project
cannot handle), 1 when work that had started failed. The subclasses that describe bad values
also derive from ValueError (LookupError for names), so code that caught those keeps working.
"""

from __future__ import annotations


def first_line(error: BaseException) -> str:
    """The first line of a library's error message (its type name when it has none): enough for a
    one-line error that says what the library refused."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class CompressorError(Exception):
    """Base of every error raised on purpose by compressor; the message names file, key and expectation."""

    exit_code = 1

    def at(self, where: str) -> CompressorError:
        """The same kind of error, its message prefixed by `where` (a file, a key path)."""
        return type(self)(f"{where}: {self}")


class InputError(CompressorError):
    """Something the user gave is wrong: found before (or instead of) doing the work."""

    exit_code = 2


class RecipeError(InputError, ValueError):
    """A recipe that cannot run: names the file and key path."""


class OptionError(InputError, ValueError):
    """A plugin option (pruner, merger, importance) with a value the plugin does not accept."""


class MetricInputError(InputError, ValueError):
    """Arrays given to a metric or score that are not what it takes (shape, probabilities, labels)."""


class PluginError(InputError, LookupError):
    """A plugin name that cannot be resolved, or an import path that is not the kind asked for."""


class MaskError(InputError, ValueError):
    """A head mask that does not fit the model it is applied to."""


class WeightsError(InputError, ValueError):
    """A weights file that is missing, corrupt or does not fit the model."""


class ExportError(InputError, ValueError):
    """An export folder that cannot be loaded."""


class UnsupportedModelError(InputError, NotImplementedError):
    """A model whose family (or whose architecture, for a merger) this project does not handle."""


class WorkError(CompressorError, RuntimeError):
    """Work that had started failed (for example a step that found nothing to act on)."""
