"""User-facing errors, shown as one line (no traceback unless --debug), and the helpers
their messages use. The ground floor: it imports nothing of exoframe, so every layer (the
network model included) can raise them."""
from __future__ import annotations

import difflib


class ExoframeError(Exception):
    """An error caused by the user's input or environment, with a message that says the fix.
    details: what the command line shows above the message when the error is not the
    user's, or with --debug (a child process's traceback); user_error: the input or the
    environment is at fault (exit code 2), else exoframe or the user's own code (1)."""
    details: str | None = None  # (also of a subclass whose __init__ does not pass them on)
    user_error: bool = True

    def __init__(self, message: str = "", *, details: str | None = None,
                 user_error: bool = True):
        super().__init__(message)
        self.details = details
        self.user_error = user_error

    def __reduce__(self):
        """Pickled (a sweep's run on Ray): made again with its message and fields, whatever
        its class's __init__ takes."""
        return _unpickled, (type(self), self.args), self.__dict__


def _unpickled(cls, args):
    return cls.__new__(cls, *args)  # (pickle then gives it its fields: __reduce__'s dict)


class RunInterrupted(ExoframeError):
    """A run stopped by a stop signal (Ctrl-C, SIGTERM, SIGHUP): exit code 130.
    names_checkpoint: the message already says which checkpoint `exoframe resume` goes on
    from."""

    def __init__(self, message: str, *, names_checkpoint: bool = False):
        super().__init__(message)
        self.names_checkpoint = names_checkpoint


class RunStopped(ExoframeError):
    """A run that stopped once its ranks were started, raised `from` the error that stopped
    it, whose message, details and user_error it takes (the message amended where the run's
    folder says more: the checkpoint to resume from). status: "failed" or "interrupted";
    rows: every step the run finished (metrics rows), so that a caller without a run folder
    still has them."""

    def __init__(self, message: str, *, status: str, rows: list, details: str | None = None,
                 user_error: bool = True, names_checkpoint: bool = False):
        super().__init__(message, details=details, user_error=user_error)
        self.status = status
        self.rows = rows
        self.names_checkpoint = names_checkpoint

    @classmethod
    def of(cls, cause: ExoframeError, status: str, rows: list) -> "RunStopped":
        """The RunStopped of the error that stopped the run, to raise `from` it."""
        return cls(str(cause), status=status, rows=rows, details=cause.details,
                   user_error=cause.user_error,
                   names_checkpoint=isinstance(cause, (RunInterrupted, RunStopped))
                   and cause.names_checkpoint)

    @property
    def interrupted(self) -> bool:
        return self.status == "interrupted"


def did_you_mean(name, known):
    """' Did you mean 'x'?' for the closest known name, or ''."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.5)
    return f" Did you mean '{close[0]}'?" if close else ""


def unknown_name_error(kind, name, known):
    known = sorted(known)
    return ExoframeError(
        f"unknown {kind} '{name}'.{did_you_mean(name, known)} Known: {', '.join(known)}."
    )


MAX_SHOWN = 200  # characters of a user's value quoted in a message


def shorten(value, limit: int = MAX_SHOWN) -> str:
    """repr(value), cut to `limit` characters: a message quotes input, it must not echo a
    megabyte of it (a YAML alias bomb expands 400 bytes into 58 MB)."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


__all__ = ["ExoframeError", "RunInterrupted", "RunStopped", "did_you_mean", "shorten",
           "unknown_name_error", "MAX_SHOWN"]
