"""A Data-Juicer worker: imports Data-Juicer once, then runs recipes over HTTP on localhost.

    /path/to/.venv-dj/bin/python trinity/data/dj_worker.py --port 0 --port-file /tmp/port

Run with the Python of Data-Juicer's own environment (`make setup-data-juicer`), never this
project's: this file is standalone (the standard library and `data_juicer` only; it imports
nothing of `trinity`). `trinity.data.dj_server` starts it (`service.data_juicer.auto_start`) or
finds it at `service.data_juicer.server_url`. A recipe run here is what `dj-process --config`
does (`init_configs`, then `DefaultExecutor(cfg).run()`), minus Data-Juicer's import and start,
which this process paid once.

    GET  /health   200 {"status": "ok", "server": "trinity-dj-worker", "pid", "data_juicer",
                        "busy"}
    POST /process  {"process": [{op_name: {args}}, ...], "rows": [{...}, ...]}
                   or {"process": [...], "dataset_path": "rows.jsonl"}
                   200 {"rows": [...], "stats": {"input_rows", "output_rows", "seconds"}}
                   400 {"error": ...} a malformed request; 500 {"error": ..., "traceback": ...}
                   Data-Juicer's own message when the recipe fails

Recipes run one at a time (a lock: Data-Juicer's executor is not made for threads); /health
answers meanwhile. The port is written to `--port-file` once the server listens (port 0: a free
one). The worker exits when its standard input closes (`--exit-on-stdin-eof`): the process
that started it holds the other end, so the worker never outlives it, even when it is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SERVER_NAME = "trinity-dj-worker"  # /health's "server": what `dj_server` recognises as ours
RUN_LOCK = threading.Lock()


def run_recipe(process: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` through the recipe `process` by Data-Juicer in this process, as `dj-process` runs
    a recipe file: its config parsed by `init_configs`, run by `DefaultExecutor`, exported as
    jsonl; the exported rows."""
    from data_juicer.config import init_configs
    from data_juicer.core import DefaultExecutor

    with tempfile.TemporaryDirectory(prefix="trinity-dj-worker-") as tmp:
        src, out, recipe = Path(tmp, "in.jsonl"), Path(tmp, "out.jsonl"), Path(tmp, "recipe.yaml")
        src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        doc = {"dataset_path": str(src), "export_path": str(out), "process": process}
        recipe.write_text(json.dumps(doc))  # JSON is YAML: no yaml module needed here
        cfg = init_configs(args=["--config", str(recipe)])
        DefaultExecutor(cfg).run()
        if not out.is_file():
            raise RuntimeError(f"Data-Juicer exported nothing to {out}")
        return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


class Handler(BaseHTTPRequestHandler):
    """GET /health and POST /process (module doc)."""

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/health":
            self._send(404, {"error": f"no such path {self.path!r}: GET /health, POST /process"})
            return
        import data_juicer

        self._send(
            200,
            {
                "status": "ok",
                "server": SERVER_NAME,
                "pid": os.getpid(),
                "data_juicer": getattr(data_juicer, "__version__", "unknown"),
                "busy": RUN_LOCK.locked(),
            },
        )

    def do_POST(self) -> None:
        if self.path != "/process":
            self._send(404, {"error": f"no such path {self.path!r}: GET /health, POST /process"})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            process = body["process"]
            if not isinstance(process, list):
                raise ValueError("`process` must be a list of {op_name: {args}}")
            if "rows" in body:
                rows = body["rows"]
            else:
                lines = Path(body["dataset_path"]).read_text().splitlines()
                rows = [json.loads(line) for line in lines if line.strip()]
        except (ValueError, KeyError, TypeError, OSError) as e:
            self._send(400, {"error": f"bad request: {type(e).__name__}: {e}"})
            return
        t0 = time.perf_counter()
        with RUN_LOCK:
            try:
                kept = run_recipe(process, rows)
            except BaseException as e:  # Data-Juicer's error, reported to the caller
                message = "".join(traceback.format_exception_only(type(e), e)).strip()
                self._send(500, {"error": message, "traceback": traceback.format_exc()[-4000:]})
                return
        seconds = time.perf_counter() - t0
        stats = {"input_rows": len(rows), "output_rows": len(kept), "seconds": seconds}
        self._send(200, {"rows": kept, "stats": stats})

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"dj-worker {self.address_string()} {format % args}\n")


def exit_when_stdin_closes() -> None:
    """End this process once its standard input reaches EOF (its starter is gone). It reads
    the file descriptor, not `sys.stdin`: a thread blocked in `sys.stdin`'s read holds its lock,
    and a process Data-Juicer forks (`num_proc` > 1) closes `sys.stdin` first thing, waiting
    on that lock for ever."""
    try:
        while os.read(0, 1 << 16):
            pass
    finally:
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--port-file", help="written with the port once the server listens")
    p.add_argument("--exit-on-stdin-eof", action="store_true")
    args = p.parse_args(argv)
    if args.exit_on_stdin_eof:
        threading.Thread(target=exit_when_stdin_closes, daemon=True).start()
    # Data-Juicer's import and start, paid once: the executor and the op registry
    import data_juicer.config
    import data_juicer.core  # noqa: F401

    try:
        server = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as e:
        sys.exit(f"dj-worker: cannot listen on {args.host}:{args.port}: {e}")
    port = server.server_address[1]
    if args.port_file:
        part = f"{args.port_file}.part"
        Path(part).write_text(str(port))
        os.replace(part, args.port_file)
    print(f"dj-worker: pid {os.getpid()} serving on http://{args.host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
