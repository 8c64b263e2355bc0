"""frt-mirror: kernel resolution and packaging with a local mirror."""
