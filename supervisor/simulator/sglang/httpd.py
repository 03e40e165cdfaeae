"""SGLang's HTTP front, answering as its FastAPI app does: its routes and bodies here, uvicorn's side
(headers, errors, access log) in supervisor/simulator/httpbase.py."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from supervisor.simulator.argv import SimArgs
from supervisor.simulator.httpbase import UvicornHandler, UvicornServer, prompt_tokens
from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.modelcard import ModelFacts
from supervisor.simulator.options import SimSettings
from supervisor.simulator.sglang import exposition as metrics
from supervisor.simulator.sglang.httpstats import HttpStats
from supervisor.simulator.sglang.serverargs import server_args_items
from supervisor.simulator.sglang.tokenizer import ClientDisconnected, GenerateResult, ServerStatus, TokenizerManager

SGLANG_VERSION = "0.5.16"
DEFAULT_MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class Front:
    args: SimArgs
    settings: SimSettings
    facts: ModelFacts
    log: LogWriter
    manager: TokenizerManager
    started: float
    http: HttpStats = field(default_factory=HttpStats)


class SimHTTPServer(UvicornServer):
    def __init__(self, front: Front) -> None:
        host = front.args.host
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.front = front
        self.access = front.log.access
        super().__init__((host, front.args.port), Handler)


class Handler(UvicornHandler):
    server: SimHTTPServer

    @property
    def front(self) -> Front:
        return self.server.front

    def do_GET(self) -> None:
        self.front.manager.through_loop()  # uvicorn reads every request on the event loop
        with self.front.http.track(self._path(), "GET") as self._status:
            route = self._get_routes().get(self._path())
            if route is None:
                self._not_found()
            else:
                route()

    def do_POST(self) -> None:
        self.front.manager.through_loop()
        with self.front.http.track(self._path(), "POST") as self._status:
            self._post()

    def _post(self) -> None:
        path = self._path()
        if path == "/generate":
            self._generate()
        elif path == "/v1/completions":
            self._completions()
        elif path in ("/health", "/health_generate"):  # FastAPI: the route exists, not this method
            self._json(405, {"detail": "Method Not Allowed"})
        else:
            self._not_found()

    def _get_routes(self) -> dict[str, Callable[[], None]]:
        routes: dict[str, Callable[[], None]] = {
            "/health": self._health,
            "/health_generate": self._health,
            "/get_model_info": self._model_info,
            "/model_info": self._model_info,
            "/v1/models": self._models,
            "/get_server_info": self._deprecated_server_info,
            "/server_info": self._server_info,
        }
        if self.front.args.enable_metrics:
            routes["/metrics"] = self._metrics
        return routes

    def _health(self) -> None:
        s = self.front.settings
        healthy = self.front.manager.health(s.health_check_timeout_s, s.health_latency_s)
        self._respond(200 if healthy else 503)

    def _model_info(self) -> None:
        args, facts = self.front.args, self.front.facts
        self._json(
            200,
            {
                "model_path": args.model_path,
                "tokenizer_path": args.tokenizer_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "deepseek_v3" if facts.architecture.startswith("Deepseek") else "llama",
                "architectures": [facts.architecture],
            },
        )

    def _models(self) -> None:
        args = self.front.args
        card = {
            "id": args.served_model_name,
            "object": "model",
            "created": int(self.front.started),
            "owned_by": "sglang",
            "root": args.served_model_name,
            "max_model_len": self.front.facts.context_len,
        }
        self._json(200, {"object": "list", "data": [card]})

    def _deprecated_server_info(self) -> None:
        self.front.log.warning(
            "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
            "Please use '/server_info' instead."
        )
        self._server_info()

    def _server_info(self) -> None:
        state = self.front.manager.internal_state()  # no timeout: blocks forever on a hung scheduler
        info: dict[str, object] = dict(server_args_items(self.front.args, self.front.facts))
        info.update(
            {
                "max_total_num_tokens": self.front.facts.kv_tokens,
                "max_req_input_len": self.front.facts.context_len - 1,
                "internal_states": [state],
                "version": SGLANG_VERSION,
                "kv_events": None,
            }
        )
        self._json(200, info)

    def _metrics(self) -> None:
        body = metrics.render(self.front.manager.metrics, self.front.args.served_model_name, self.front.http)
        self._respond(200, body, metrics.CONTENT_TYPE)

    def _refuse_when_down(self) -> bool:
        if self.front.manager.status is ServerStatus.SHUTTING_DOWN:
            self._json(503, {"error": {"message": "The server is shutting down."}})
            return True
        return False

    def _run(self, n_prompt: int, max_new: int) -> GenerateResult | None:
        try:
            return self.front.manager.generate(n_prompt, max_new, self._client_gone)
        except ClientDisconnected as e:
            self.front.log.error(f"[http_server] Error: {e}")
            with contextlib.suppress(OSError):
                self._json(400, {"error": {"message": str(e)}})
            return None

    def _generate(self) -> None:
        body = self._read_json()
        if body is None:
            self._json(400, {"error": {"message": "Invalid JSON body"}})
            return
        if self._refuse_when_down():
            return
        params = body.get("sampling_params")
        max_new = params.get("max_new_tokens") if isinstance(params, dict) else None
        max_new = max_new if isinstance(max_new, int) and max_new >= 0 else DEFAULT_MAX_NEW_TOKENS
        text = body.get("text")
        ids = body.get("input_ids")
        n_prompt = len(ids) if isinstance(ids, list) else prompt_tokens(text if isinstance(text, str) else "")
        result = self._run(n_prompt, max_new)
        if result is None:
            return
        meta: dict[str, object] = {
            "id": result.rid,
            "finish_reason": {"type": "length", "length": result.completion_tokens},
            "prompt_tokens": result.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": result.completion_tokens,
            "cached_tokens": 0,
            "e2e_latency": result.e2e_latency,
        }
        self._json(200, {"text": result.text, "meta_info": meta})

    def _completions(self) -> None:
        body = self._read_json()
        if body is None:
            self._json(400, {"object": "error", "message": "Invalid JSON body", "code": 400})
            return
        if self._refuse_when_down():
            return
        prompt = body.get("prompt")
        max_tokens = body.get("max_tokens")
        max_new = max_tokens if isinstance(max_tokens, int) and max_tokens >= 0 else 16
        result = self._run(prompt_tokens(prompt if isinstance(prompt, str) else ""), max_new)
        if result is None:
            return
        usage = {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
        }
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": "length"}
        self._json(
            200,
            {
                "id": result.rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.front.args.served_model_name,
                "choices": [choice],
                "usage": usage,
            },
        )
