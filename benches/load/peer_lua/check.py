#!/usr/bin/env python3
"""Checks the nginx + Lua + Redis peer before it is measured: deliveries signed here
with Python's hmac must pass (200, then the stored answer for the copy), and a wrong
signature, a stale timestamp or a missing header must not (401/400). Exits non-zero on
the first wrong answer, so run.sh never reports figures of a peer that skips the work.

usage: check.py PORT SECRET
"""
import base64, hashlib, hmac, http.client, sys, time

port, secret = int(sys.argv[1]), sys.argv[2]
key = base64.b64decode(secret.removeprefix("whsec_"))
body = b'{"type":"peer.check","data":{"n":1}}'


def sign(mid, ts, k=key, b=body):
    mac = hmac.new(k, f"{mid}.{ts}.".encode() + b, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def post(headers, b=body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("POST", "/webhooks/load", body=b, headers={"content-type": "application/json", **headers})
    r = c.getresponse()
    out = (r.status, r.getheader("idempotent-replayed"), r.read())
    c.close()
    return out


def delivery(mid, ts, sig):
    return {"webhook-id": mid, "webhook-timestamp": str(ts), "webhook-signature": sig}


failures = []


def expect(name, got, status, replayed=None, text=None):
    ok = got[0] == status and (replayed is None or got[1] == replayed) and (text is None or got[2] == text)
    print(f"peer check: {name}: {got[0]}{' (replayed)' if got[1] else ''} {'ok' if ok else 'WRONG'}", file=sys.stderr)
    if not ok:
        failures.append(f"{name}: expected {status}, got {got[0]} replayed={got[1]} body={got[2][:200]!r}")


now = int(time.time())
mid = f"peer_check_{now}_{time.monotonic_ns()}"
good = delivery(mid, now, sign(mid, now))
expect("signed delivery", post(good), 200, None, b"ok")
expect("its copy", post(good), 200, "true", b"ok")
expect("a second v1 entry matches", post(delivery(mid + "_2", now, "v1,AAAA " + sign(mid + "_2", now))), 200, None, b"ok")
expect("signed with another secret", post(delivery(mid + "_3", now, sign(mid + "_3", now, k=b"another secret"))), 401)
expect("body changed after signing", post(delivery(mid + "_4", now, sign(mid + "_4", now)), b=body + b" "), 401)
expect("stale timestamp", post(delivery(mid + "_5", now - 3600, sign(mid + "_5", now - 3600))), 401)
expect("no signature header", post({"webhook-id": mid + "_6", "webhook-timestamp": str(now)}), 400)

if failures:
    sys.exit("the nginx + Lua + Redis peer answers wrongly:\n  " + "\n  ".join(failures))
