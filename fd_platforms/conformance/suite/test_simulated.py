"""The device hooks answered anywhere: on a simulated device, and as they are here.

Where a platform is a :class:`~fd_platforms.kit.paddle_platform.PaddlePlatform` whose facts class
simulates Paddle (``DeviceFacts.simulated_paddle``: 2 devices of 16 GiB), a copy of the plugin
runs its own hooks on that stand-in behind the ``load_paddle`` seam, and the core checks every
answer: a ``device_memory`` that returns the wrong type fails here, on any machine. Without the
hardware, ``device_memory(0)`` still runs: a record, or a plain error saying why not.
"""

from __future__ import annotations

import pytest

from ...contract.errors import ConfigError, FdPlatformsError, PluginContractError, PluginTimeoutError
from ...contract.types import Detection, DeviceMemory
from ...loading.platform import Platform
from ..fixtures import SIMULATED_BYTES, SIMULATED_DEVICES
from . import hooks


@hooks("confirm_platform")
def test_confirmation_on_the_simulated_device(fd_platform_simulated: Platform) -> None:
    confirmed = fd_platform_simulated.confirm()
    assert isinstance(confirmed, Detection) and confirmed.available, confirmed
    assert confirmed.device_count == SIMULATED_DEVICES, "the confirmation counts the devices Paddle reports"


@hooks("device_memory")
def test_memory_facts_on_the_simulated_device(fd_platform_simulated: Platform) -> None:
    facts = fd_platform_simulated.device_memory(0)  # the core checks the record's type on every call
    assert facts.total_bytes > 0 and facts.source.strip()
    assert facts.free_bytes is None or facts.free_bytes <= facts.total_bytes
    assert fd_platform_simulated.device_memory(SIMULATED_DEVICES - 1).total_bytes == facts.total_bytes
    if facts.total_bytes != SIMULATED_BYTES:
        pytest.fail(f"device_memory reported {facts.total_bytes} B total where Paddle reports {SIMULATED_BYTES} B")


@hooks("device_memory")
def test_a_device_the_simulation_lacks_is_a_config_error(fd_platform_simulated: Platform) -> None:
    with pytest.raises(ConfigError, match="device_id"):
        fd_platform_simulated.device_memory(SIMULATED_DEVICES)


@hooks("device_memory")
def test_device_memory_here_is_a_record_or_a_plain_error(fd_platform: Platform) -> None:
    try:
        facts = fd_platform.device_memory(0)
    except (PluginContractError, PluginTimeoutError):
        raise  # a wrong answer or a hang fails on any machine
    except FdPlatformsError as exc:
        assert str(exc).strip(), "an error that says why device 0 cannot be read here"
        return
    assert isinstance(facts, DeviceMemory) and facts.total_bytes > 0
