"""What the tests share, each module one thing: the fake Hub (fakehub/), the fixture kernels and models,
the CLI as a user runs it, runs with no network, a real PostgreSQL, serve and nginx in front of it, a
hostile upstream. Test files import from here and take shared fixtures from tests/conftest.py; no test
file imports another (tests/test_layering.py checks it)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
