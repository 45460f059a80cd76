"""User-facing errors, shown as one line (no traceback unless --debug), and the helpers
their messages use. The ground floor: it imports nothing of exoframe, so every layer (the
network model included) can raise them."""
from __future__ import annotations

import difflib


class ExoframeError(Exception):
    """An error caused by the user's input or environment, with a message that says the fix."""


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


__all__ = ["ExoframeError", "did_you_mean", "shorten", "unknown_name_error", "MAX_SHOWN"]
