"""The plugin contract, the bottom layer: what a vendor team reads and implements.

Internal to the core: a plugin imports these names from :mod:`fd_platforms.plugin`, never from here.

- :mod:`.hookspecs` — the hooks (pluggy specs) and the ``hookimpl`` marker;
- :mod:`.types` — the records hooks return and receive;
- :mod:`.errors` — every error, each with its exit code;
- :mod:`.integers` — the one check of integer arguments and record fields, and the general limits;
- :mod:`.api_version` — the plugin API version, its compatibility policy and the modules a plugin may import;
- :mod:`.paddle_import` — ``import_paddle``: paddle imported quietly, keeping the SIGTERM handler.

Nothing here imports another layer at run time; a hook spec names the rules' ``CacheLayout`` and
``CacheConfig`` for typing only.
"""
