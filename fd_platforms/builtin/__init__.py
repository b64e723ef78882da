"""Platforms shipped inside the core, registered through the same loader as external plugins."""
