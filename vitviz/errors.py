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


class ViewNotApplicable(ValueError):
    """A view that does not apply to this model (position-embedding similarity of a model without a learned
    absolute position embedding, patch filters of a convolutional stem). Its message says why in one
    sentence; the UI shows it as information, not as an error."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """``Type: the first line of its message`` for a sentence; exceptions with an empty message have one too."""
    lines = str(exc).splitlines()
    message = lines[0][:limit] if lines else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
