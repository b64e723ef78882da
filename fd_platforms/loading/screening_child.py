"""The screening child (:mod:`.screening`): ``python -m fd_platforms.loading.screening_child FD NAME...``
loads, detects and (where detection finds the device) confirms each ``NAME`` in turn, as the
in-process prober does, writing to descriptor ``FD`` a JSON line naming the platform it starts,
one with the device nodes its plugin claims once it has loaded, then one with its result. A call past its bound
ends this process with its stack written to ``FD``."""

from __future__ import annotations

import json
import os
import sys

from .accelerators import NodeClaim
from .isolation import blame_interrupts
from .screening import Screened, claimed_line, record
from .selection import Prober
from .watchdog import write_to


def main(argv: list[str]) -> int:
    out, names = int(argv[0]), argv[1:]
    blame_interrupts()
    write_to(out)
    with os.fdopen(out, "w") as report:

        def loaded(name: str, claim: NodeClaim | None) -> None:
            report.write(claimed_line(name, claim) + "\n")
            report.flush()

        prober = Prober(screen=False, on_loaded=loaded)
        for name in names:
            report.write(json.dumps({"started": name}) + "\n")
            report.flush()
            probe = prober.confirm(name)
            device_type = None if probe.platform is None else probe.platform.identity.device_type
            found = Screened(probe.detection, device_type, probe.error, probe.claim)
            report.write(json.dumps(record(name, found)) + "\n")
            report.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover - run as the child
    sys.exit(main(sys.argv[1:]))
