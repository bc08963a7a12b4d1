"""A server to run inside a sandbox, for the tests and benchmarks of ports
reached from outside (crates/airlock/tests/ports.rs, tests/e2b/test_ports.py,
bench/ports.py). Python's standard library only.

    python3 port_server.py PORT

- `GET /bytes/N`: N bytes (`x`), for throughput;
- any other `GET`: JSON of the path it was asked for, the headers it got
  (so a test sees what went in) and the client's port (`peer`: the same
  for requests over one kept-alive connection);
- `POST`: the body back;
- a WebSocket handshake on any path: a WebSocket echo, each text or binary
  message answered with `echo: ` and the message.
"""

import base64
import hashlib
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        if self.path.startswith("/bytes/"):
            return self.reply(200, b"x" * int(self.path[7:]), "application/octet-stream")
        seen = {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                "peer": self.client_address[1]}
        self.reply(200, json.dumps(seen).encode(), "application/json")

    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(200, data, "application/octet-stream")

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = int.from_bytes(self.rfile.read(2), "big")
            elif length == 127:
                length = int.from_bytes(self.rfile.read(8), "big")
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            reply = b"echo: " + data
            if len(reply) < 126:
                size = bytes([len(reply)])
            else:
                size = bytes([126]) + len(reply).to_bytes(2, "big")
            self.wfile.write(bytes([0x80 | opcode]) + size + reply)
            self.wfile.flush()


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
