"""key new: an ed25519 key pair for signed bundles (bundle --sign KEY, import --require-signature KEY.pub)."""

from __future__ import annotations

from pathlib import Path

import click

from .app import cli, emit_json, json_option


@cli.group("key")
def key_group() -> None:
    """Keys that sign bundles on the connected box and check them on the cluster."""


@key_group.command("new")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@json_option
def key_new_cmd(path: Path, as_json: bool) -> None:
    """Write PATH (the private key, mode 0600: keep it on the connected box) and PATH.pub (the public
    key, for 'import --require-signature PATH.pub' on the cluster). Never overwrites a key."""
    from frt.mirror.bundle.signing import new_key

    pair = new_key(path)
    if as_json:
        emit_json({"private": str(pair.private), "public": str(pair.public), "key_id": pair.key_id})
        return
    click.echo(f"wrote {pair.private} (private, mode 0600) and {pair.public} (public); key id {pair.key_id}")
    click.echo(
        f"sign: frt-mirror bundle OUT.tar --sign {pair.private}   "
        f"check: frt-mirror import OUT.tar --require-signature {pair.public}"
    )
