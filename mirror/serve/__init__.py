"""`frt-mirror serve`: the staged set as a Hub endpoint (uvicorn + an ASGI app, read-only).

The package imports nothing: `frt-mirror nginx-conf` and the CLI's start-up read nginx.py without
importing Starlette and the app.

May import: store, stage (pull-through fetches as stage does), and the flat modules of frt.mirror.
"""
