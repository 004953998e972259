"""The model adapter: Chat Completions with native function calling through the openai SDK."""

from __future__ import annotations

import itertools
import json
import math
import random
import ssl
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx2  # the SDK's transport, not the SDK (worker/connections/oauth.py loads it too)
import structlog

from worker import metrics
from worker.deadline import CutOffSink, Overdue, within
from worker.model_base import NO_MODEL as NO_MODEL
from worker.model_base import POOL_THREADS as POOL_THREADS
from worker.model_base import Model as Model
from worker.model_base import ModelError as ModelError
from worker.model_base import ModelErrorKind as ModelErrorKind
from worker.model_base import ModelNotConfigured as ModelNotConfigured
from worker.model_base import Sampling as Sampling
from worker.model_base import Spent as Spent
from worker.model_base import TokensKnown as TokensKnown
from worker.model_base import Watch as Watch
from worker.model_base import encode_body
from worker.model_base import pools_for as pools_for
from worker.streaming import TextSink, TurnAccumulator
from worker.turns import ModelTurn, as_list, get_field, read_turn

if TYPE_CHECKING:
    # Imported where a request is made, not with this module: a process that never calls the
    # model (the bot) does not load the SDK (~19 MiB a process), only its name (`.model`).
    import openai
    from openai._types import RequestOptions

log = structlog.get_logger(__name__)

DEADLINE_GRACE = 0.25  # seconds past a call's timeout before it is given up (worker.deadline)

CHAT_PATH = "/chat/completions"  # under the client's base URL, as the SDK's create() posts
NOT_JSON = "the model server's reply was not a JSON object"
NOT_JSON_CHUNK = "the model server's streamed reply had a part that was not JSON"


class _Failed(Exception):
    """One attempt failed: why, whether another may help, after how long, what it cost."""

    def __init__(
        self,
        error: ModelError,
        *,
        retryable: bool,
        spent: Spent = Spent(),
        retry_after: float | None = None,
    ) -> None:
        super().__init__(error.detail)
        self.error, self.retryable, self.spent = error, retryable, spent
        self.retry_after = retry_after


class ModelClient:
    """One client per process. A model step has one deadline (`timeout` per `complete`):
    the first attempt and its retries share it. The retries are ours, not the SDK's (its
    own are off), so each one is seen as it happens (`Watch`) and none starts after the
    deadline; which failures are retried, and how long to wait first, are the SDK's rules
    (408/409/429/5xx unless `x-should-retry` says otherwise, connection errors, `Retry-After`)."""

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None,
        base_url: str | None,
        timeout: float = 60.0,
        max_retries: int = 2,
        read_timeout: float = 0.0,
        sampling: Sampling | None = None,
        watch_every: float = 5.0,
        pools: int = 1,
    ) -> None:
        if not api_key and not base_url:
            raise ModelNotConfigured(NO_MODEL)
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.read_timeout = read_timeout  # 0: an attempt may take what is left of the step
        self.sampling = sampling or Sampling()
        self.watch_every = watch_every
        self.pools = max(1, pools)
        if base_url:  # a URL that does not parse stops the process now, not at its first call
            httpx2.URL(base_url)
        # made at first use, and shared with this client's copies (`Runtime.model_for`)
        self._clients = _Clients(
            api_key or "not-needed", base_url, timeout, max_retries, self.pools
        )
        self._next_pool = itertools.count()
        self._thread = threading.local()

    @property
    def client(self) -> openai.OpenAI:
        """The SDK's client: other requests (the model list, embeddings) and the first pool."""
        return self._clients.made()[0]

    @client.setter
    def client(self, client: openai.OpenAI) -> None:
        """Replaces the first pool's client, for this client and its copies; every request
        goes through the clients from then on (a replaced one is there to see the traffic)."""
        self._clients.made()[0] = client
        self._clients.replaced()

    @property
    def embeddings(self) -> Any:
        """The SDK's embeddings (the demonstrations' embeddings selector): the SDK is loaded
        by the first text embedded, not when the selector is built (in the bot, never)."""
        return self.client.embeddings

    @property
    def server(self) -> str:
        """Where the model server is, as logs may say it: host and port, never the key (a
        header) nor anything else of the URL (a proxy's credentials, a query)."""
        url = self.client.base_url
        return f"{url.host}:{url.port}" if url.port else str(url.host)

    @property
    def server_url(self) -> str:
        """... and as people read it in an error: with the scheme and path, still no more."""
        url = self.client.base_url
        return f"{url.scheme}://{self.server}{url.path.rstrip('/')}"

    def check(self, timeout: float = 5.0) -> bool:
        """At start-up: one GET /models, no retries. Warns, and never raises, when the server
        cannot be reached, refuses, or does not list the configured model; a process starts
        either way (the server may come up later), but an operator reads why runs will fail."""
        try:
            listed = self._listed(timeout)
        except ModelError as exc:
            self._failed(exc, "model_server_check_failed")
            return False
        if listed and self.model not in listed:
            log.warning(
                "model_not_listed", server=self.server, model=self.model, listed=len(listed)
            )
            return False
        log.info("model_server_ok", server=self.server, model=self.model)
        return True

    def probe(self, timeout: float = 5.0) -> str | None:
        """As `check`, for a report (`switchboard status`): None when the server answers and
        lists the model, else why not, in words; nothing logged or counted."""
        try:
            listed = self._listed(timeout)
        except ModelError as exc:
            return exc.detail
        if listed and self.model not in listed:
            return f"the server does not list the model {self.model!r}"
        return None

    def _listed(self, timeout: float) -> list[str]:
        """GET /models, once (no retries), within `timeout`."""
        import openai

        client = self.client.with_options(
            timeout=openai.Timeout(timeout, connect=min(timeout, 5.0)), max_retries=0
        )
        try:
            return [model.id for model in client.models.list()]
        except openai.OpenAIError as exc:
            raise self._failure(exc, timeout).error from exc

    def _failed(self, exc: ModelError, event: str) -> None:
        metrics.model_failed(exc.kind)
        log.warning(event, kind=exc.kind, server=self.server, model=self.model, error=exc.detail)

    def request_body(
        self,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        max_tokens: int | None,
    ) -> dict[str, Any]:
        """The request as sent, but for the model's name. It is plain JSON already and posted
        as it is (`_request`): handed to `create(messages=...)`, the SDK would first walk every
        message against its typed definitions, which measured as more CPU than the rest of a
        step."""
        body: dict[str, Any] = {"messages": messages}
        if max_tokens is not None:
            body[self.sampling.tokens_param] = max_tokens
        if self.sampling.temperature is not None:
            body["temperature"] = self.sampling.temperature
        if tools:  # the tool knobs mean nothing (and some servers refuse them) without tools
            body["tools"] = tools
            if self.sampling.tool_choice:
                body["tool_choice"] = self.sampling.tool_choice
            if self.sampling.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = self.sampling.parallel_tool_calls
        return body

    @property
    def attempts(self) -> int:
        return self.max_retries + 1

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: Sequence[dict[str, Any]],
        timeout: float,
        sink: TextSink | None = None,
        *,
        max_tokens: int | None = None,
        watch: Watch | None = None,
    ) -> ModelTurn:
        """One model step, ended within `timeout` whatever the server does, its attempts
        together. With a `sink`, the reply is streamed and its answer text passed on as it
        arrives (and taken back, `reset`, before a retry); the turn is the same as without.
        A failure is counted by kind and logged as a warning naming the server, then raised."""
        self._clients.made()  # a process's first call loads the SDK: not on the step's clock
        try:
            return self._attempts(
                self.request_body(messages, tools, max_tokens), timeout, sink, watch
            )
        except ModelError as exc:
            self._failed(exc, "model_call_failed")
            raise

    def _attempts(
        self, body: dict[str, Any], timeout: float, sink: TextSink | None, watch: Watch | None
    ) -> ModelTurn:
        started = time.monotonic()
        deadline = started + timeout
        attempts = self.attempts
        attempt = 0
        while True:
            attempt += 1
            if watch is not None:
                watch.attempt_started(attempt, attempts)
            try:
                return self._attempt(body, deadline, sink, watch, started)
            except _Failed as failed:
                elapsed = time.monotonic() - started
                if watch is not None:
                    watch.attempt_failed(attempt, attempts, failed.error, failed.spent, elapsed)
                log.warning(
                    "model_attempt_failed",
                    attempt=attempt,
                    attempts=attempts,
                    kind=failed.error.kind,
                    server=self.server,
                    error=failed.error.detail,
                )
                pause = failed.retry_after if failed.retry_after is not None else backoff(attempt)
                if (
                    not failed.retryable
                    or attempt >= attempts
                    or time.monotonic() + pause >= deadline
                ):
                    raise self._final(failed.error, attempt, elapsed, timeout) from failed
                time.sleep(pause)  # bounded: a retry that could not start in time is not made
                if sink is not None:
                    sink.reset()

    def _final(
        self, error: ModelError, attempts: int, elapsed: float, timeout: float
    ) -> ModelError:
        """The step's error in words: how long it took, and how many attempts were made."""
        tried = f"{attempts} attempt" + ("s" if attempts != 1 else "")
        if error.timed_out:
            took = min(elapsed, timeout)
            return ModelError(
                f"the model did not finish within {seconds(took)} s ({tried})", timed_out=True
            )
        return ModelError(f"{error.detail} ({tried})", kind=error.kind)

    def _attempt(
        self,
        body: dict[str, Any],
        deadline: float,
        sink: TextSink | None,
        watch: Watch | None,
        started: float,
    ) -> ModelTurn:
        import openai

        left = max(0.1, deadline - time.monotonic())
        read = min(self.read_timeout, left) if self.read_timeout else left
        pool = self._pooled()
        client, direct = self._clients.made()[pool], self._clients.direct(pool)
        guarded = CutOffSink(sink) if sink is not None else None
        acc = TurnAccumulator(guarded) if guarded is not None else None
        try:
            return within(
                left + DEADLINE_GRACE,
                lambda: self._request(client, direct, body, acc, read, deadline, started),
                tick=(lambda _: watch.waiting(time.monotonic() - started)) if watch else None,
                every=self.watch_every,
            )
        except Overdue:
            if guarded is not None:
                guarded.cut()
            log.warning("model_call_overdue", timeout=round(deadline - started, 1))
            error = ModelError("the model did not finish in time", timed_out=True)
            raise _Failed(error, retryable=False, spent=self._spent(body, acc)) from None
        except openai.OpenAIError as exc:
            failed = self._failure(exc, read)
            raise _Failed(  # a timeout: the server may have been writing; else it was not
                failed.error,
                retryable=failed.retryable,
                retry_after=failed.retry_after,
                spent=self._spent(body, acc) if failed.error.timed_out else Spent(),
            ) from exc
        except _StreamCut as cut:
            raise _Failed(
                cut.error,
                retryable=cut.retryable,
                spent=self._spent(body, acc) if cut.wrote else Spent(),
            ) from None

    def _pooled(self) -> int:
        """The pool of connections this thread uses (of `pools`)."""
        pool: int | None = getattr(self._thread, "pool", None)
        if pool is None:
            pool = self._thread.pool = next(self._next_pool) % self.pools
        return pool

    def _request(
        self,
        client: openai.OpenAI,
        direct: _Direct | None,
        body: dict[str, Any],
        acc: TurnAccumulator | None,
        read: float,
        deadline: float,
        started: float,
    ) -> ModelTurn:
        """One attempt, posted as the SDK's client posts it (its URL, headers, key and errors)
        with no retries of its own (`_Direct`, or the client itself), and read as the JSON it
        is: the typed `create()` would copy the client for the attempt's timeout and build
        pydantic objects of every reply, about a third of the SDK's CPU per call, only for
        `read_turn` to read the fields back. The body is read as JSON whatever its content
        type says (proxies label JSON text/plain)."""
        import openai

        sent = {"model": self.model, **body}
        if acc is None:
            content = direct.post(client, sent, read) if direct is not None else None
            if content is None:  # no direct way (a proxy, a replaced client), or a redirect
                content = client.post(
                    CHAT_PATH, cast_to=httpx2.Response, body=sent, options=_options(read)
                ).content
            try:
                reply = json.loads(content)
            except (ValueError, RecursionError):  # not JSON, not UTF-8, too deep or too long
                reply = None
            if not isinstance(reply, dict):
                raise _StreamCut(ModelError(NOT_JSON), retryable=False)
            choices = as_list(reply.get("choices"))
            if not choices:
                raise _StreamCut(
                    ModelError("the model server returned no choices"), retryable=False
                )
            return read_turn(choices[0], reply.get("usage"), time.monotonic() - started)
        sent.update(stream=True, stream_options={"include_usage": True})
        stream = client.post(
            CHAT_PATH,
            cast_to=object,
            body=sent,
            options=_options(read),
            stream=True,
            stream_cls=openai.Stream[object],
        )
        try:
            with stream:
                for chunk in stream:
                    acc.add(chunk)
                    if time.monotonic() > deadline:  # still writing: stop reading it
                        raise _StreamCut(
                            ModelError("the model did not finish in time", timed_out=True),
                            retryable=False,
                        )
        except (httpx2.TimeoutException, openai.APITimeoutError) as exc:
            raise _StreamCut(
                ModelError(f"the model sent nothing for {seconds(read)} s", timed_out=True),
                retryable=True,
            ) from exc
        except (httpx2.TransportError, openai.APIConnectionError) as exc:
            raise _StreamCut(
                ModelError("the model's streamed reply broke off", kind="unreachable"),
                retryable=True,
            ) from exc
        except (ValueError, RecursionError):  # a part not JSON (or not UTF-8, too deep)
            raise _StreamCut(ModelError(NOT_JSON_CHUNK), retryable=False, wrote=True) from None
        if not acc.saw_choice:
            raise _StreamCut(ModelError("the model server returned no choices"), retryable=False)
        return acc.turn(time.monotonic() - started)

    def _spent(self, body: dict[str, Any], acc: TurnAccumulator | None) -> Spent:
        """What an abandoned attempt cost, as far as it is known (see `Spent`)."""
        if acc is None:
            return Spent(known="unknown")
        usage = acc.usage
        completion = _get_count(usage, "completion_tokens")
        if completion is not None:
            return Spent(_get_count(usage, "prompt_tokens") or 0, completion, "reported")
        written = acc.written_chars()
        if not written:
            return Spent(known="unknown")
        prompt = json.dumps(body, ensure_ascii=False, default=str)
        return Spent(_tokens(len(prompt)), _tokens(written), "estimated")

    def _failure(self, exc: openai.OpenAIError, read: float) -> _Failed:
        """An SDK exception in words fit for the run's record, and whether to retry."""
        import openai
        from openai._constants import MAX_RETRY_AFTER_DELAY

        if isinstance(exc, openai.APITimeoutError):
            error = ModelError(f"the model sent nothing for {seconds(read)} s", timed_out=True)
            return _Failed(error, retryable=True)
        if isinstance(exc, openai.APIConnectionError):
            cause = " ".join(self._unkeyed(str(exc.__cause__ or exc)).split())[:200]
            error = ModelError(
                f"could not reach the model server at {self.server_url} ({cause})",
                kind="unreachable",
            )
            return _Failed(error, retryable=True)
        if isinstance(exc, openai.APIStatusError):
            error = ModelError(
                f"the model server answered HTTP {exc.status_code}: {_short(exc)}",
                kind="rate_limited" if exc.status_code == 429 else "rejected",
            )
            # The SDK's own rules, so our retries are the ones it would have made
            retry = self.client._should_retry(exc.response)
            after = self.client._parse_retry_after_header(exc.response.headers)
            wait = after if after is not None and 0 < after <= MAX_RETRY_AFTER_DELAY else None
            return _Failed(error, retryable=retry, retry_after=wait)
        return _Failed(ModelError(f"model client error: {type(exc).__name__}"), retryable=False)

    def _unkeyed(self, text: str) -> str:
        """`text` without the API key: HTTP refuses a key with a line break in it, and says
        so quoting the header."""
        for part in self._clients.api_key.split():
            if len(part) >= 8:  # a key's, not a word of the message's
                text = text.replace(part, "[key]")
        return text


class _Clients:
    """The SDK's clients of one ModelClient and its copies, made at the first request:
    completions go through `pools` clients, the same but for their connection pools; a
    calling thread keeps the one it was first given (round-robin), so `pools_for(n)` pools
    serve n slot threads POOL_THREADS each. One TLS context for all of them: each pool
    building its own would load the CA bundle again."""

    def __init__(
        self, api_key: str, base_url: str | None, timeout: float, max_retries: int, pools: int
    ) -> None:
        self.api_key = api_key
        self._settings = (base_url, timeout, max_retries, pools)
        self._lock = threading.Lock()
        self._made: list[openai.OpenAI] | None = None
        self._direct: list[_Direct] = []  # one beside each client, made with them

    def made(self) -> list[openai.OpenAI]:
        made = self._made
        if made is None:
            with self._lock:
                if self._made is None:
                    self._made = self._make()
                made = self._made
        return made

    def direct(self, pool: int) -> _Direct | None:
        """The direct way to post pool `pool`'s completions, if there is one."""
        self.made()
        return self._direct[pool] if self._direct else None

    def replaced(self) -> None:
        """A client was replaced (to see or shape its traffic): every request goes through
        the clients from now on."""
        self._direct = []

    def _make(self) -> list[openai.OpenAI]:
        import openai

        base_url, timeout, max_retries, pools = self._settings
        client = openai.OpenAI(
            api_key=self.api_key,
            base_url=base_url,
            timeout=openai.Timeout(timeout, connect=5.0),
            max_retries=max_retries,  # for other requests (embeddings); never for completions
        )
        secure = client.base_url.scheme == "https"
        tls = httpx2.create_ssl_context() if pools > 1 or secure else None
        made = [client]
        if pools > 1 and tls is not None:
            more = [openai.DefaultHttpxClient(verify=tls) for _ in range(pools - 1)]
            made += [client.with_options(http_client=http) for http in more]
        if _Direct.possible(client):
            self._direct = [_Direct(made_client, tls) for made_client in made]  # https only
        return made


class _Direct:
    """A whole (not streamed) completion posted as the SDK's client would post it: to its
    URL, with its headers and key, under the attempt's timeouts, its failures raised as the
    SDK's own errors, the cookies its server sets sent back (a load balancer's affinity);
    but one level down, through httpcore2 (the HTTP library under the SDK's), a pool of
    connections beside each client's. Through the SDK's request building and httpx2 a call
    took 0.6 ms of the worker's CPU, this way 0.3 ms (bench/README.md, issue 28).

    The SDK's client itself posts when this way would not be the same: a proxy named in the
    environment (the SDK's client honours it), credentials in the base URL (sent as Basic
    auth), a redirect (which it follows; from then on, every call), and every streamed
    reply. Not answered in compressed form (`Accept-Encoding: identity`, where the SDK offers
    gzip); a server that compresses anyway is decoded as the SDK would."""

    def __init__(self, client: openai.OpenAI, tls: ssl.SSLContext | None) -> None:
        import httpcore2  # httpx2's transport, loaded with the SDK (not in the bot: 4.5 MiB)

        base = client.base_url  # as the SDK's client joins a path to it
        self.url = base.copy_with(raw_path=base.raw_path + CHAT_PATH.lstrip("/").encode())
        self.target = str(self.url)
        # as the SDK merges them: case aside, the default headers (OPENAI_CUSTOM_HEADERS
        # among them) over the key's, an omitted one (no organization, no project) dropped
        headers = httpx2.Headers({"Host": self.url.netloc.decode("ascii")})
        for given in (client.auth_headers, client.default_headers):
            for name, value in given.items():
                if isinstance(value, str):
                    headers[name] = value
                else:
                    headers.pop(name, None)
        for own in PER_ATTEMPT:  # each attempt's own, as the SDK sets them
            headers.pop(own, None)
        headers.setdefault("Accept-Encoding", "identity")
        self.headers = headers.raw
        self.cookies = client._client.cookies  # the SDK client's jar: one for every request
        self.redirected = False
        from worker.model_http import OneWriteBackend

        self.pool = httpcore2.ConnectionPool(  # the SDK's limits, and its idle connections'
            ssl_context=tls,  # life: one a NAT or load balancer forgot is not written to
            max_connections=1000,
            max_keepalive_connections=100,
            keepalive_expiry=KEEPALIVE_SECONDS,
            network_backend=OneWriteBackend(),  # a request in one send (worker/model_http.py)
        )

    @staticmethod
    def possible(client: openai.OpenAI) -> bool:
        """Whether completions may be posted this way: no proxy named in the environment for
        the server's scheme (whatever NO_PROXY says: the SDK reads it its own way), no
        credentials in the URL, the key sent as it is, and headers HTTP carries as they are
        (ASCII)."""
        url = client.base_url
        proxies = urllib.request.getproxies_environment()
        if proxies.get(url.scheme) or proxies.get("all") or url.userinfo:
            return False
        # the SDK's own ways to sign requests (workload identity, a provider's runtime)
        for signer in ("_workload_identity_auth", "_provider_runtime"):
            if getattr(client, signer, None) is not None:
                return False
        sent = {**client.auth_headers, **client.default_headers}
        return all(
            name.isascii() and value.isascii()
            for name, value in sent.items()
            if isinstance(value, str)
        )

    def post(self, client: openai.OpenAI, body: dict[str, Any], read: float) -> bytes | None:
        """The reply's body; None when the SDK's client must post it (a redirect)."""
        import httpcore2
        import openai

        if self.redirected:
            return None
        sent = encode_body(body).encode()
        headers = [
            *self.headers,
            (b"Content-Length", str(len(sent)).encode()),
            (PER_ATTEMPT[0].encode(), b"0"),
            (PER_ATTEMPT[1].encode(), str(read).encode()),
        ]
        cookie = self._cookie() if self.cookies.jar else b""
        if cookie:
            headers.append((b"Cookie", cookie))
        timeouts = {"connect": min(read, 5.0), "read": read, "write": read, "pool": read}
        try:
            answer = self.pool.request(
                "POST", self.target, headers=headers, content=sent, extensions={"timeout": timeouts}
            )
            status, raw = answer.status, answer.content
            if 200 <= status < 300 and _plain(answer.headers):
                return raw
            response = httpx2.Response(
                status,
                headers=answer.headers,
                stream=httpx2.ByteStream(raw),
                request=self._request(),
            )
            self.cookies.extract_cookies(response)
            response.read()  # decoded as the SDK's client would (gzip, say)
        except httpcore2.TimeoutException as exc:
            raise openai.APITimeoutError(request=self._request()) from exc
        except (  # as the SDK's client: the server could not be reached, or its reply read
            httpcore2.NetworkError,
            httpcore2.ProtocolError,
            httpcore2.UnsupportedProtocol,
            httpcore2.ProxyError,
            httpx2.DecodingError,
            OSError,
        ) as exc:
            raise openai.APIConnectionError(request=self._request()) from exc
        if response.has_redirect_location:  # 301, 302, 303, 307, 308 with where to
            self.redirected = True
            return None
        if status >= 400:
            raise client._make_status_error_from_response(response)
        return response.content

    def _request(self) -> httpx2.Request:
        return httpx2.Request("POST", self.url)

    def _cookie(self) -> bytes:
        """The Cookie header the SDK's client would send to the server."""
        request = self._request()
        self.cookies.set_cookie_header(request)
        return request.headers.get("cookie", "").encode("latin-1")


PER_ATTEMPT = ("X-Stainless-Retry-Count", "X-Stainless-Read-Timeout")
KEEPALIVE_SECONDS = 5.0  # an idle connection's life in a pool (httpx2's, the SDK's, default)


def _plain(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether an httpcore2 response's body is as sent, with no cookie to keep."""
    return not any(key.lower() in (b"content-encoding", b"set-cookie") for key, _ in headers)


class _StreamCut(Exception):
    """A reply that did not come whole (read in the call's thread, judged by `_attempt`)."""

    def __init__(self, error: ModelError, *, retryable: bool, wrote: bool = False) -> None:
        super().__init__(error.detail)
        self.error, self.retryable = error, retryable
        self.wrote = wrote or retryable or error.timed_out  # the model may have written some


def _options(read: float) -> RequestOptions:
    """One attempt's options for the SDK's client: its timeouts, no retries of its own."""
    import openai

    return {
        "timeout": openai.Timeout(read, connect=min(read, 5.0)),
        "max_retries": 0,
        "security": {"bearer_auth": True},  # as create(): the API key, never another
    }


def backoff(attempt: int) -> float:
    """The SDK's wait before retry number `attempt`: 0.5 s doubling, at most 8 s, less up to
    a quarter at random."""
    from openai._constants import INITIAL_RETRY_DELAY, MAX_RETRY_DELAY

    return min(INITIAL_RETRY_DELAY * 2.0 ** (attempt - 1), MAX_RETRY_DELAY) * (
        1 - 0.25 * random.random()
    )


def seconds(value: float) -> str:
    """A duration as people read it: whole seconds, tenths under ten."""
    return f"{value:.0f}" if value >= 10 else f"{round(value, 1):g}"


def _tokens(chars: int) -> int:
    return max(1, math.ceil(chars / 4)) if chars else 0


def _get_count(usage: object, name: str) -> int | None:
    value = get_field(usage, name)
    return value if isinstance(value, int) and value >= 0 else None


def _short(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:300]
    return str(exc.message)[:300]
