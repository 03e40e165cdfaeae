"""vLLM 0.26.0's OpenAI-compatible HTTP front, as its FastAPI app under uvicorn answers (the routes the
simulator serves; the rest are FastAPI's 404 / 405).

- `/health` (entrypoints/serve/instrumentator/health.py:22-33): 200 with an empty body unless the engine
  client has errored, then 503. `/ping` (GET and POST, serve/sagemaker/api_router.py:47-52) is the same.
- `/load` and `/version` (instrumentator/basic.py:30-56), `/v1/models` (openai/models/api_router.py:20,
  ModelList/ModelCard/ModelPermission of openai/engine/protocol.py:74-102), `/metrics` (instrumentator/
  metrics.py, `text/plain; version=0.0.4; charset=utf-8`).
- `/v1/completions` with a prompt string or token ids (CompletionResponse, openai/completion/protocol.py:
  575-620; `max_tokens` defaults to 16); an unknown `model` is a 404 `NotFoundError`
  (serve/engine/serving.py:63-68); a dead engine a 500 `InternalServerError` carrying EngineDeadError's
  message, after which the server shuts itself down (serve/utils/server_utils.py:328-368).
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Callable

from supervisor.simulator.httpbase import UvicornHandler, UvicornServer, prompt_tokens
from supervisor.simulator.vllm.client import ClientGone, Completion, EngineClient, EngineDeadError
from supervisor.simulator.vllm.lines import VLLM_VERSION
from supervisor.simulator.vllm.metrics import CONTENT_TYPE

GET_ROUTES = ("/load", "/version", "/health", "/metrics", "/v1/models", "/ping")
POST_ROUTES = ("/ping", "/v1/chat/completions", "/v1/completions")


class VllmHTTPServer(UvicornServer):
    """Serves on the socket `setup_server` bound before the engine started (api_server.py:625-637); it only
    starts listening when uvicorn starts serving (`loop.create_server(sock=...)`)."""

    def __init__(
        self,
        sock: socket.socket,
        client: EngineClient,
        access: Callable[[str, str, str], None],
        on_errored: Callable[[], None],
    ) -> None:
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], VllmHandler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.client = client
        self.access = access
        self.on_errored = on_errored  # terminate_if_errored (launcher.py:168-180)
        self.started = int(time.time())


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict[str, object]:
    """ErrorResponse (serve/utils/error_response.py:16-80)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class VllmHandler(UvicornHandler):
    server: VllmHTTPServer

    @property
    def client(self) -> EngineClient:
        return self.server.client

    def _counted(self, method: str, route: Callable[[], None]) -> None:
        self._status = []
        route()
        if self._status:
            self.client.metrics.request_done(self._path(), method, self._status[0])

    def do_GET(self) -> None:
        path = self._path()
        routes: dict[str, Callable[[], None]] = {
            "/health": self._health,
            "/ping": self._health,
            "/load": self._load,
            "/version": self._version,
            "/v1/models": self._models,
            "/metrics": self._metrics,
        }
        route = routes.get(path)
        if route is None:
            self._json(405, {"detail": "Method Not Allowed"}) if path in POST_ROUTES else self._not_found()
            return
        self._counted("GET", route)

    def do_POST(self) -> None:
        path = self._path()
        routes: dict[str, Callable[[], None]] = {
            "/ping": self._health,
            "/v1/completions": self._completions,
            "/v1/chat/completions": self._chat,
        }
        route = routes.get(path)
        if route is None:
            self._json(405, {"detail": "Method Not Allowed"}) if path in GET_ROUTES else self._not_found()
            return
        self._counted("POST", route)

    def _health(self) -> None:
        self._respond(503 if self.client.errored else 200)

    def _load(self) -> None:
        self._json(200, {"server_load": 0})

    def _version(self) -> None:
        self._json(200, {"version": VLLM_VERSION})

    def _models(self) -> None:
        args, created = self.client.ctx.args, int(time.time())
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex}",
            "object": "model_permission",
            "created": created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        card = {
            "id": args.served_model_name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": args.model,
            "parent": None,
            "max_model_len": self.client.ctx.facts.max_model_len,
            "permission": [permission],
        }
        self._json(200, {"object": "list", "data": [card]})

    def _metrics(self) -> None:
        self._respond(200, self.client.metrics.render(), CONTENT_TYPE)

    def _request(self) -> tuple[dict[str, object], int] | None:
        body = self._read_json()
        if body is None:
            self._json(400, error_body("Expecting value: line 1 column 1 (char 0)", "BadRequestError", 400))
            return None
        model = body.get("model")
        if model not in (None, self.client.ctx.args.served_model_name):
            self._json(404, error_body(f"The model `{model}` does not exist.", "NotFoundError", 404, "model"))
            return None
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        max_new = max_tokens if isinstance(max_tokens, int) and max_tokens >= 0 else 16
        return body, max_new

    def _run(self, n_prompt: int, max_new: int) -> Completion | None:
        try:
            return self.client.generate(n_prompt, max_new, self._client_gone)
        except ClientGone:
            return None  # the request was aborted; nobody is left to answer
        except EngineDeadError as e:
            with contextlib.suppress(OSError):
                self._json(500, error_body(str(e), "InternalServerError", 500))
            self.server.on_errored()
            return None

    def _completions(self) -> None:
        parsed = self._request()
        if parsed is None:
            return
        body, max_new = parsed
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            n_prompt = len(prompt)
        elif isinstance(prompt, str):
            n_prompt = prompt_tokens(prompt)
        else:
            self._json(400, error_body("Either prompt or prompt_embeds must be provided.", "BadRequestError", 400))
            return
        result = self._run(n_prompt, max_new)
        if result is None:
            return
        choice = {
            "index": 0,
            "text": result.text,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
        self._json(200, self._envelope(result, "text_completion", choice))

    def _chat(self) -> None:
        parsed = self._request()
        if parsed is None:
            return
        body, max_new = parsed
        messages = body.get("messages")
        text = (
            " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            if isinstance(messages, list)
            else ""
        )
        result = self._run(prompt_tokens(text) + 8, max_new)  # the chat template adds its tokens
        if result is None:
            return
        message: dict[str, object] = {
            "role": "assistant",
            "content": result.text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [],
            "reasoning": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": None,
        }
        self._json(200, self._envelope(result, "chat.completion", choice))

    def _envelope(self, result: Completion, kind: str, choice: dict[str, object]) -> dict[str, object]:
        usage = {
            "prompt_tokens": result.prompt_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "completion_tokens": result.completion_tokens,
            "prompt_tokens_details": None,
        }
        rid = result.rid if kind == "text_completion" else result.rid.replace("cmpl-", "chatcmpl-", 1)
        return {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": self.client.ctx.args.served_model_name,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage,
            "kv_transfer_params": None,
        }


def route_lines() -> list[tuple[str, str]]:
    """The `Route: ..., Methods: ...` lines (launcher.py:37-46) for the routes served here, in app order."""
    methods = {"/ping": "POST, GET"}
    return [
        (path, methods.get(path, "GET" if path in GET_ROUTES else "POST")) for path in (*GET_ROUTES, *POST_ROUTES[1:])
    ]
