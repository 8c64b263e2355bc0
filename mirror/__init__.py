"""frt.mirror — a home on a connected box or a cluster: what was staged from the upstream, stored,
verified, and handed to offline clusters. Its rooms follow the data's path; each may import only the
rooms before it (tests/test_layering.py checks it):

    store   the content-addressed store (a filesystem or S3), its rows, the home, the view trees,
            verify, gc, unstage
    stage   upstream -> store: fetch, transport, wheels, models, the publisher's digests, progress
    views   what the offline cluster reads: LOCAL_KERNELS (env), the Hub-cache export
    bisect  a drift by pinned revision, by exit code or by a metric
    bundle  a staged set across an air gap
    serve   a Hub-compatible endpoint over the home

store comes first; stage and views each import store alone; bisect, bundle and serve sit on top. Flat
here, because every room reads them: home_path.py (where a home is: the CLI asks it before importing
anything heavy), schema.py (the mirror's tables: one migration track for every room's rows),
events.py (the home's log, which every room writes) and event_rows.py (an event as its readers take it,
read with SQLAlchemy or with sqlite3 alone). They import none of the rooms.
"""
