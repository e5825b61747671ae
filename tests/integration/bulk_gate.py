"""Hostile clients against a bulk channel server (the checkpoint server of
a running job), for tests/integration/bulk_gate.sh. Every attack comes from
its own loopback address (127.0.0.2-6), so the gate's per-address bound
applies to it and not to the job's own launchers on 127.0.0.1. Bounded:
every socket has a timeout, the whole run ends within about 8 s.

  bulk_gate.py HOST:PORT SECRET  -> prints one line per attack, exit 0 when
                                   every attack got the answer it must get
"""
import hashlib
import hmac
import os
import socket
import sys
import time

KIND_CHECKPOINT = 1


def connect(ep, src):
    host, port = ep.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(5)
    s.bind((src, 0))
    s.connect((host, int(port)))
    return s


def read_exact(s, n):
    out = b""
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            break
        out += b
    return out


def read_all(s, limit=256):
    out = b""
    try:
        while len(out) < limit:
            b = s.recv(limit)
            if not b:
                break
            out += b
    except socket.timeout:
        pass
    return out


def key(secret):
    return hmac.new(secret.encode(), b"grace bulk channel v2", hashlib.sha256).digest()


def client_hello(k, nonce_c, nonce_s):
    proof = hmac.new(k, b"client\0" + bytes([KIND_CHECKPOINT]) + nonce_c + nonce_s, hashlib.sha256).digest()
    return b"GRBK" + bytes([2, KIND_CHECKPOINT]) + nonce_c + proof


def main():
    ep, secret = sys.argv[1], sys.argv[2]
    ok = True

    def check(name, got, want):
        nonlocal ok
        good = got.startswith(want)
        ok &= good
        print("%s %s: %r" % ("ok" if good else "WRONG", name, got[:80]))

    # 60 connections held open without a word: at most 8 wait in the gate.
    held = [connect(ep, "127.0.0.2") for _ in range(60)]
    refused = 0
    for s in held:
        if read_exact(s, 22).startswith(b"ERR too many"):
            refused += 1
    check("60 silent connections from one address", b"%d refused" % refused, b"52 refused")
    # Eight slow clients: one byte of a hello a second, past the gate's deadline.
    slow = [connect(ep, "127.0.0.3") for _ in range(8)]
    for s in slow:
        read_exact(s, 22)
    for i in range(4):
        for s in slow:
            try:
                s.send(b"GRBK"[i:i + 1])
            except OSError:
                pass
        time.sleep(1)
    answers = [read_all(s) for s in slow]
    check("8 clients sending a byte a second", answers[0], b"ERR no hello")
    # Random bytes.
    s = connect(ep, "127.0.0.4")
    read_exact(s, 22)
    s.send(os.urandom(200))
    check("random bytes", read_all(s), b"ERR not a Grace bulk channel hello")
    # Another job's secret.
    s = connect(ep, "127.0.0.5")
    hello = read_exact(s, 22)
    s.send(client_hello(key("another-jobs-secret-0000"), os.urandom(16), hello[6:]))
    check("a client with another secret", read_all(s), b"ERR wrong job token")
    # A valid handshake recorded, then replayed on a new connection.
    s = connect(ep, "127.0.0.6")
    hello = read_exact(s, 22)
    recorded = client_hello(key(secret), os.urandom(16), hello[6:])
    s.send(recorded)
    check("a valid handshake", read_exact(s, 34), b"OK")
    s.close()
    s = connect(ep, "127.0.0.6")
    read_exact(s, 22)
    s.send(recorded)
    check("the same handshake replayed", read_all(s), b"ERR wrong job token")
    for c in held + slow:
        c.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
