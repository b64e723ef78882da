"""Platforms shipped inside the core, registered through the same loader as external plugins and
written against the same plugin API (:mod:`fd_platforms.plugin`, whose names load on first use)."""
