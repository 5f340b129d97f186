#!/usr/bin/env python3
"""Independent signers for the second set of provider presets (e2e_presets_b).

Each function signs with the provider's official library where it has a signing
function (HubSpot, Adyen), or else writes the documented algorithm with Python's
hmac/hashlib/`cryptography` and then asserts that the official library's own verify
function accepts the result (Razorpay, Square, Paddle, Mailgun, SendGrid), so a
disagreement with the official library fails the test. Bitbucket, Intercom, Linear and
GitLab publish no Python library: their documented algorithm is used as it stands.

Reads one JSON request on stdin, writes one JSON answer on stdout; bytes travel as
base64 (`body_b64`).
"""
import base64
import hashlib
import hmac
import json
import sys


def b64(b):
    return base64.b64encode(b).decode()


def body_of(req):
    return base64.b64decode(req["body_b64"])


def hmac_hex(secret, msg, alg=hashlib.sha256):
    return hmac.new(secret.encode(), msg, alg).hexdigest()


def razorpay(req):
    from razorpay.utility.utility import Utility

    body = body_of(req)
    sig = hmac_hex(req["secret"], body)
    assert Utility(None).verify_webhook_signature(body.decode(), sig, req["secret"])
    return {"signature": sig}


def bitbucket(req):
    # Documented: X-Hub-Signature = "sha256=" + hex HMAC-SHA256(secret, body).
    return {"signature": "sha256=" + hmac_hex(req["secret"], body_of(req))}


def intercom(req):
    # Documented: X-Hub-Signature = "sha1=" + hex HMAC-SHA1(client secret, body).
    return {"signature": "sha1=" + hmac_hex(req["secret"], body_of(req), hashlib.sha1)}


def square(req):
    from square.utils.webhooks_helper import verify_signature

    body = body_of(req)
    msg = req["url"].encode() + body
    sig = b64(hmac.new(req["secret"].encode(), msg, hashlib.sha256).digest())
    assert verify_signature(
        request_body=body.decode(),
        signature_header=sig,
        signature_key=req["secret"],
        notification_url=req["url"],
    )
    return {"signature": sig}


def linear(req):
    # Documented (and as @linear/sdk's LinearWebhookClient checks it): Linear-Signature
    # = hex HMAC-SHA256(secret, body); webhookTimestamp (ms) is inside the body.
    return {"signature": hmac_hex(req["secret"], body_of(req))}


def paddle(req):
    from paddle_billing.Notifications.PaddleSignature import PaddleSignature
    from paddle_billing.Notifications.Secret import Secret

    body = body_of(req)
    ts = req["ts"]
    h1 = [hmac_hex(s, b"%d:" % ts + body) for s in req["secrets"]]
    header = "ts=%d;" % ts + ";".join("h1=" + h for h in h1)
    assert PaddleSignature().verify(header, body.decode(), [Secret(s) for s in req["secrets"]])
    return {"header": header}


def hubspot(req):
    from hubspot.utils.signature import Signature

    body = body_of(req).decode()
    ts = str(req["ts_ms"])
    sig = Signature.get_signature(
        req["secret"], body, "v3", http_uri=req["url"], http_method="POST", timestamp=ts
    )
    mine = b64(
        hmac.new(
            req["secret"].encode(), ("POST" + req["url"] + body + ts).encode(), hashlib.sha256
        ).digest()
    )
    assert sig == mine, (sig, mine)
    return {"signature": sig}


def mailgun(req):
    from mailgun.security import SecurityGuard

    ts, token = str(req["ts"]), req["token"]
    sig = hmac_hex(req["secret"], (ts + token).encode())
    assert SecurityGuard.verify_webhook(req["secret"], token, ts, sig, max_age_seconds=0)
    return {"signature": sig}


def ec_keygen(req):
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    k = ec.generate_private_key(ec.SECP256R1())
    der = k.public_key().public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
    pem = k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    # The verification key as SendGrid's settings page shows it: base64 DER, no PEM lines.
    return {"private_pem": pem.decode(), "public_b64": b64(der)}


def sendgrid(req):
    from cryptography.hazmat.primitives import hashes, serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec
    from sendgrid.helpers.eventwebhook import EventWebhook

    key = ser.load_pem_private_key(req["private_pem"].encode(), password=None)
    body = body_of(req)
    ts = str(req["ts"])
    sig = b64(key.sign(ts.encode() + body, ec.ECDSA(hashes.SHA256())))
    hook = EventWebhook(req["public_b64"])
    assert hook.verify_signature(body.decode(), sig, ts)
    return {"signature": sig}


def adyen(req):
    from Adyen.util import generate_notification_sig, is_valid_hmac_notification

    doc = json.loads(body_of(req))
    for item in doc["notificationItems"]:
        n = item["NotificationRequestItem"]
        unsigned = dict(n)
        unsigned.pop("additionalData", None)
        sig = generate_notification_sig(unsigned, req["hex_key"]).decode()
        n.setdefault("additionalData", {})["hmacSignature"] = sig
        assert is_valid_hmac_notification(n, req["hex_key"])
    return {"body_b64": b64(json.dumps(doc).encode())}


def gitlab_standard(req):
    # GitLab's signing token follows Standard Webhooks: v1,<base64 HMAC-SHA256(
    # base64-decoded whsec_ secret, "{id}.{timestamp}.{body}")>.
    key = base64.b64decode(req["secret"][len("whsec_"):])
    signed = ("%s.%d." % (req["id"], req["ts"])).encode() + body_of(req)
    return {"signature": "v1," + b64(hmac.new(key, signed, hashlib.sha256).digest())}


OPS = {f.__name__: f for f in [
    razorpay, bitbucket, intercom, square, linear, paddle, hubspot, mailgun, ec_keygen,
    sendgrid, adyen, gitlab_standard,
]}

if __name__ == "__main__":
    request = json.load(sys.stdin)
    json.dump(OPS[request["op"]](request), sys.stdout)
