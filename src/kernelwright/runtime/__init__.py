"""Device detection, interpreter mode, launch-config tables, allocation and input checks."""

from kernelwright.runtime.device import (
    DeviceInfo,
    default_device,
    device_info,
    ensure_backend,
    interpreter_mode,
)
from kernelwright.runtime.launch import LaunchConfig, lookup

__all__ = [
    "DeviceInfo",
    "LaunchConfig",
    "default_device",
    "device_info",
    "ensure_backend",
    "interpreter_mode",
    "lookup",
]
