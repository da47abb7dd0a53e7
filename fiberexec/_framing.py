"""Frames on a byte stream, each ``length | frame`` (the length a 4-byte unsigned integer,
`HEADER`): the one framing of the local link, the TCP link and the multiprocessing layer's
connections, and how each cuts what it reads.

One ``recv`` takes in every frame that has arrived. With nothing held, what it brings is
most often one whole frame, handed out as it came (sliced once), or a few, each copied out
once; only a frame still arriving is kept, in one buffer read into in place
(``recv_into``) until it is whole. The buffer is made the first time a frame comes in
pieces: a stream whose frames come whole, one or several at a time, never has one (an
executor with a thousand workers keeps no 64 KiB per worker that it never reads into).
"""

from __future__ import annotations

import socket
import struct

from fiberexec._errors import ProtocolError

CHUNK = 64 << 10  # bytes one recv asks for, at least
KEPT = 512 << 10  # a read buffer grown past this (by a long frame) is let go once emptied
HEADER = struct.Struct("!I")  # a frame's length, before it
MAX_FRAME = (1 << 32) - 1  # the longest frame its header can say


def framed(frame: bytes) -> list[bytes]:
    """``frame`` with its header, as the two parts to send."""
    return [HEADER.pack(len(frame)), frame]


class FrameBuffer:
    """Bytes read from a stream, cut into frames of ``length | frame``; a frame over
    ``max_frame`` bytes (at most `MAX_FRAME`) is a `ProtocolError`.

    A frame longer than the buffer grows it to the frame's size for as long as it takes to
    arrive; a buffer grown past `KEPT` is let go once emptied, so a peer that sent one
    large result keeps no more.
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = min(max_frame, MAX_FRAME)
        self._start = 0  # the first byte not yet cut into a frame
        self._end = 0  # the end of what has been read
        self.drained = False  # the last read emptied the socket
        self._use(bytearray())  # (made at its first use: `_make_room`)

    def _use(self, buf: bytearray) -> None:
        # A buffer is never resized (a larger one replaces it), so one view of it serves
        # every read and cut, with no view made per call.
        self._buf, self._view = buf, memoryview(buf)

    def read(self, sock: socket.socket, flags: int = 0) -> list[bytes] | None:
        """One ``recv`` into the buffer, then every whole frame it holds, in order; None
        once the stream has ended. `drained` tells whether that read emptied the socket (it
        took less than it asked for)."""
        pos, end = self._start, self._end
        head, unpack = HEADER.size, HEADER.unpack_from
        if pos == end:  # nothing held: most often, what comes is one whole frame
            data = sock.recv(CHUNK, flags)
            n = len(data)
            if not n:
                return None
            self.drained = n < CHUNK
            if n >= head and head + unpack(data)[0] == n and n - head <= self.max_frame:
                return [data[head:]]
            # Several frames (a result and a report sent after it): cut straight from what
            # came; only a frame still arriving is kept (a connection whose frames come
            # whole, however many at once, never makes a buffer)
            out: list[bytes] = []
            pos = self._cut(data, memoryview(data), 0, n, out)
            if pos < n:
                self._keep(data, pos)
            return out
        else:
            want = CHUNK
            if end - pos >= head:  # the rest of a long frame, in one read
                want = max(CHUNK, head + unpack(self._buf, pos)[0] - (end - pos))
            if len(self._buf) - end < want:
                self._make_room(want)
                pos, end = 0, self._end
            n = sock.recv_into(self._view[end:], want, flags)
            if not n:
                return None
            self.drained = n < want
            end += n
        out = []
        pos = self._cut(self._buf, self._view, pos, end, out)
        if pos == end:
            pos = end = 0
            if len(self._buf) > KEPT:
                self._use(bytearray(CHUNK))
        self._start, self._end = pos, end
        return out

    def _cut(self, buf: bytes | bytearray, view: memoryview, pos: int, end: int,
             out: list[bytes]) -> int:
        """Append each whole frame of ``buf[pos:end]`` to ``out``; where the first
        incomplete one starts (``end``: none)."""
        head, unpack = HEADER.size, HEADER.unpack_from
        while end - pos >= head:
            (size,) = unpack(buf, pos)
            if size > self.max_frame:
                raise ProtocolError(f"{size}-byte frame exceeds max_message_size={self.max_frame}")
            if end - pos - head < size:
                break
            pos += head
            out.append(bytes(view[pos : pos + size]))
            pos += size
        return pos

    def _keep(self, data: bytes, pos: int) -> None:
        """Hold ``data[pos:]`` (a frame still arriving), read with nothing held, at the
        buffer's start."""
        rest = len(data) - pos
        if len(self._buf) < rest:
            self._make_room(rest)
        self._view[:rest] = memoryview(data)[pos:]
        self._start, self._end = 0, rest

    def held_bytes(self) -> int:
        """The size of the read buffer this reader keeps (0 until a frame came in pieces)."""
        return len(self._buf)

    def _make_room(self, want: int) -> None:
        """A buffer with ``want`` bytes free after what is held (moved to its start)."""
        have = self._end - self._start
        grown = bytearray(max(CHUNK, have + want))
        grown[:have] = self._view[self._start : self._end]
        self._use(grown)
        self._start, self._end = 0, have
