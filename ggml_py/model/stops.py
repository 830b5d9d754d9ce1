"""Stop strings: where generated text ends when the model writes one of them."""


def stop_strings(stop):
    """generate's stop argument (None, a str, or a list/tuple of str) as a tuple of
    non-empty strings; TypeError or ValueError naming what is wrong."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise TypeError(f"stop must be a str or a list of str, got {stop!r}")
    if not all(stops):
        raise ValueError("stop strings must not be empty")
    return tuple(stops)


class StopFilter:
    """Text pieces in, text out up to the earliest place a stop string starts. Text that
    could be the start of a stop string is held back until later pieces settle it, so
    the cut does not depend on how the text was split into pieces.

    feed(piece) -> text now final; .stopped is True once a stop string was found (the
    stop and what follows are dropped, later pieces ignored); flush() -> what was held.
    .cut: a stop string was found (by feed or by flush).
    """

    def __init__(self, stops):
        self.stops, self.held, self.stopped, self.cut = stops, "", False, False

    def feed(self, piece):
        """The text of piece (and what was held) now known to come before any stop."""
        if self.stopped or not self.stops:
            return "" if self.stopped else piece
        self.held += piece
        found, open_at = _first_stop(self.held, self.stops), _first_partial_stop(self.held, self.stops)
        if found is not None and (open_at is None or found <= open_at):
            self.stopped = self.cut = True
            out, self.held = self.held[:found], ""
            return out
        safe = len(self.held) if open_at is None else open_at   # a later stop may still start there
        out, self.held = self.held[:safe], self.held[safe:]
        return out

    def flush(self):
        """The end of the text: what was held back (up to a stop inside it)."""
        if self.stopped:
            return ""
        self.stopped = True
        out, self.held = self.held, ""
        found = _first_stop(out, self.stops)
        self.cut = found is not None
        return out[:found]


def until_stop(pieces, stops):
    """The text of pieces up to the earliest place a stop string starts (the stop and
    what follows are dropped, and the iteration ends there); see StopFilter."""
    f = StopFilter(stops)
    for piece in pieces:
        text = f.feed(piece)
        if text:
            yield text
        if f.stopped:
            return
    rest = f.flush()
    if rest:
        yield rest


def _first_stop(text, stops):
    """Where the earliest stop string in text starts, or None."""
    return min((i for i in (text.find(s) for s in stops) if i >= 0), default=None)


def _first_partial_stop(text, stops):
    """The earliest i where text[i:] is the beginning of a stop string (not all of it), or None."""
    longest = max(map(len, stops))
    for i in range(max(0, len(text) - longest + 1), len(text)):
        tail = text[i:]
        if any(len(tail) < len(s) and s.startswith(tail) for s in stops):
            return i
    return None
