"""nginx-conf's parts for HEADs nginx answers itself: `--head-cache SECONDS` (a short cache of the replicas'
answers by commit sha) and `--head-map` (the answers the replicas write: head_map.py)."""

from __future__ import annotations

# nginx-conf --head-cache SECONDS: HEADs of files by commit sha (immutable URLs) from a cache.
CACHE_HTTP = """
  # --head-cache: a HEAD with no Range, no condition and no token, of a file by commit sha, is answered
  # from here for {ttl} s after a replica answered it (kernels and snapshot_download ask by sha).
  proxy_cache_path "{run}/head-cache" levels=1:2 keys_zone=frt_head:10m max_size=64m inactive=60s
                   use_temp_path=off;
  # Any other request has no cache at all (not merely a bypass: nginx would then drop the replica's
  # Accept-Ranges from a 206, as from any answer it may cache).
  map "$request_method:$http_range$http_if_range$http_if_match$http_if_none_match$http_if_modified_since$http_if_unmodified_since$http_authorization" $frt_head_cache {{
    "HEAD:" frt_head;
    default off;
  }}
"""


def map_location(alias: str) -> str:
    """--head-map's internal location over the store (`alias`, quoted), its headers from the URI's parts:
    an LFS file's ETag and X-Linked-Etag are its blob's sha256, a git file's ETag its git oid."""

    def headers(etag: str, linked: bool) -> str:
        lines = ['add_header Last-Modified "";', f"add_header ETag '\"${etag}\"';", "add_header X-Repo-Commit $frt_hc;"]
        if linked:
            lines += ["add_header X-Linked-Etag '\"$frt_he\"';", "add_header X-Linked-Size $frt_hs;"]
        return "".join(f"        {ln}\n" for ln in lines)

    return MAP_LOCATION.format(
        store=alias[:-1], lfs_headers=headers("frt_he", True), git_headers=headers("frt_ho", False)
    )


# A file by commit sha: the location --head-cache acts in.
BY_SHA = """
    location ~ "^/([a-z]+s/)?[^/]+/[^/]+/resolve/[0-9a-f]{{40}}/" {{
      proxy_pass http://frt_mirror;
{cache}    }}
"""
CACHE_LOCATION = """\
      proxy_cache $frt_head_cache;
      proxy_cache_convert_head off;  # a HEAD stays a HEAD: the replica answers it, not a GET
      proxy_cache_key "$request_method $request_uri";
      proxy_cache_valid 200 {ttl}s;
      # No proxy_cache_lock: the requests it holds back wait in steps of 500 ms, where a replica
      # answers a HEAD in well under one.
"""

# nginx-conf --head-map: the replicas' answers to HEADs of stored files by sha (mirror/serve/head_map.py).
MAP_HTTP = """
  # --head-map: each line of {run}/heads/*.answers is a URL as a client spells it and where nginx finds
  # serve's answer to a HEAD of it: /_frt_heads/L/SIZE/COMMIT/BLOB (an LFS file) or
  # /_frt_heads/G/GIT_OID/COMMIT/BLOB. A replica started with --head-map writes it and reloads nginx
  # when the ledger changes; with no file yet, nothing is answered from it. Hash lookups only: the one
  # regex a mapped HEAD costs is its location's below.
  map_hash_bucket_size 256;
  map_hash_max_size 1048576;
  map $request_uri $frt_head_uri {{
    include "{run}/heads/*.answers";
    default "";
  }}
  # Only a HEAD with no Range, no condition and no token is answered from the map.
  map "$request_method:$http_range$http_if_range$http_if_match$http_if_none_match$http_if_modified_since$http_if_unmodified_since$http_authorization" $frt_plain_head {{
    "HEAD:" 1;
    default "";
  }}
  map $frt_plain_head $frt_head {{
    1 $frt_head_uri;
    default "";
  }}
"""
MAP_REWRITE = """
    # --head-map: a mapped HEAD goes to its answer before any location is chosen.
    if ($frt_head) {
      rewrite ^ $frt_head last;
    }
"""
MAP_LOCATION = """
    # --head-map: the HEAD's answer, nginx's static one for the blob (Content-Length: the file's size)
    # with serve's headers, from the URI the map gave.
    location ^~ /_frt_heads/ {{
      internal;
      # Blobs are content-addressed and every map change reloads nginx (new workers, empty cache).
      open_file_cache max=65536 inactive=60s;
      open_file_cache_valid 1s;
      types {{ }}
      etag off;
      location ~ "^/_frt_heads/L/(?<frt_hs>[0-9]+)/(?<frt_hc>[0-9a-f]{{40}})/(?<frt_hb>[0-9a-f]{{2}}/(?<frt_he>[0-9a-f]{{64}}))$" {{
        alias {store}$frt_hb";
{lfs_headers}      }}
      location ~ "^/_frt_heads/G/(?<frt_ho>[0-9a-f]{{40,64}})/(?<frt_hc>[0-9a-f]{{40}})/(?<frt_hb>[0-9a-f]{{2}}/[0-9a-f]{{64}})$" {{
        alias {store}$frt_hb";
{git_headers}      }}
      return 404;
    }}
"""


def heads_http(run: object, ttl: int, head_map: bool) -> str:
    """The http block's part: --head-map's maps, then --head-cache's cache and map (nginx wants
    map_hash_* before any map)."""
    return (MAP_HTTP.format(run=run) if head_map else "") + (CACHE_HTTP.format(run=run, ttl=ttl) if ttl > 0 else "")


def heads_locations(alias: str, ttl: int, head_map: bool) -> str:
    """The server block's part: --head-cache's location by sha, --head-map's answers' location."""
    by_sha = BY_SHA.format(cache=CACHE_LOCATION.format(ttl=ttl)) if ttl > 0 else ""
    return by_sha + (map_location(alias) if head_map else "")
