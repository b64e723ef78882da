"""The rules every platform obeys, written once: pure computation over the contract's records.

Not part of the plugin API: a plugin imports :mod:`fd_platforms.plugin` only.

- :mod:`.decision` — the one create-or-attach rule and its truth table;
- :mod:`.config` — model, cache, scheduler and parallel settings, and the deployment TOML;
- :mod:`.sizes` — sizes with units, parsed and shown;
- :mod:`.layout` — the KV cache's tensors, shapes, dtypes and bytes per block;
- :mod:`.planner` — how many blocks a rank gets, and the invariants every plan keeps;
- :mod:`.drift` — the reports that refuse a plugin answering a rule hook differently;
- :mod:`.devices` — the physical device id that names a rank's tensors, from the visible-devices variable.

FastDeploy's ``FDConfig`` (or a cache process's command line) is read into these settings above this layer, by
:mod:`fd_platforms.fastdeploy.config`, each kind of value checked by one function of
:mod:`fd_platforms.fastdeploy.values`.
"""
