"""Cross-process primitives: how the engine's processes meet on one machine, without paddle.

Not part of the plugin API: a plugin imports :mod:`fd_platforms.plugin` only.

- :mod:`.shm` — shared-memory segments as containers need them (kernel-held liveness, checked sizes);
- :mod:`.futex` — sleeping on a word of shared memory;
- :mod:`.cache_signal` — the cache-ready signal and its bounded wait;
- :mod:`.process_watch` — noticing that a process exited (pidfd);
- :mod:`.claims` — one claimer at a time on a file, arbitrated by the kernel (an OFD lock);
- :mod:`.timeouts` — the bounds of every wait, from arguments and environment variables;
- :mod:`.console` — lines written whole when several processes share a terminal.
"""
