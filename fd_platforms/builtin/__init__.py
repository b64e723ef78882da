"""Platforms shipped inside the core, registered through the same loader as external plugins.

They are the core's own and import the contract and the kit directly, only the modules they use:
every worker without an accelerator selects cpu, and :mod:`fd_platforms.plugin` imports the whole
kit. An external plugin imports :mod:`fd_platforms.plugin` only.
"""
