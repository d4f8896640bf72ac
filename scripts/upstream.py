#!/usr/bin/env python3
"""Start a SecantusDB upstream for Laconic's tests and demo, and stop it with us.

Prints "ready <port>" once the server answers a ping, then waits on stdin: when
the parent process exits (stdin reaches EOF) the server is stopped, so a test
run never leaves a server behind. A line "kill" on stdin kills the server
with SIGKILL instead (a crash, for tests), and the launcher exits.

  upstream.py [--port N] [--auth USER:PASSWORD] [--storage DIR] [--sync-on-commit]
              [--tls CERT KEY CA [--require-client-cert]]

With --auth, a user with the root role is created first and the server is
then restarted with authentication on (SecantusDB refuses createUser once auth
is on and no user exists).
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pymongo

HERE = os.path.dirname(os.path.abspath(sys.executable))
SERVER = os.path.join(HERE, "secantusd-py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TLS = None  # (cert, key, ca, require client certificates)
SYNC = False  # every commit synced to disk before it is acknowledged


def start(port, storage, auth):
    args = [SERVER, "--host", "127.0.0.1", "--port", str(port), "--storage-path", storage,
            "--log-level", "WARNING"]
    if auth:
        args.append("--auth")
    if SYNC:
        args.append("--sync-on-commit")
    if TLS:
        cert, key, ca, require = TLS
        args += ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-file", ca]
        if require:
            args.append("--tls-require-client-cert")
    return subprocess.Popen(args, stdin=subprocess.DEVNULL)


def client_uri(port, extra=""):
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true{extra}"
    if TLS:
        cert, key, ca, require = TLS
        # The launcher only asks whether the server is up: it takes any
        # certificate (tests serve expired ones on purpose).
        uri += f"&tls=true&tlsCAFile={ca}&tlsAllowInvalidCertificates=true"
        if require:
            # The server's own pair serves as a client certificate here.
            with open(os.path.join(tempfile.gettempdir(), f"laconic-client-{port}.pem"), "w") as f:
                f.write(open(cert).read() + open(key).read())
            uri += f"&tlsCertificateKeyFile={f.name}"
    return uri


def wait_ready(port, proc, credentials=None):
    uri = client_uri(port, "&serverSelectionTimeoutMS=500")
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"upstream exited with status {proc.returncode}")
        try:
            kwargs = {}
            if credentials:
                kwargs = {"username": credentials[0], "password": credentials[1]}
            with pymongo.MongoClient(uri, **kwargs) as c:
                c.admin.command("ping")
            return
        except Exception:
            time.sleep(0.1)
    sys.exit("upstream did not answer a ping within 60 s")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--auth", default=None, help="USER:PASSWORD")
    ap.add_argument("--storage", default=None)
    ap.add_argument("--tls", nargs=3, metavar=("CERT", "KEY", "CA"), default=None)
    ap.add_argument("--require-client-cert", action="store_true")
    ap.add_argument("--sync-on-commit", action="store_true")
    a = ap.parse_args()
    global TLS, SYNC
    SYNC = a.sync_on_commit
    if a.tls:
        TLS = (*a.tls, a.require_client_cert)
    port = a.port or free_port()
    storage = a.storage or tempfile.mkdtemp(prefix="laconic-upstream-")
    owned = a.storage is None

    credentials = None
    if a.auth:
        user, _, password = a.auth.partition(":")
        credentials = (user, password)
        proc = start(port, storage, auth=False)
        wait_ready(port, proc)
        with pymongo.MongoClient(client_uri(port)) as c:
            c.admin.command("createUser", user, pwd=password, roles=["root"],
                            mechanisms=["SCRAM-SHA-256"])
        stop(proc)

    proc = start(port, storage, auth=bool(a.auth))
    wait_ready(port, proc, credentials)
    print(f"ready {port}", flush=True)

    stopping = []

    def on_signal(signum, frame):
        # Once: a second SIGTERM (a script's cleanup signals the whole
        # group) must not interrupt the shutdown the first one began.
        if not stopping:
            stopping.append(signum)
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for line in sys.stdin:
            if line.strip() == "kill":
                proc.kill()
                proc.wait()
                break
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop(proc)
        if owned:
            shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
