#!/usr/bin/env python3
"""Writes wrk's request data: per wrk thread, a text file of signed Standard Webhooks
deliveries (ids and `v1` signatures over `{id}.{ts}.{body}`), a chosen share of which
repeat an id that the same thread sent at least 200 requests earlier (so the copy
finds it completed: a duplicate, not an in-flight 409).

usage: gen_requests.py OUT_DIR THREADS PER_THREAD DUP_SHARE SECRET [ID_PREFIX]
(ID_PREFIX, default msg: another prefix gives ids no other data set holds.)
"""
import base64, hashlib, hmac, os, random, sys, time

out, threads, per_thread, dup, secret = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
prefix = sys.argv[6] if len(sys.argv) > 6 else "msg"
key = base64.b64decode(secret.removeprefix("whsec_"))
ts = int(time.time())
payload = '{"type":"payment.succeeded","data":{"order":"A-1","amount":100,"note":"' 
body = (payload + "x" * (1024 - len(payload) - 3) + '"}}').encode()
assert len(body) == 1024, len(body)
rng = random.Random(42)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "body.txt"), "wb") as f:
    f.write(body)
for t in range(threads):
    seq = []
    fresh = 0
    for i in range(per_thread):
        if i >= 400 and rng.random() < dup:
            seq.append(seq[i - 200 - rng.randrange(200)])
        else:
            seq.append(f"{prefix}_{ts}_{t}_{fresh}")
            fresh += 1
    # One "id signature" line per request; the first line is the timestamp.
    with open(os.path.join(out, f"data_{t}.txt"), "w") as f:
        f.write(f"{ts}\n")
        for mid in seq:
            sig = base64.b64encode(hmac.new(key, f"{mid}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
            f.write(f"{mid} v1,{sig}\n")
