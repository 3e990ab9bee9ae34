"""Errors a user can cause. Their message is a sentence the UI and the CLI show as is."""


class VitvizError(Exception):
    """Base class: a problem with the user's input or setup, not a bug in vitviz."""


class ImageError(VitvizError):
    """An image file that cannot be used.

    Args:
        name: the file name as the user knows it.
        reason: why it cannot be used, as a sentence fragment.
    """

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason
        super().__init__(f"{name}: {reason}")


class ModelError(VitvizError):
    """A model, checkpoint or setting that cannot be loaded or used."""


# The classes below are also ValueErrors, so that a caller catching ValueError at these sites catches them too.
class ModelNotSupported(ModelError, ValueError):
    """A model whose family or input vitviz cannot read (no adapter for its class, a token layout or input
    size it does not understand)."""


class ViewNotApplicable(VitvizError, ValueError):
    """A view that does not apply to this model (position-embedding similarity of a model without a learned
    absolute position embedding, patch filters of a convolutional stem, a class-token view of a model without
    one, a head-gradient method of a model without a classifier). Its message says why in one sentence; the
    UI shows it as information, not as an error."""


class MethodError(VitvizError, ValueError):
    """A map method that is unknown, or does not apply to the model (the sentence says why)."""


class OptionError(VitvizError, ValueError):
    """An option's value outside what it accepts: a name not among its choices (a format, a fusion, a
    protocol), a number out of its range (a layer, head, class or token index, a fraction, a count)."""


class FileContentError(VitvizError, ValueError):
    """A file the user gave whose content cannot be used (a registers.json of another model, a Parquet list
    without a path column). Its message is a sentence fragment the caller puts after the file's name."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: the first line of its message`` for a sentence; exceptions with an empty message have one too."""
    lines = str(exc).splitlines()
    message = lines[0][:limit] if lines else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


# How to give a headless model classes, in a notebook's and a terminal's words; the app passes its own (the sidebar's
# Head box), so the screen shows no code.
GIVE_A_HEAD = "a probe file: vitviz.open(..., head='probe.safetensors'), --head, or the app's Head box"
