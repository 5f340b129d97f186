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


def slack(req):
    """Slack's official slack_sdk signs (v0:ts:body, HMAC-SHA256)."""
    from slack_sdk.signature import SignatureVerifier

    sig = SignatureVerifier(req["secret"]).generate_signature(
        timestamp=str(req["ts"]), body=body_of(req)
    )
    return {"signature": sig}


def discord_keygen(req):
    """An Ed25519 application key pair, the public key in hex as Discord shows it."""
    from nacl.signing import SigningKey

    k = SigningKey.generate()
    return {"private_hex": k.encode().hex(), "public_hex": k.verify_key.encode().hex()}


def discord(req):
    """Signed with PyNaCl (Ed25519 over timestamp + body, as Discord signs); the
    official discord-interactions `verify_key` must accept it."""
    from discord_interactions import verify_key
    from nacl.signing import SigningKey

    body = body_of(req)
    ts = str(req["ts"])
    sig = SigningKey(bytes.fromhex(req["private_hex"])).sign(ts.encode() + body).signature.hex()
    assert verify_key(body, sig, ts, req["public_hex"]), "discord-interactions rejects it"
    return {"signature": sig}


def zoom(req):
    """Zoom's documented algorithm (no official Python library signs): x-zm-signature =
    v0=hex(HMAC-SHA256(secret token, "v0:{ts}:{body}")); the URL validation answer is
    hex(HMAC-SHA256(secret token, plainToken))."""
    key = req["secret"].encode()
    out = {}
    if "body_b64" in req:
        msg = b"v0:" + str(req["ts"]).encode() + b":" + body_of(req)
        out["signature"] = "v0=" + hmac.new(key, msg, hashlib.sha256).hexdigest()
    if "plain" in req:
        out["encrypted"] = hmac.new(key, req["plain"].encode(), hashlib.sha256).hexdigest()
    return out


def meta(req):
    """Meta's documented algorithm (no official Python library verifies):
    X-Hub-Signature-256 = sha256=hex(HMAC-SHA256(app secret, raw body))."""
    mac = hmac.new(req["secret"].encode(), body_of(req), hashlib.sha256)
    return {"signature": "sha256=" + mac.hexdigest()}


def twitter(req):
    """X's documented algorithm (its Python samples, no library): POSTs carry
    x-twitter-webhooks-signature = sha256=base64(HMAC-SHA256(consumer secret, body));
    the CRC answer is the same construction over the crc_token."""
    key = req["secret"].encode()
    msg = body_of(req) if "body_b64" in req else req["crc_token"].encode()
    return {"signature": "sha256=" + b64(hmac.new(key, msg, hashlib.sha256).digest())}


OPS = {
    "svix": svix,
    "slack": slack,
    "discord_keygen": discord_keygen,
    "discord": discord,
    "zoom": zoom,
    "meta": meta,
    "twitter": twitter,
}

if __name__ == "__main__":
    request = json.load(sys.stdin)
    json.dump(OPS[request["op"]](request), sys.stdout)
