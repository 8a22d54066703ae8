"""The CPU this process runs on: its model name and feature flags (/proc/cpuinfo), for machine fingerprints
(`draft_shapes/calibrate.py`) and benchmark reports (`bench/machine.py`)."""
from __future__ import annotations

import platform


def cpu_flags() -> set[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where that file does not exist)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
