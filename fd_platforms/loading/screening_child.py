"""The screening child (:mod:`.screening`): ``python -m fd_platforms.loading.screening_child FD NAME...``
loads and detects every ``NAME`` at once, as the in-process prober does (each bounded, isolated),
and writes one JSON line per platform to descriptor ``FD``."""

from __future__ import annotations

import json
import os
import sys

from .screening import record
from .selection import Prober


def main(argv: list[str]) -> int:
    out, names = int(argv[0]), argv[1:]
    probes = Prober(screen=False).probe_all(names)
    with os.fdopen(out, "w") as report:
        for name, probe in probes.items():
            device_type = None if probe.platform is None else probe.platform.identity.device_type
            report.write(json.dumps(record(name, probe.detection, device_type, probe.error)) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover - run as the child
    sys.exit(main(sys.argv[1:]))
