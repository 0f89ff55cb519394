"""A local HTTP server over in-memory files, shared by the download and reliability tests.

``/ok/<name>`` serves the file; ``/cut/<name>`` announces the full length, sends half and
closes (an interrupted transfer); ``/stall/<name>`` sends a third and then hangs (a dead
connection). Unknown names get 404.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time


class FileHandler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):
        name = self.path.strip("/").split("?")[0]
        mode, _, name = name.rpartition("/")
        body = self.files.get(name)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "cut":
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if mode == "stall":
            self.wfile.write(body[: len(body) // 3])
            self.wfile.flush()
            time.sleep(30)
            return
        self.wfile.write(body)


def start(files: dict[str, bytes]) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``files`` on 127.0.0.1 in a daemon thread; return the server and its base URL."""
    handler = type("Handler", (FileHandler,), {"files": files})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
