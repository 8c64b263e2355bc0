"""The seat catalog: TOML and the Python API build the same objects; every error names file:line: field."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from frt.manifests import (
    EXAMPLES,
    Guards,
    KernelRef,
    ManifestError,
    SeatCatalog,
    SeatSpec,
    SeatSpecError,
    load_seat_catalog,
)

NORM = KernelRef("kernels-test/seat-rmsnorm", version=1, layer="RMSNorm")
OK = """
    [[seats]]
    name = "norms"
    match_class = "Qwen3RMSNorm"
    kind = "norm"
    kernel = { repo = "kernels-test/seat-rmsnorm", version = 1, layer = "RMSNorm" }
    guards = { dtypes = ["float32", "bfloat16"], devices = ["cpu", "cuda"] }

    [[seats]]
    match = ["mlp.down_proj", "layers.*.self_attn.o_proj"]
    kind = "linear"
    kernel = { repo = "kernels-test/seat-linear", revision = "0123abc", function = "linear" }
    parity = false

    [[seats]]
    match = "mlp.experts"
    kind = "moe_experts"
    kernel = { repo = "kernels-test/seat-experts", version = 2, layer = "ExpertBank" }
    band = 8
    tolerance = 1e-3

    [seats.guards]
    max_rows = 64
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "seats.toml"
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    return p


def fails(tmp_path: Path, text: str, line: int | None, field: str, match: str = "") -> None:
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as ei:
        load_seat_catalog(path)
    msg = str(ei.value)
    where = str(path) if line is None else f"{path}:{line}"
    assert msg.startswith(f"{where}: {field}: ") and "\n" not in msg, msg
    assert re.search(match, msg), msg


def test_toml_and_python_api_build_the_same_catalog(tmp_path):
    cat = load_seat_catalog(write(tmp_path, OK))
    built = SeatCatalog(
        (
            SeatSpec(
                "norm",
                NORM,
                match_class=("Qwen3RMSNorm",),
                name="norms",
                guards=Guards(dtypes=("float32", "bfloat16"), devices=("cpu", "cuda")),
            ),
            SeatSpec(
                "linear",
                KernelRef("kernels-test/seat-linear", revision="0123abc", function="linear"),
                match=("mlp.down_proj", "layers.*.self_attn.o_proj"),
                parity=False,
            ),
            SeatSpec(
                "moe_experts",
                KernelRef("kernels-test/seat-experts", version=2, layer="ExpertBank"),
                match=("mlp.experts",),
                band=8,
                tolerance=1e-3,
                guards=Guards(max_rows=64),
            ),
        )
    )
    assert cat.seats == built.seats
    assert cat.seats[0].source.endswith("seats.toml:1") and cat.seats[1].kernel.source.endswith("seats.toml:11")
    assert [k.label for k in cat.kernels()] == [
        "kernels-test/seat-rmsnorm v1 layers.RMSNorm",
        "kernels-test/seat-linear revision 0123abc linear",
        "kernels-test/seat-experts v2 layers.ExpertBank",
    ]
    assert cat.seats[2].band == 8 and cat.seats[1].band is None  # None: $FRT_MOE_BAND_T (16) at attach


def test_shipped_seat_example_parses():
    cat = load_seat_catalog(EXAMPLES / "seats-qwen3.toml")
    assert {s.kind for s in cat.seats} == {"norm", "linear", "activation", "moe_experts", "lm_head"}
    assert all(s.kernel.repo.startswith("kernels-test/seat-") for s in cat.seats)


@pytest.mark.parametrize(
    "text, line, field, match",
    [
        (
            '[[seats]]\nmatch = "x"\nkind = "conv"\nkernel = { repo = "a/b", version = 1, layer = "L" }\n',
            3,
            "seats[0].kind",
            "unknown 'conv'; expected one of linear, norm",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "norm"\n'
            'kernel = { repo = "a/b", version = 1, revision = "r", layer = "L" }\n',
            4,
            "seats[0].kernel.version",
            "exactly one of version",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "norm"\nkernel = { repo = "a/b", version = 1 }\n',
            4,
            "seats[0].kernel.layer",
            "exactly one of layer",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "norm"\nkernel = { repo = "a", version = 1, layer = "L" }\n',
            4,
            "seats[0].kernel.repo",
            "not a repo id",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "lm_head"\nkernel = { repo = "a/b", version = 1, layer = "L" }\n',
            4,
            "seats[0].kernel.function",
            "once per row slab",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "moe_experts"\nkernel = { repo = "a/b", version = 1, function = "f" }\n',
            4,
            "seats[0].kernel.layer",
            "needs a layer",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "linear"\nband = 4\nkernel = { repo = "a/b", version = 1, layer = "L" }\n',
            4,
            "seats[0].band",
            "only a moe_experts seat",
        ),
        (
            '[[seats]]\nmatch = "mlp..down"\nkind = "linear"\nkernel = { repo = "a/b", version = 1, layer = "L" }\n',
            2,
            "seats[0].match",
            "not dotted names",
        ),
        (
            '[[seats]]\nkind = "linear"\nkernel = { repo = "a/b", version = 1, layer = "L" }\n',
            1,
            "seats[0].match",
            "at least one path pattern",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "linear"\nkernel = { repo = "a/b", version = 1, layer = "L" }\n'
            'guards = { dtypes = ["fp32"] }\n',
            5,
            "seats[0].guards.dtypes",
            "unknown 'fp32'",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "linear"\nkernel = { repo = "a/b", version = 1, layer = "L" }\n'
            "tolerance = 2\n",
            5,
            "seats[0].tolerance",
            r"in \(0, 1\)",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "linear"\nkernel = { repo = "a/b", version = 1, layer = "L" }\n'
            'parity = "yes"\n',
            5,
            "seats[0].parity",
            "true or false",
        ),
        (
            '[[seats]]\nmatch = "x"\nkind = "linear"\nkernel = { repo = "a/b", version = 1, layer = "L" }\nsize = 3\n',
            5,
            "seats[0].size",
            "unknown key; expected name, match",
        ),
        (
            '[[seats]]\nmatch = "x"\nkernel = { repo = "a/b", version = 1, layer = "L" }\n',
            1,
            "seats[0].kind",
            "missing kind",
        ),
        ('[kernels]\n"a/b" = { version = 1 }\n', 1, "kernels", "unknown top-level key"),
        (
            '[[seats]]\nmatch = "x"\nkind = "linear"\nkernel = { repo = "a/b", version = 1 layer = "L" }\n',
            4,
            "syntax",
            "",
        ),
    ],
)
def test_errors_name_file_line_and_field(tmp_path, text, line, field, match):
    fails(tmp_path, text, line, field, match)


def test_python_api_validates_too():
    with pytest.raises(SeatSpecError, match="^kind: unknown 'conv'"):
        SeatSpec("conv", NORM, match=("x",))
    with pytest.raises(SeatSpecError, match="^kernel.function: an lm_head seat"):
        SeatSpec("lm_head", NORM, match=("lm_head",))
    with pytest.raises(SeatSpecError, match="^max_rows: must be a positive integer"):
        Guards(max_rows=0)
    with pytest.raises(ValueError):  # SeatSpecError is a ValueError, like ManifestError
        KernelRef("a/b", version=True, layer="L")


def test_catalog_and_resolver_need_no_torch():
    code = (
        "import sys, frt.manifests, frt.resolver, frt.mirror.stage.kernels, frt.mirror.views.env; "
        "frt.manifests.load_seat_catalog(frt.manifests.EXAMPLES / 'seats-qwen3.toml'); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
