"""heap.py: with the NumPy backend loaded, a large array freed and allocated again reuses its memory (no page
faults), where glibc would otherwise give it back to the kernel and fault it in again."""
import platform
import subprocess
import sys

import pytest

SCRIPT = """
import resource
import numpy as np
from tinynn import heap, numpy_backend
if heap.keep_freed_memory() < 40 << 20:
    print("capped")  # this glibc takes no mmap threshold over 32 MiB
    raise SystemExit
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(10 << 20, np.float32)  # 40 MiB: over glibc's largest mmap threshold of its own
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_large_array_allocated_again_takes_no_page_faults():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout.strip()
    if out == "capped":
        pytest.skip("this glibc caps malloc's mmap threshold at 32 MiB, under the test's 40 MiB array")
    faults = int(out)
    assert faults < 100  # 10,240 pages where the memory went back to the kernel
