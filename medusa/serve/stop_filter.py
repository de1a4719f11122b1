"""Stop strings over streamed text."""

from __future__ import annotations

from medusa.serve.async_engine import Output


class StopFilter:
    """Holds back text that may be the start of a stop string; cuts the text at a stop."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, out: Output) -> str:
        if self.stopped:
            return ""
        # NOTE: only where a stop can begin that was not searched before: the new text and the
        # `hold` characters before it (searching all of it again at each token is quadratic).
        start = max(0, len(self.text) - self.hold)
        self.text += out.text
        for s in self.stops:
            i = self.text.find(s, start)
            if i >= 0:
                self.text, self.stopped = self.text[:i], True
        end = len(self.text) if self.stopped else max(self.sent, len(self.text) - self.hold)
        piece, self.sent = self.text[self.sent : end], end
        return piece

    def flush(self) -> str:
        piece, self.sent = self.text[self.sent :], len(self.text)
        return piece
