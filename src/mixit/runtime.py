"""The device a command runs on, what the machine offers, and the allocator setting that makes CPU training faster
(`tune_allocator`; docs/performance.md has the measurements)."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import torch

from mixit.errors import UsageError

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 1 << 30  # 1 GiB: far above any activation of the models mixit trains on a CPU


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    path = ctypes.util.find_library("c")
    return None if path is None else ctypes.CDLL(path)


def tune_allocator() -> bool:
    """Keep large freed blocks in glibc's heap: above its mmap threshold (adaptive, capped at 32 MiB) every activation
    is mapped afresh and its pages zeroed by the kernel on every step; the cost is a resident set that stays at its
    peak. The ``mixit`` command calls it at start-up. True if applied; False where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return all([libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES), libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES)])


def release_free_memory() -> None:
    """Return the free part of glibc's heap to the system, so that the resident set counts live memory only."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new allocations on `device`: CUDA's free memory, or Linux's MemAvailable; None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX-512 BF16 or AMX), as far as Linux tells."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(name: str) -> torch.device:
    """'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise UsageError(f"device {name!r} requested but no CUDA GPU is available; allowed here: auto, cpu")
        index = name.partition(":")[2]
        if index and not (index.isdigit() and int(index) < torch.cuda.device_count()):
            raise UsageError(f"device {name!r}: this machine has CUDA devices 0..{torch.cuda.device_count() - 1}")
        return torch.device(name)
    raise UsageError(f"unknown device {name!r}; allowed: auto, cpu, cuda, cuda:N")
