"""Packaging: one `frt` namespace, and the resolver and mirror working without torch."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

from tests.support.kernel_fixtures import ACTIVATION
from tests.support.own_wheel import pip_wheel

BLOCK_TORCH = textwrap.dedent("""
    import importlib.abc, importlib.util, sys
    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
    sys.meta_path.insert(0, NoTorch())
    _find = importlib.util.find_spec
    importlib.util.find_spec = lambda n, *a: None if n.split(".")[0] == "torch" else _find(n, *a)
""")


def test_subpackages_live_under_frt_only():
    import frt.adapters
    import frt.manifests
    import frt.mirror
    import frt.resolver
    import frt.seats  # noqa: F401

    for generic in ("resolver", "mirror", "seats", "adapters", "manifests"):
        assert importlib.util.find_spec(generic) is None or "site-packages" not in str(
            importlib.util.find_spec(generic).origin
        ), generic


def test_resolver_and_mirror_run_without_torch(hub, tmp_path):
    """Scan, resolve and the CLI on a box with no torch: a stager's situation."""
    code = BLOCK_TORCH + textwrap.dedent(f"""
        from frt.resolver.hub import HubClient
        from frt.resolver.ledger import Ledger
        from frt.resolver.resolve import resolve
        from frt.resolver.scan import scan
        from frt.resolver.targets import parse_target
        import frt.cli
        led = Ledger({str(tmp_path / "l.sqlite")!r})
        scan({ACTIVATION!r}, hub=HubClient({hub.url!r}), ledger=led)
        res = resolve({ACTIVATION!r}, target=parse_target("torch2.11-cu130-aarch64-linux"), ledger=led,
                      version=2, offline=True)
        assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules), "torch was imported"
        print(json.dumps(res.to_json()))
    """)
    p = subprocess.run([sys.executable, "-c", "import json\n" + code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["variant"] == "torch211-cxx11-cu130-aarch64-linux"


def test_wheel_carries_the_engine_plugins_and_their_data(tmp_path):
    """What a pip-installed frt-mirror gives the engines: both entry points, the sitecustomize that
    SGLang's fallback writes out, and the example catalogs."""
    import zipfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    p = pip_wheel(tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Warning" not in p.stderr and "deprecated" not in p.stderr, p.stderr  # an install is quiet
    (wheel,) = tmp_path.glob("frt_mirror-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # Every package of the source tree is in the wheel (frt.mirror.serve once was not).
    for init in (
        i
        for d in ("frt", "resolver", "mirror", "seats", "adapters", "manifests")
        for i in (root / d).rglob("__init__.py")
    ):
        rel = init.relative_to(root)
        top = "frt" if rel.parts[0] == "frt" else f"frt/{rel.parts[0]}"
        assert "/".join([top, *rel.parts[1:]]) in names, rel
    assert "frt/adapters/sglang_site/sitecustomize.py" in names
    assert "frt/py.typed" in names and any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert {"frt/manifests/examples/seats-vllm.toml", "frt/manifests/examples/seats-qwen3.toml"} <= set(names)
    (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(ep).decode()
    assert "[vllm.general_plugins]\nfrt = frt.adapters.vllm_engine:register" in text
    assert "[sglang.srt.plugins]\nfrt = frt.adapters.sglang_engine:register" in text


def test_a_source_tree_without_metadata_names_its_version_unknown(monkeypatch):
    """An engine's PYTHONPATH carries frt's source without pip's metadata (env --engine): a stage there
    writes the store's records and a bundle its manifest, each naming its writer; that must not fail."""
    import importlib.metadata

    import frt

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    assert frt.version() == importlib.metadata.version("frt-mirror")
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert frt.version() == "unknown"
