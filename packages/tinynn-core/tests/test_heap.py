"""heap.py: with the NumPy backend loaded, a large array freed and allocated again reuses its memory (no page
faults), where glibc would otherwise give it back to the kernel and fault it in again."""
import platform
import subprocess
import sys

import pytest

SCRIPT = """
import resource
import numpy as np
import tinynn.numpy_backend
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
    faults = int(subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True).stdout)
    assert faults < 100  # 10,240 pages where the memory went back to the kernel
