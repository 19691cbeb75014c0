"""A small Server-Sent Events reader: (event, data) pairs from the bytes of a stream, given
in pieces of any size; comments (keep-alives) are skipped.

Lines are split as the SSE format says, by CRLF, LF or CR alone, and by nothing else:
``str.splitlines`` (and so httpx's ``iter_lines``) also splits on U+2028, U+0085 and
others, which JSON data carries unescaped.
"""

from __future__ import annotations

import codecs
import re

_LINE_END = re.compile(r"\r\n|\r|\n")


class SseReader:
    def __init__(self) -> None:
        # The format is UTF-8 whatever the headers say; the incremental decoder holds a
        # character split between pieces.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._started = False
        self._partial = ""
        # The last piece ended in CR: its line is out already, and an LF opening the next
        # piece is the rest of that CRLF, not an empty line (which would end the event).
        self._after_cr = False
        self._event = "message"
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """The events that this piece of the stream completes."""
        events: list[tuple[str, str]] = []
        for line in self._lines(self._decoder.decode(chunk)):
            if line == "":
                if self._data:
                    events.append((self._event, "\n".join(self._data)))
                self._event, self._data = "message", []
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "event":
                    self._event = value
                elif name == "data":
                    self._data.append(value)
        return events

    def _lines(self, text: str) -> list[str]:
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")  # one byte order mark may open the stream
        if not text:
            return []
        start = 1 if self._after_cr and text.startswith("\n") else 0
        self._after_cr = False
        lines = []
        for end in _LINE_END.finditer(text, start):
            lines.append(self._partial + text[start : end.start()])
            self._partial = ""
            start = end.end()
            # A CR at the end may be half a CRLF; the line is complete either way, so it
            # goes out now rather than waiting for the next piece (seconds away).
            if start == len(text) and end.group() == "\r":
                self._after_cr = True
        self._partial += text[start:]
        return lines
