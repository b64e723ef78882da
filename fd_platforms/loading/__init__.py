"""Loading a platform: from installed metadata to one checked :class:`~.platform.Platform`.

- :mod:`.discovery` — the built-in and entry-point candidates, from metadata alone;
- :mod:`.isolation` — every call into plugin code, in the caller's thread, isolated from its exceptions;
- :mod:`.watchdog` — the bound of a plugin call: past it the process ends, naming the call;
- :mod:`.screening` (and its child, :mod:`.screening_child`) — detecting the platforms a command did
  not name in a child process, so a plugin that hangs or ends its process cannot end the command;
- :mod:`.defaults` — the core's answers where a plugin is silent (the rules, through :mod:`fd_platforms.rules`);
- :mod:`.platform` — the facade: validated arguments, bounded hooks, answers checked on every call;
- :mod:`.selection` — ``FD_PLATFORM``, else the one available accelerator, else cpu;
- :mod:`.current` — the process's platform, resolved once.
"""
