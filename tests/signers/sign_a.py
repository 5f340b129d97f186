#!/usr/bin/env python3
"""Signers for the handshake and Svix provider tests, from each provider's official
library where it has one (see each op), so idemgate is checked against code it shares
nothing with.

Reads one JSON request on stdin, writes one JSON answer on stdout; bytes travel as
base64 (`body_b64`).
"""
import base64
import datetime
import hashlib
import hmac
import json
import sys


def b64(b):
    return base64.b64encode(b).decode()


def body_of(req):
    return base64.b64decode(req["body_b64"])


def svix(req):
    """Svix's official library signs; its verifier must accept the svix-* spelling."""
    from svix.webhooks import Webhook

    wh = Webhook(req["secret"])
    ts = datetime.datetime.fromtimestamp(req["ts"], tz=datetime.timezone.utc)
    body = body_of(req)
    sig = wh.sign(req["id"], ts, body.decode())
    if req.get("check", True):
        Webhook(req["secret"]).verify(
            body,
            {"svix-id": req["id"], "svix-timestamp": str(req["ts"]), "svix-signature": sig},
        )
    return {"signature": sig}


OPS = {
    "svix": svix,
}

if __name__ == "__main__":
    request = json.load(sys.stdin)
    json.dump(OPS[request["op"]](request), sys.stdout)
