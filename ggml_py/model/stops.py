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


def until_stop(pieces, stops):
    """The text of pieces up to the earliest place a stop string starts (the stop and
    what follows are dropped, and the iteration ends there). Text that could be the
    start of a stop string is held back until the next pieces settle it, so the cut
    does not depend on how the text was split into pieces."""
    held = ""
    for piece in pieces:
        held += piece
        found, open_at = _first_stop(held, stops), _first_partial_stop(held, stops)
        if found is not None and (open_at is None or found <= open_at):
            if found:
                yield held[:found]
            return
        safe = len(held) if open_at is None else open_at   # a later stop may still start there
        if safe:
            yield held[:safe]
            held = held[safe:]
    found = _first_stop(held, stops)
    if held[:found]:
        yield held[:found]


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
