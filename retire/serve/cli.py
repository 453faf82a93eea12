"""`retire serve MODEL [vLLM engine flags] [--policy P] [--api-keys FILE] [--host H --port P]`.

Invariants:
- The socket is bound and served first; until the engine is up every request is answered 503, and the URL is
  printed at once (`retire serve: starting ... on URL`), then `retire serve: ready on URL` when requests are served.
- A missing seam, a bad flag or an engine that fails to start ends the process with a message and exit status 1
  (2 for usage errors); SIGINT/SIGTERM close the facade (engine included) before exit.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys

log = logging.getLogger("retire.serve")


def parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from ..engine import POLICIES

    p = make_arg_parser(FlexibleArgumentParser(prog="retire serve",
                                               description="vLLM's OpenAI-compatible server with SUPERSEDE"))
    g = p.add_argument_group("retire")
    g.add_argument("--policy", choices=POLICIES, default="retire", help="revision policy of every scope")
    g.add_argument("--api-keys", dest="api_keys_file", default=None,
                   help="file mapping bearer keys to tenants (JSON object, or lines 'KEY TENANT'); "
                        "without it there is one tenant and no key is needed")
    g.add_argument("--max-body-bytes", type=int, default=16 << 20, help="larger request bodies get 413")
    g.add_argument("--socket-sndbuf", type=int, default=64 * 1024,
                   help="SO_SNDBUF of each connection (0: kernel autotuning); bounds what a stalled client can "
                        "still read of a revoked stream")
    g.add_argument("--admit-timeout", type=float, default=300.0,
                   help="bound on the wait for the engine to admit a scoped request (then 504)")
    return p


def _fail(msg: str, code: int = 1) -> int:
    print(f"retire serve: error: {msg}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str]) -> int:
    from . import app as build
    from ..errors import SeamMissing
    from .tenants import Tenants

    try:
        build.check_import_seams()
    except SeamMissing as e:
        return _fail(str(e))
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup

    cli_env_setup()
    args = parser().parse_args(argv)
    if args.model_tag:
        args.model = args.model_tag
    if getattr(args, "api_key", None):
        return _fail("retire serve maps keys to tenants with --api-keys FILE; --api-key is not supported", 2)
    args.enable_prompt_tokens_details = True  # usage.prompt_tokens_details.cached_tokens (vLLM's own count)
    try:
        tenants = Tenants.from_file(args.api_keys_file)
        kwargs = build.engine_kwargs(args)
    except (OSError, ValueError) as e:
        return _fail(str(e), 2)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import uvloop

    return uvloop.run(serve(args, tenants, kwargs))


async def serve(args, tenants, kwargs) -> int:
    import uvicorn

    from ..errors import RetireError
    from . import app as build, metrics
    from .middleware import RetireASGI
    from .transport import protocol

    server = RetireASGI(tenants, max_body_bytes=args.max_body_bytes, admit_bound=args.admit_timeout)
    host = args.host or "127.0.0.1"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, args.port))
    sock.listen(2048)  # connections queue from now on; uvicorn accepts them (503 until ready)
    url = f"http://{host}:{sock.getsockname()[1]}"
    config = uvicorn.Config(server, http=protocol(args.socket_sndbuf), lifespan="on", log_level=args.uvicorn_log_level,
                            access_log=not args.disable_uvicorn_access_log, timeout_keep_alive=5)
    userver = uvicorn.Server(config)
    userver.install_signal_handlers = lambda: None  # ours below: close the engine first
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serving = loop.create_task(userver.serve(sockets=[sock]))
    print(f"retire serve: starting ({args.policy}, {len(tenants.names)} tenant(s)) on {url}; 503 until ready",
          flush=True)
    eng = None
    code = 0
    try:
        from ..engine import RetireEngine

        eng = await loop.run_in_executor(None, lambda: RetireEngine(args.model, args.policy, **kwargs))
        app, client = await build.build_vllm_app(args, eng)
        metrics.install(server)
        names = args.served_model_name or [args.model]
        server.ready(app, eng, client, names[0])
        print(f"retire serve: ready on {url} (model {names[0]!r}, policy {args.policy})", flush=True)
        await asyncio.wait([serving, loop.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    except (RetireError, ValueError, RuntimeError, OSError) as e:
        server.failure = str(e)
        code = _fail(f"{type(e).__name__}: {e}")
    finally:
        userver.should_exit = True
        if eng is not None:
            await eng.close()
        try:
            await asyncio.wait_for(serving, 30)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
    return code
