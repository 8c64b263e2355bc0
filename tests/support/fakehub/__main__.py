"""Serve an empty fake Hub: python -m tests.support.fakehub [--port N]."""

import argparse
import time

from .server import FakeHub

parser = argparse.ArgumentParser(prog="python -m tests.support.fakehub")
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--redirects", action="store_true", help="307/302 as the real Hub (CDN on 127.0.0.2)")
args = parser.parse_args()
hub = FakeHub(redirects=args.redirects)
print(hub.start(args.host, args.port), flush=True)
try:
    while True:
        time.sleep(3600)
except KeyboardInterrupt:
    hub.stop()
