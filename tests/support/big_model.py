"""A model repo of large safetensors shards for the fake Hub, the shards on disk and never in this
process's heap: each is written to a file in chunks and handed to FakeRepo as a read-only mmap, which
the fake Hub hashes and serves from the page cache. What bench/stage_rss.py and tests/test_stage_rss.py
stage to see the stager's memory stay flat in the file size."""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.fakehub import FakeRepo

MiB = 1 << 20
CHUNK = 16 * MiB  # bytes generated and written at a time


def write_shard(path: Path, seed: str, nbytes: int) -> int:
    """A valid safetensors file of one uint8 tensor of `nbytes` deterministic, incompressible bytes
    (shake_128 of the seed and the chunk's index), written a chunk at a time. Returns its size."""
    header = json.dumps({"weight": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)  # the format pads its JSON header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        for i, off in enumerate(range(0, nbytes, CHUNK)):
            f.write(hashlib.shake_128(f"{seed}:{i}".encode()).digest(min(CHUNK, nbytes - off)))
    return 8 + len(header) + nbytes


def _configs(name: str, shards: list[str], sizes: list[int]) -> dict[str, bytes]:
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": {f"weight.{i}": s for i, s in enumerate(shards)}}
    return {
        "config.json": json.dumps({"model_type": "llama", "name_or_path": name}).encode(),
        "generation_config.json": b'{"do_sample": false}\n',
        "model.safetensors.index.json": json.dumps(index, indent=2).encode(),
        "tokenizer_config.json": b'{"model_max_length": 4096}\n',
        "README.md": f"# {name}\n".encode(),
    }


@contextmanager
def big_model_repo(repo_id: str, shard_bytes: list[int], where: Path) -> Iterator[FakeRepo]:
    """A model repo (type "model", branch main) of len(shard_bytes) shards with that many tensor bytes
    each, plus small config files; the shards are written under `where` and mapped, unmapped on exit
    (the caller removes `where`)."""
    n = len(shard_bytes)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    maps: list[mmap.mmap] = []
    try:
        sizes = []
        for name, nbytes in zip(names, shard_bytes, strict=True):
            sizes.append(write_shard(where / name, f"{repo_id}/{name}", nbytes))
            with open(where / name, "rb") as f:
                maps.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        repo = FakeRepo(repo_id, repo_type="model")
        repo.commit({**_configs(repo_id, names, sizes), **dict(zip(names, maps, strict=True))}, title="weights")
        yield repo
    finally:
        for m in maps:
            try:
                m.close()
            except BufferError:  # a view of it is still alive (a handler thread not yet done): freed with it
                pass
