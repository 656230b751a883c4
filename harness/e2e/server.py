"""``python -m harness serve``: the micro-engine as an OpenAI-compatible HTTP server, loopback only
(stdlib ``http.server``; the A/B client needs nothing more).

Endpoints: ``GET /v1/models``, ``POST /v1/completions`` (``prompt`` a string or a list,
``max_tokens``, ``stop``; greedy whatever ``temperature`` says) and ``POST /v1/chat/completions``
(the messages' contents joined). One engine call at a time (a lock); a list prompt is one batch.
A prompt longer than the model's window keeps its last tokens (the micro-models see 512
characters), and ``usage.truncated_prompt_tokens`` says how many were dropped.

The "fused switch" is ``--path prepare+attn`` (e.g. ``fused+fused`` vs ``reference+reference``);
``--path-mutant NAME`` serves a path mutant of ``cases/mutants/timelines.py``.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness.e2e import drafters as D
from harness.e2e import engine as E
from harness.e2e import tokenizer as tok

HOST = "127.0.0.1"  # loopback only, by construction


class MicroService:
    def __init__(self, model, path, *, name: str, speculative: bool, device="cpu"):
        self.model, self.path, self.name, self.speculative, self.device = model, path, name, speculative, device
        self.lock = threading.Lock()

    def complete(self, prompts: list[str], max_tokens: int, stop: list[str]) -> tuple[list[str], dict]:
        room = self.model.cfg.max_len - max_tokens - 6
        if room < 8:
            raise ValueError(f"max_tokens {max_tokens} leaves no room in the window {self.model.cfg.max_len}")
        ids = [tok.encode(p) for p in prompts]
        cut = sum(max(0, len(x) - room) for x in ids)
        ids = [x[-room:] for x in ids]
        with self.lock:
            out = E.Engine(self.model, self.path, device=self.device).generate(
                ids, max_tokens, drafter=D.PromptLookup() if self.speculative else None)
        texts = []
        for t in out.tokens:
            s = tok.decode(t)
            for st in stop:
                if st and st in s:
                    s = s[: s.index(st)]
            texts.append(s)
        usage = {"prompt_tokens": sum(map(len, ids)), "completion_tokens": sum(map(len, out.tokens)),
                 "truncated_prompt_tokens": cut, "mean_accept_len": out.mean_accept_len if self.speculative else None}
        return texts, usage


def _handler(svc: MicroService):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _send(self, code: int, obj: dict):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.rstrip("/") == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": svc.name, "object": "model"}]})
            if self.path.rstrip("/") == "/health":
                return self._send(200, {"ok": True})
            self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                chat = self.path.rstrip("/") == "/v1/chat/completions"
                if not chat and self.path.rstrip("/") != "/v1/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if chat:
                    prompts = ["\n".join(m.get("content", "") for m in req.get("messages", []))]
                else:
                    p = req.get("prompt", "")
                    prompts = [p] if isinstance(p, str) else list(p)
                stop = req.get("stop") or []
                stop = [stop] if isinstance(stop, str) else list(stop)
                texts, usage = svc.complete(prompts, int(req.get("max_tokens", 128)), stop)
            except (ValueError, TypeError, KeyError) as exc:
                return self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
            if chat:
                choices = [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
                           for i, t in enumerate(texts)]
            else:
                choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": "stop"} for i, t in enumerate(texts)]
            self._send(200, {"id": f"cmpl-{time.time_ns()}", "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": svc.name, "choices": choices, "usage": usage})
    return H


def make_server(svc: MicroService, port: int = 0) -> ThreadingHTTPServer:
    return ThreadingHTTPServer((HOST, port), _handler(svc))


def build_service(args) -> MicroService:
    from cases.mutants import timelines as mt
    from harness import devices
    from harness.timelines import path as path_mod
    from harness.e2e import gate
    from harness.ops import default_registry

    dev = devices.select(args.device)
    reg = default_registry()
    model, model_id, _ = gate.load_model(args.layout, args.models, dev.torch_device)
    prep, attn = args.path.split("+")
    path = path_mod.clean_path(reg, args.layout, prepare=prep, attn=attn)
    if getattr(args, "path_mutant", None):
        m = next(x for x in mt.PATH_MUTANTS if x.name == args.path_mutant)
        path = replace(path_mod.clean_path(reg, args.layout, prepare=prep, attn=attn, backend=m), name=m.name)
    name = f"{args.layout}:{path.name}{':spec' if args.speculative else ''}"
    return MicroService(model, path, name=name, speculative=args.speculative, device=dev.torch_device)


def main(args) -> int:
    srv = make_server(build_service(args), args.port)
    print(f"serving {HOST}:{srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0
