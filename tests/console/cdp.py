"""Drives Debian's chromium through the DevTools protocol, with the
standard library only (no Selenium, no Playwright): the console's browser
test types the token, ticks a dead letter and clicks its buttons as an
operator does, and reads what the page shows.

    with Browser(profile_dir, log) as b:
        b.open(url)
        b.wait("document.querySelector('#partitions tr') !== null")
        b.js("document.getElementById('token').value = 't'")
        b.screenshot(path)

The browser is headless, 1280x900; it ends with the with-block, also
when the test fails."""
import base64
import json
import os
import socket
import struct
import subprocess
import time
import urllib.request


class Browser:
    def __init__(self, profile, log):
        self.profile, self.log = profile, log
        self.proc = self.sock = None
        self.next_id = 0

    def __enter__(self):
        os.makedirs(self.profile, exist_ok=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        if os.path.exists(port_file):
            os.remove(port_file)
        self.proc = subprocess.Popen(
            ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--disable-dev-shm-usage",
             "--remote-debugging-port=0", "--remote-allow-origins=*",
             "--user-data-dir=" + self.profile, "--window-size=1280,900",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"))
        deadline = time.time() + 30
        while not os.path.exists(port_file) or os.path.getsize(port_file) == 0:
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not start: see " + self.log)
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self._connect(port, page["webSocketDebuggerUrl"])
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=1280,
                  height=900, deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc):
        if self.sock:
            self.sock.close()
        if self.proc:
            self.proc.kill()
            self.proc.wait()

    # ---- a websocket client, enough for DevTools (RFC 6455) ----

    def _connect(self, port, url):
        path = url.split(str(port), 1)[1]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
             "Upgrade: websocket\r\nConnection: Upgrade\r\n"
             f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
             ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError("DevTools refused the websocket: " + head.decode())

    def _send(self, text):
        data = text.encode()
        head = bytes([0x81])
        if len(data) < 126:
            head += bytes([0x80 | len(data)])
        elif len(data) < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", len(data))
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", len(data))
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise RuntimeError("DevTools closed the connection")
            buf += chunk
        return buf

    def _recv(self):
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            message += self._exact(n)
            if b0 & 0x80:
                return json.loads(message)

    # ---- DevTools ----

    def call(self, method, **params):
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = self._recv()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def open(self, url):
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'")

    def js(self, expression):
        """The value of @expression in the page (a promise awaited)."""
        r = self.call("Runtime.evaluate", expression=expression,
                      awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression, timeout=30):
        """Waits until @expression is true in the page."""
        deadline = time.time() + timeout
        while not self.js(expression):
            if time.time() > deadline:
                raise TimeoutError(f"never true within {timeout} s: {expression}")
            time.sleep(0.1)

    def rows(self, tbody):
        """The cell texts of each row of <tbody id=tbody>."""
        return self.js(f"[...document.querySelectorAll('#{tbody} tr')]"
                       ".map((r) => [...r.cells].map((c) => c.textContent))")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
