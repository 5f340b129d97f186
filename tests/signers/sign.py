#!/usr/bin/env python3
"""Independent signers for idemgate's end-to-end provider tests.

Each provider's signing scheme is written here from its documentation, with Python's
hmac/hashlib and the `cryptography` package, so the tests check idemgate against an
implementation that shares no code with it.

Reads one JSON request on stdin, writes one JSON answer on stdout. Bytes travel as
base64 (`body_b64`), since bodies need not be UTF-8 (GBK Alipay notifications).
"""
import base64
import datetime
import hashlib
import hmac
import json
import sys
import urllib.parse


def b64(b):
    return base64.b64encode(b).decode()


def body_of(req):
    return base64.b64decode(req["body_b64"])


def github(req):
    mac = hmac.new(req["secret"].encode(), body_of(req), hashlib.sha256)
    return {"signature": "sha256=" + mac.hexdigest()}


def stripe(req):
    # The key is the secret string as written, whsec_ included.
    signed = str(req["ts"]).encode() + b"." + body_of(req)
    v1 = [hmac.new(s.encode(), signed, hashlib.sha256).hexdigest() for s in req["secrets"]]
    return {"header": "t=%d," % req["ts"] + ",".join("v1=" + s for s in v1)}


def shopify(req):
    mac = hmac.new(req["secret"].encode(), body_of(req), hashlib.sha256)
    return {"signature": b64(mac.digest())}


def slack(req):
    signed = b"v0:" + str(req["ts"]).encode() + b":" + body_of(req)
    return {"signature": "v0=" + hmac.new(req["secret"].encode(), signed, hashlib.sha256).hexdigest()}


def custom(req):
    body = body_of(req)
    signed = body if req.get("ts") is None else str(req["ts"]).encode() + b"." + body
    mac = hmac.new(req["secret"].encode(), signed, getattr(hashlib, req["hash"])).digest()
    text = mac.hex() if req["encoding"] == "hex" else b64(mac)
    return {"signature": req.get("prefix", "") + text}


def twilio(req):
    url = req["url"]
    if "params" in req:
        params = [(k, v) for k, v in req["params"]]
        s = url + "".join(k + v for k, v in sorted(set(params)))
        body = urllib.parse.urlencode(params).encode()
        query = None
    else:
        body = body_of(req)
        query = "bodySHA256=" + hashlib.sha256(body).hexdigest()
        s = url + "?" + query
    sig = b64(hmac.new(req["token"].encode(), s.encode(), hashlib.sha1).digest())
    return {"signature": sig, "body_b64": b64(body), "query": query}


def ed25519_keygen(req):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives import serialization as ser

    k = Ed25519PrivateKey.generate()
    raw = ser.Encoding.Raw
    return {
        "private_b64": b64(k.private_bytes(raw, ser.PrivateFormat.Raw, ser.NoEncryption())),
        "whpk": "whpk_" + b64(k.public_key().public_bytes(raw, ser.PublicFormat.Raw)),
    }


def standard_v1a(req):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    k = Ed25519PrivateKey.from_private_bytes(base64.b64decode(req["private_b64"]))
    signed = ("%s.%d." % (req["id"], req["ts"])).encode() + body_of(req)
    return {"signature": "v1a," + b64(k.sign(signed))}


def rsa_keygen(req):
    """An RSA-2048 key, its public key three ways, and a self-signed certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization as ser
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pub = key.public_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idemgate test platform")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(pub)
        .serial_number(int(req.get("serial", "1"), 16))
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    der = pub.public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
    return {
        "private_pem": key.private_bytes(
            ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()
        ).decode(),
        "public_pem": pub.public_bytes(
            ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo
        ).decode(),
        "public_b64": b64(der),
        "cert_pem": cert.public_bytes(ser.Encoding.PEM).decode(),
        "serial": "%X" % cert.serial_number,
    }


def rsa_sign(private_pem, message):
    from cryptography.hazmat.primitives import hashes, serialization as ser
    from cryptography.hazmat.primitives.asymmetric import padding

    key = ser.load_pem_private_key(private_pem.encode(), password=None)
    return b64(key.sign(message, padding.PKCS1v15(), hashes.SHA256()))


def alipay(req):
    """A signed notification body: the fields (minus sign, sign_type unless kept),
    sorted, k=v joined by &, in the charset's bytes; then form-encoded in it."""
    charset = req.get("charset", "utf-8")
    fields = [(k, v) for k, v in req["fields"]]
    excluded = {"sign"} if req.get("keep_sign_type") else {"sign", "sign_type"}
    signed = "&".join(
        "%s=%s" % (k, v) for k, v in sorted(fields, key=lambda kv: kv[0]) if k not in excluded
    )
    sign = rsa_sign(req["private_pem"], signed.encode(charset))
    body = urllib.parse.urlencode(fields + [("sign", sign)], encoding=charset)
    return {"body_b64": b64(body.encode("ascii"))}


def wechatpay(req):
    message = ("%s\n%s\n" % (req["ts"], req["nonce"])).encode() + body_of(req) + b"\n"
    return {"signature": rsa_sign(req["private_pem"], message)}


OPS = {
    "github": github,
    "stripe": stripe,
    "shopify": shopify,
    "slack": slack,
    "custom": custom,
    "twilio": twilio,
    "ed25519_keygen": ed25519_keygen,
    "standard_v1a": standard_v1a,
    "rsa_keygen": rsa_keygen,
    "alipay": alipay,
    "wechatpay": wechatpay,
}

if __name__ == "__main__":
    request = json.load(sys.stdin)
    json.dump(OPS[request["op"]](request), sys.stdout)
