"""Capturing a model server's raw HTTP replies below the openai SDK: bench/record_server.py
records real servers with it, and tests check FakeOpenAI's replay against it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2


class _Tap(httpx2.SyncByteStream):
    """Passes a response's bytes on unchanged and keeps each chunk as it came."""

    def __init__(self, inner: httpx2.SyncByteStream, kept: list[bytes]) -> None:
        self.inner, self.kept = inner, kept

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            self.kept.append(bytes(chunk))
            yield chunk

    def close(self) -> None:
        self.inner.close()


class Recording(httpx2.BaseTransport):
    """A transport that records the last response's status, content type and raw chunks."""

    def __init__(self) -> None:
        self.inner = httpx2.HTTPTransport()
        self.status = 0
        self.content_type = ""
        self.chunks: list[bytes] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self.inner.handle_request(request)
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "")
        self.chunks = []
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_Tap(response.stream, self.chunks),
            request=request,
            extensions=response.extensions,
        )

    def close(self) -> None:
        self.inner.close()
