"""Sends one request to the injector over HTTPS and reports, as JSON on stdout, what
came back; when the answer is an AdmissionReview with a patch, applies the patch to
the request's pod with the `jsonpatch` package (RFC 6902, independent of idemgate) and
validates the result strictly against the Kubernetes schemas (kubernetes-validate).

usage: review.py URL CA_PEM BODY_FILE       POST BODY_FILE to URL
       review.py URL CA_PEM --get           GET URL
       review.py URL CA_PEM --length N      send only a head declaring N bytes
       review.py URL CA_PEM --chunked N     send N bytes, chunked, no Content-Length
       review.py URL CA_PEM --stall         declare 100 bytes, send 10 ("sent" on stderr),
                                            wait for the answer
       review.py URL CA_PEM --idle N        connect, send nothing; report when the server
                                            closes the connection (up to N seconds)
       review.py URL CA_PEM --silent K N    open K connections (handshakes done, "open" on
                                            stderr), send nothing; report how many the
                                            server closed within N seconds, and when

Output: {"status", "body" (parsed JSON, else text), "patch", "patched", "invalid",
"elapsed" (seconds from connecting to the whole answer)}.
"""
import base64
import json
import select
import socket
import ssl
import sys
import time
from urllib.parse import urlsplit

import jsonpatch
import kubernetes_validate

K8S_VERSION = "1.37.0"


def connect(url, ca):
    u = urlsplit(url)
    ctx = ssl.create_default_context(cafile=ca)
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    return ctx.wrap_socket(sock, server_hostname=u.hostname), u


def read_response(s):
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not chunk:
            break
        data += chunk
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            length = None
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v.strip())
            if length is not None and len(rest) >= length:
                break
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, body


def send(url, ca, body=None, length=None, chunked=None, method="POST"):
    s, u = connect(url, ca)
    if method == "GET":
        s.sendall(f"GET {u.path} HTTP/1.1\r\nHost: {u.hostname}\r\nConnection: close\r\n\r\n".encode())
        status, raw = read_response(s)
        s.close()
        return status, raw
    head = f"POST {u.path} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\nConnection: close\r\n"
    if chunked is not None:
        s.sendall((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
        piece = b"x" * 65536
        sent = 0
        try:
            while sent < chunked:
                n = min(len(piece), chunked - sent)
                s.sendall(b"%x\r\n" % n + piece[:n] + b"\r\n")
                sent += n
            s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
    elif length is not None:
        s.sendall((head + f"Content-Length: {length}\r\n\r\n").encode())
    else:
        s.sendall((head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    status, raw = read_response(s)
    s.close()
    return status, raw


def idle(url, ca, seconds):
    s, _ = connect(url, ca)
    s.settimeout(seconds)
    start = time.monotonic()
    try:
        closed = s.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        closed = True
    except socket.timeout:
        closed = False
    return {"closed_after": time.monotonic() - start if closed else None}


def silent(url, ca, count, seconds):
    socks = [connect(url, ca)[0] for _ in range(count)]
    for s in socks:
        s.setblocking(False)
    print("open", file=sys.stderr, flush=True)
    start = time.monotonic()
    last = None
    while socks and time.monotonic() - start < seconds:
        readable, _, _ = select.select(socks, [], [], seconds - (time.monotonic() - start))
        for s in readable:
            try:
                closed = s.recv(1) == b""
            except ssl.SSLWantReadError:
                closed = False  # a TLS record that is not data (a session ticket)
            except (ConnectionResetError, ssl.SSLError):
                closed = True
            if closed:
                socks.remove(s)
                last = time.monotonic() - start
    return {"closed": count - len(socks), "last_closed_after": last}


def main():
    url, ca, what = sys.argv[1], sys.argv[2], sys.argv[3]
    body = None
    if what == "--idle":
        json.dump(idle(url, ca, float(sys.argv[4])), sys.stdout)
        return
    if what == "--silent":
        json.dump(silent(url, ca, int(sys.argv[4]), float(sys.argv[5])), sys.stdout)
        return
    if what == "--stall":
        s, u = connect(url, ca)
        start = time.monotonic()
        s.sendall(f"POST {u.path} HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Length: 100\r\n\r\n".encode() + b"{" * 10)
        print("sent", file=sys.stderr, flush=True)
        status, raw = read_response(s)
        json.dump({"status": status, "after": time.monotonic() - start}, sys.stdout)
        return
    if what == "--get":
        status, raw = send(url, ca, method="GET")
    elif what == "--length":
        status, raw = send(url, ca, length=int(sys.argv[4]))
    elif what == "--chunked":
        status, raw = send(url, ca, chunked=int(sys.argv[4]))
    else:
        with open(what, "rb") as f:
            body = f.read()
        start = time.monotonic()
        status, raw = send(url, ca, body=body)
        elapsed = time.monotonic() - start
    out = {"status": status, "body": None, "patch": None, "patched": None, "invalid": None}
    if body is not None:
        out["elapsed"] = elapsed
    try:
        out["body"] = json.loads(raw)
    except ValueError:
        out["body"] = raw.decode("utf-8", "replace")
    response = out["body"].get("response", {}) if isinstance(out["body"], dict) else {}
    if "patch" in response:
        assert response.get("patchType") == "JSONPatch", response
        patch = json.loads(base64.b64decode(response["patch"]))
        pod = json.loads(body)["request"]["object"]
        patched = jsonpatch.JsonPatch(patch).apply(pod)
        out["patch"] = patch
        out["patched"] = patched
        try:
            kubernetes_validate.validate(patched, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            out["invalid"] = f"{e.message} at {'/'.join(str(p) for p in e.path)}"
        except Exception as e:  # noqa: BLE001 - any other failure is reported, not hidden
            out["invalid"] = repr(e)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
