"""`frt-mirror serve`: the staged set as a Hub endpoint (uvicorn + an ASGI app, read-only).

Its names are imported from their submodules on first use (frt/lazy.py): `frt-mirror nginx-conf` and
the CLI's start-up read nginx.py without importing Starlette and the app.
"""

from frt.lazy import lazy_exports

__all__ = lazy_exports(__name__, {
    "accesslog": ("AccessLog", "open_sink"),
    "app": ("MirrorApp",),
    "listen": ("listen",),
    "run": ("make_app", "serve"),
})
