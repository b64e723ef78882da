"""``fd-platforms run``: the KV-cache initialization lifecycle across real processes.

The engine (:mod:`.engine`, the CLI process) creates the cache-ready signal and starts one worker
process per local rank (:mod:`.worker`); workers plan their blocks, the engine takes the minimum
across ranks, and each worker asks the platform whether it creates its cache. Creators allocate
it; the others wait while one cache-manager process (:mod:`.manager`) allocates it for them.
"""
