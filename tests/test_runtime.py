"""mixit.runtime: the allocator setting keeps large freed blocks in the process."""

import platform

import pytest
import torch

from mixit.bench import _memory_mb
from mixit.runtime import release_free_memory, tune_allocator

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def test_applied_on_glibc_only():
    assert tune_allocator() is GLIBC


@pytest.mark.skipif(not GLIBC, reason="the setting applies to glibc only")
def test_freed_large_tensors_stay_resident_until_released():
    assert tune_allocator()
    cpu = torch.device("cpu")
    release_free_memory()
    start = _memory_mb(cpu, peak=False)
    block = torch.ones(40, 2**20 // 4)  # 40 MiB: above glibc's default mmap threshold limit of 32 MiB
    del block
    kept = _memory_mb(cpu, peak=False) - start
    release_free_memory()
    released = _memory_mb(cpu, peak=False) - start
    assert kept >= 36 and released <= 8
