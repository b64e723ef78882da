"""The conformance kit: fd-platforms' suite run against an installed platform.

- :mod:`.runner` runs it for ``fd-platforms check`` (one pytest process per platform, a check matrix);
- :mod:`.pytest_plugin` is the ``pytest11`` entry point (``pytest --fd-platform NAME``), inert and importing
  nothing of ours until that option is given; then :mod:`.fixtures` gives the suite (:mod:`.suite`) its fixtures.

Importing this package imports nothing: every pytest session of an environment with fd-platforms imports it.
"""

CHECKS = ("identity", "decision", "shapes", "planner", "host_alloc", "wait", "sharing", "simulated", "device")
"""The suite's checks in report order: one module ``fd_platforms/conformance/suite/test_<check>.py`` each."""
