#!/usr/bin/env python3
"""Start a SecantusDB upstream for Laconic's tests and demo, and stop it with us.

Prints "ready <port>" once the server answers a ping, then waits on stdin: when
the parent process exits (stdin reaches EOF) the server is stopped, so a test
run never leaves a server behind.

  upstream.py [--port N] [--auth USER:PASSWORD] [--storage DIR]

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


def start(port, storage, auth):
    args = [SERVER, "--host", "127.0.0.1", "--port", str(port), "--storage-path", storage,
            "--log-level", "WARNING"]
    if auth:
        args.append("--auth")
    return subprocess.Popen(args, stdin=subprocess.DEVNULL)


def wait_ready(port, proc, credentials=None):
    uri = f"mongodb://127.0.0.1:{port}/?directConnection=true&serverSelectionTimeoutMS=500"
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
    a = ap.parse_args()
    port = a.port or free_port()
    storage = a.storage or tempfile.mkdtemp(prefix="laconic-upstream-")
    owned = a.storage is None

    credentials = None
    if a.auth:
        user, _, password = a.auth.partition(":")
        credentials = (user, password)
        proc = start(port, storage, auth=False)
        wait_ready(port, proc)
        uri = f"mongodb://127.0.0.1:{port}/?directConnection=true"
        with pymongo.MongoClient(uri) as c:
            c.admin.command("createUser", user, pwd=password, roles=["root"],
                            mechanisms=["SCRAM-SHA-256"])
        stop(proc)

    proc = start(port, storage, auth=bool(a.auth))
    wait_ready(port, proc, credentials)
    print(f"ready {port}", flush=True)

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        sys.stdin.read()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop(proc)
        if owned:
            shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
