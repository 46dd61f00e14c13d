"""Servers for the endpoint tests: an OpenAI-compatible server on real models, and a proxy that injects faults.

``OpenAIServer`` serves ``/v1/models``, ``/v1/chat/completions``,
``/v1/completions`` and ``/v1/embeddings`` in OpenAI's wire format (the
request and answer fields vLLM's server reads and writes: ``messages``,
``max_tokens``, ``seed``, ``stop``, ``response_format: json_schema``;
``choices[0].message.content``, ``finish_reason``, ``usage``; errors as
``{"error": {"message", "type", "code"}}``). Its models are loaded through the
project's real loading code: a causal LM generating with the transformers
backend (xgrammar for ``json_schema``), and an encoder embedding with mean
pooling. It runs on uvicorn in a thread of the test process, on 127.0.0.1,
starts in about a second, and counts every request it answered by the
request's key, so a test can tell whether a row was requested twice, and
notes when each arrived, so a test can read the pacing the server saw.

``FaultProxy`` sits in front of any such server (this one, or vLLM's) and,
per request, answers ``429`` (with ``Retry-After``) or ``500`` itself, closes
the connection before forwarding (``drop``), forwards after a delay
(``slow``), or forwards and then cuts the answer off half-way (``cut``: the
server did the work, the client never got it). HTTP/1.1 is parsed by h11.
Both stop with their fixture; request loops are bounded by the tests.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipeline.endpoint.wire import body_key


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class _Uvicorn:
    """An ASGI app on uvicorn in a daemon thread, on a socket bound to 127.0.0.1 (``url``), until ``stop``."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = _bound_socket()
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> "_Uvicorn":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start within 30 s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


def _error(status: int, message: str, kind: str = "BadRequestError") -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)


class OpenAIServer:
    """The OpenAI API over a local causal LM (``llm_dir``, served as ``llm_name``) and encoder (``embed_dir``).

    ``requests`` counts what it answered by :func:`pipeline.endpoint.wire.body_key` (path, body);
    ``arrivals`` lists ``(time.monotonic() when its body was read, key)`` per request, in arrival order;
    ``fail_marker``: a prompt holding it is refused with ``400`` (a row the server rejects).
    """

    def __init__(self, *, llm_dir: Path | None = None, llm_name: str = "tiny-llm", embed_dir: Path | None = None,
                 embed_name: str = "tiny-embed", api_key: str | None = None, max_model_len: int = 512,
                 fail_marker: str = "<<refuse>>", vlm_dir: Path | None = None, vlm_name: str = "tiny-vlm") -> None:
        self.llm_dir, self.llm_name, self.embed_dir, self.embed_name = llm_dir, llm_name, embed_dir, embed_name
        # a vision-language model: chat messages with image_url parts (data URIs), each image decoded and noted
        self.vlm_dir, self.vlm_name = vlm_dir, vlm_name
        self.images: list[dict[str, Any]] = []
        self._vlm: Any = None
        self.api_key, self.max_model_len, self.fail_marker = api_key, max_model_len, fail_marker
        self.requests: Counter[str] = Counter()
        self.arrivals: list[tuple[float, str]] = []
        self.paths: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._llm: Any = None
        self._embed: Any = None
        self._constraints: dict[str, Any] = {}
        self._server: _Uvicorn | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "OpenAIServer":
        self._load()
        self._server = _Uvicorn(self._app()).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.port}/v1"

    def _load(self) -> None:
        if self.llm_dir is not None:
            from pipeline.generation.loading import load_causal_lm

            self._llm = load_causal_lm(self.llm_dir, device="cpu", precision="fp32")
        if self.vlm_dir is not None:
            from pipeline.generation.vision import load_vision_lm

            self._vlm = load_vision_lm(self.vlm_dir, device="cpu", precision="fp32")
        if self.embed_dir is not None:
            from pipeline.models.loading import load_model

            self._embed = load_model(self.embed_dir, kind="embed", device="cpu")

    # -- the API ------------------------------------------------------------------------------------
    def _app(self) -> Any:
        from starlette.applications import Starlette

        return Starlette(routes=self._routes())

    def _routes(self) -> list[Any]:
        from starlette.routing import Route

        return [
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/embeddings", self._embeddings, methods=["POST"]),
        ]

    def _refused(self, request: Any) -> Any:
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return _error(401, "Incorrect API key provided", "AuthenticationError")
        return None

    async def _models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if (refused := self._refused(request)) is not None:
            return refused
        served = [(self.llm_name, self.llm_dir), (self.embed_name, self.embed_dir), (self.vlm_name, self.vlm_dir)]
        data = [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "sbi-tests",
                 "root": str(folder), "parent": None, "max_model_len": self.max_model_len}
                for name, folder in served if folder is not None]
        return JSONResponse({"object": "list", "data": data})

    async def _body(self, request: Any, path: str) -> tuple[dict[str, Any] | None, Any]:
        if (refused := self._refused(request)) is not None:
            return None, refused
        try:
            body = json.loads(await request.body())
        except ValueError:
            return None, _error(400, "the body is not JSON")
        arrived = time.monotonic()
        with self._lock:
            self.requests[body_key(path, body)] += 1
            self.arrivals.append((arrived, body_key(path, body)))
            self.paths[path] += 1
        return body, None

    async def answer(self, path: str, body: dict[str, Any]) -> Any:
        """The response to ``body`` posted to ``path`` (``/chat/completions``, ``/completions``, ``/embeddings``),
        as the live routes answer it, without counting it: what the batch API's lines get (``BatchServer``)."""
        answers = {"/chat/completions": self._answer_chat, "/completions": self._answer_completion,
                   "/embeddings": self._answer_embeddings}
        if path not in answers:
            return _error(404, f"no route {path}", "NotFoundError")
        return await answers[path](body)

    async def _chat(self, request: Any) -> Any:
        body, refused = await self._body(request, "/chat/completions")
        if refused is not None:
            return refused
        return await self._answer_chat(body)

    async def _answer_chat(self, body: dict[str, Any]) -> Any:
        if body.get("model") == self.vlm_name and self._vlm is not None:
            return await self._chat_with_images(body)
        if body.get("model") != self.llm_name or self._llm is None:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        tokenizer = self._llm[0]
        ids = tokenizer.apply_chat_template(body.get("messages") or [], add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        text = " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
        return await self._generate(body, list(ids), text, chat=True)

    async def _chat_with_images(self, body: dict[str, Any]) -> Any:
        """A chat turn for the vision-language model: each ``image_url`` part's data URI decoded (and noted in
        ``images``), the messages rendered by the processor's chat template, the images expanded into their
        tokens; the usage's ``prompt_tokens`` counts them, as a real server's does."""
        import base64
        import io

        from PIL import Image

        messages, images = [], []
        for message in body.get("messages") or []:
            content = message.get("content")
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else []
            for part in content if isinstance(content, list) else []:
                if part.get("type") == "image_url":
                    url = str((part.get("image_url") or {}).get("url", ""))
                    head, _, data = url.partition(";base64,")
                    if not head.startswith("data:image/") or not data:
                        return _error(400, f"image_url must be a base64 data URI, got {url[:40]!r}")
                    try:
                        image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
                    except Exception as exc:  # noqa: BLE001 - what the server says to a bad image
                        return _error(400, f"cannot decode the image: {exc}")
                    images.append(image)
                    with self._lock:
                        self.images.append({"mime": head[len("data:"):], "size": image.size})
                    parts.append({"type": "image"})
                elif part.get("type") == "text":
                    parts.append({"type": "text", "text": part.get("text", "")})
            messages.append({"role": message.get("role"), "content": parts})
        processor = self._vlm[0]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        encoded = processor(text=[text], images=images or None, add_special_tokens=False, return_tensors="pt")
        inputs = {k: v for k, v in encoded.items() if k not in ("input_ids", "attention_mask")}
        return await self._generate(body, encoded["input_ids"][0].tolist(), text, chat=True, inputs=inputs)

    async def _completions(self, request: Any) -> Any:
        body, refused = await self._body(request, "/completions")
        if refused is not None:
            return refused
        return await self._answer_completion(body)

    async def _answer_completion(self, body: dict[str, Any]) -> Any:
        if body.get("model") != self.llm_name or self._llm is None:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        prompt = str(body.get("prompt", ""))
        return await self._generate(body, self._llm[0](prompt)["input_ids"], prompt, chat=False)

    async def _generate(self, body: dict[str, Any], ids: list[int], text: str, *, chat: bool,
                        inputs: dict[str, Any] | None = None) -> Any:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        if self.fail_marker in text:
            return _error(400, "the server refuses this prompt (test marker)")
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        if len(ids) + max_tokens > self.max_model_len:
            return _error(400, f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                               f"requested {len(ids) + max_tokens} tokens.")
        completion, tokens, reason = await run_in_threadpool(self._decode, body, ids, max_tokens, inputs)
        usage = {"prompt_tokens": len(ids), "completion_tokens": tokens, "total_tokens": len(ids) + tokens}
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": completion}
        else:
            choice["text"] = completion
        return JSONResponse({"id": f"cmpl-{time.monotonic_ns()}", "object": "chat.completion" if chat else
                             "text_completion", "created": int(time.time()), "model": body["model"],
                             "choices": [choice], "usage": usage})

    def _decode(self, body: dict[str, Any], ids: list[int], max_tokens: int,
                inputs: dict[str, Any] | None = None) -> tuple[str, int, str]:
        from pipeline.generation import BatchGenerator, GenerationRequest, SamplingParams

        tokenizer, model = self._llm if inputs is None else (self._vlm[0].tokenizer, self._vlm[1])
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
        sampling = SamplingParams(temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                                  stop=tuple(body.get("stop") or ()))
        with self._lock:
            constraint = self._constraint(schema, inputs is not None) if schema else None
            gen = BatchGenerator(model, tokenizer, mode="static", slots=1, max_seq_len=self.max_model_len,
                                 sampling=sampling, constraint=constraint)
            result = gen.generate([GenerationRequest(ids, max_tokens, int(body.get("seed") or 0), inputs=inputs)])[0]
        return result.completion, result.completion_tokens, result.finish_reason

    def _constraint(self, schema: dict[str, Any], vision: bool = False) -> Any:
        from pipeline.generation.engine import eos_ids
        from pipeline.generation.grammar import JsonConstraint

        key = json.dumps(schema, sort_keys=True) + str(vision)
        if key not in self._constraints:
            tokenizer, model = self._llm if not vision else (self._vlm[0].tokenizer, self._vlm[1])
            vocab = model.config.get_text_config().vocab_size
            self._constraints[key] = JsonConstraint.compile(tokenizer, schema, vocab_size=vocab,
                                                            stop_token_ids=sorted(eos_ids(model, tokenizer)))
        return self._constraints[key]

    async def _embeddings(self, request: Any) -> Any:
        body, refused = await self._body(request, "/embeddings")
        if refused is not None:
            return refused
        return await self._answer_embeddings(body)

    async def _answer_embeddings(self, body: dict[str, Any]) -> Any:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        if body.get("model") != self.embed_name or self._embed is None:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
        if any(self.fail_marker in str(t) for t in inputs):
            return _error(400, "the server refuses this input (test marker)")
        vectors, tokens = await run_in_threadpool(self._encode, [str(t) for t in inputs])
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        return JSONResponse({"object": "list", "data": data, "model": body["model"],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _encode(self, texts: list[str]) -> tuple[list[list[float]], int]:
        import torch

        tokenizer, model = self._embed
        enc = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
        with self._lock, torch.inference_mode():
            hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return pooled.tolist(), int(enc["attention_mask"].sum())


# ------------------------------------------------------------------------------------- the fault proxy

@dataclass
class FaultPlan:
    """Which fault the ``n``-th request (from 0) gets: ``None`` (forwarded), ``429``, ``500``, ``drop``,
    ``slow``, ``cut``, ``not_json`` (HTTP 200 with an HTML body) or ``no_result`` (HTTP 200 with a JSON object
    that holds neither ``choices`` nor ``data``: a proxy or a server in trouble answering for the model). Rules
    are checked in this order; each is "every ``k``-th request, from ``offset``".

    A 429 burst: ``burst_429 = (k, length)``: requests ``n`` with ``n % k < length`` are refused.
    """

    burst_429: tuple[int, int] | None = None
    every_500: int | None = None
    every_drop: int | None = None
    every_slow: int | None = None
    slow_s: float = 0.3
    every_cut: int | None = None
    every_not_json: int | None = None
    every_no_result: int | None = None
    retry_after_ms: int = 50
    # a rule applies only to requests whose body contains this text (None: every request)
    only_if: str | None = None

    def fault(self, n: int, body: bytes) -> str | None:
        if self.only_if is not None and self.only_if.encode() not in body:
            return None
        if self.burst_429 and n % self.burst_429[0] < self.burst_429[1]:
            return "429"
        for name, every in (("500", self.every_500), ("drop", self.every_drop), ("slow", self.every_slow),
                            ("cut", self.every_cut), ("not_json", self.every_not_json),
                            ("no_result", self.every_no_result)):
            if every and n % every == every - 1:
                return name
        return None


@dataclass
class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream`` (``http://host:port``), injecting ``plan``'s faults.

    ``injected`` counts the faults by name; ``forwarded`` counts, by request key, what reached the upstream.
    """

    upstream: str
    plan: FaultPlan = field(default_factory=FaultPlan)
    injected: Counter = field(default_factory=Counter)
    forwarded: Counter = field(default_factory=Counter)
    requests: int = 0

    def start(self) -> "FaultProxy":
        self._sock = _bound_socket()
        self.port = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def url(self, root: str = "/v1") -> str:
        return f"http://127.0.0.1:{self.port}{root}"

    def stop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=10)
        self._sock.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        import httpx

        self._stopping = asyncio.Event()
        self._client = httpx.AsyncClient(base_url=self.upstream, timeout=httpx.Timeout(300.0), trust_env=False)
        server = await asyncio.start_server(self._handle, sock=self._sock)
        self._ready.set()
        async with server:
            await self._stopping.wait()
        await self._client.aclose()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h11

        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request, body = await self._read(conn, reader)
                if request is None:
                    break
                if not await self._answer(conn, writer, request, body):
                    break
                if conn.our_state is h11.MUST_CLOSE:
                    break
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError):
            pass
        finally:
            writer.close()

    async def _read(self, conn: Any, reader: asyncio.StreamReader) -> tuple[Any, bytes]:
        import h11

        request, chunks = None, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                if not data and conn.their_state is h11.IDLE:
                    return None, b""
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return request, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                return None, b""

    async def _answer(self, conn: Any, writer: asyncio.StreamWriter, request: Any, body: bytes) -> bool:
        """Answer one request (forwarded or faulted); False when the connection was dropped."""
        n, self.requests = self.requests, self.requests + 1
        fault = self.plan.fault(n, body)
        if fault:
            self.injected[fault] += 1
        if fault in ("429", "500"):
            headers = {"retry-after": "1", "retry-after-ms": str(self.plan.retry_after_ms)} if fault == "429" else {}
            text = json.dumps({"error": {"message": "injected " + fault, "type": "InjectedFault", "code": int(fault)}})
            await self._send(conn, writer, int(fault), {"content-type": "application/json", **headers}, text.encode())
            return True
        if fault == "drop":
            writer.transport.abort()  # a reset before the request went anywhere
            return False
        if fault in ("not_json", "no_result"):  # answered in the model's place, the model never asked
            text = ("<html><body>upstream is restarting</body></html>" if fault == "not_json"
                    else json.dumps({"id": "injected", "object": "error", "message": "upstream is restarting"}))
            kind = "text/html" if fault == "not_json" else "application/json"
            await self._send(conn, writer, 200, {"content-type": kind}, text.encode())
            return True
        if fault == "slow":
            await asyncio.sleep(self.plan.slow_s)
        status, headers, content = await self._forward(request, body)
        if fault == "cut":  # the upstream did the work; the client gets half an answer and a closed connection
            head = f"HTTP/1.1 {status} OK\r\ncontent-type: application/json\r\ncontent-length: {len(content)}\r\n\r\n"
            writer.write(head.encode() + content[: len(content) // 2])
            await writer.drain()
            writer.transport.abort()
            return False
        await self._send(conn, writer, status, headers, content)
        return True

    async def _forward(self, request: Any, body: bytes) -> tuple[int, dict[str, str], bytes]:
        target = request.target.decode()
        if body:
            try:
                parsed = json.loads(body)
                path = target.split("/v1", 1)[-1]
                self.forwarded[body_key(path, parsed)] += 1
            except ValueError:
                pass
        headers = {k.decode(): v.decode() for k, v in request.headers
                   if k.lower() not in (b"host", b"content-length", b"connection")}
        response = await self._client.request(request.method.decode(), target, content=body, headers=headers)
        keep = {k: v for k, v in response.headers.items()
                if k.lower() in ("content-type", "retry-after", "retry-after-ms")}
        return response.status_code, keep, response.content

    @staticmethod
    async def _send(conn: Any, writer: asyncio.StreamWriter, status: int, headers: dict[str, str],
                    content: bytes) -> None:
        import h11

        pairs = [(k, v) for k, v in headers.items()] + [("content-length", str(len(content)))]
        writer.write(conn.send(h11.Response(status_code=status, headers=pairs)))
        writer.write(conn.send(h11.Data(data=content)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()


def count_requests(counter: Counter, keys: Callable[[str], bool] | None = None) -> dict[str, int]:
    """The counter as a plain dict, optionally only the keys ``keys`` accepts."""
    return {k: v for k, v in counter.items() if keys is None or keys(k)}
