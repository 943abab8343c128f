"""Loading WGSL (runtime/wgsl.py): a kernel file found by name in its wing, what is prepended to it, a missing
one named with the folders searched, and the two ways a template is filled in. No GPU needed."""
from importlib import resources

import pytest

from tinynn_gpu.runtime import wgsl


def test_kernel_file_names_are_unique_across_the_wings():
    """A name is looked up wing by wing, so a second file of the same name would never be loaded."""
    seen = {}
    for wing in wgsl.WINGS:
        for path in (resources.files("tinynn_gpu") / wing).iterdir():
            if path.name.endswith(".wgsl"):
                assert path.name not in seen, f"{path.name} is in both {seen[path.name]}/ and {wing}/"
                seen[path.name] = wing
    assert {"softmax.wgsl", "blocked.wgsl", "common.wgsl"} <= set(seen)


def test_an_ops_kernel_gets_common_and_its_params_binding_a_matmul_kernel_common_alone():
    common, op_params = wgsl.kernel_file("common"), wgsl.kernel_file("op_params")
    softmax, rows = wgsl.kernel_source("softmax"), wgsl.kernel_source("rows")
    assert softmax.startswith(common) and op_params in softmax and softmax.endswith(wgsl.kernel_file("softmax"))
    assert rows.startswith(common) and op_params not in rows and rows.endswith(wgsl.kernel_file("rows"))
    assert wgsl.kernel_source("lesson") == wgsl.kernel_file("lesson")  # self-contained


def test_a_missing_kernel_file_names_the_folders_searched():
    with pytest.raises(FileNotFoundError, match=r"no kernel file nothing\.wgsl in tinynn_gpu's ops, matmul, kernels"):
        wgsl.kernel_source("nothing")


def test_fill_replaces_every_marked_key_and_leaves_the_rest():
    text = "const N = {{N}}u; const M = {{N}}u; {{OTHER}}"
    assert wgsl.fill(text, {"N": 4}) == "const N = 4u; const M = 4u; {{OTHER}}"
    assert wgsl.fill(text, None) == text


def test_unroll_repeats_a_line_per_value_of_each_marker_in_its_code_not_in_its_comment():
    text = "acc$r = acc$r + x[$r];  // row $r\nlet y = 1;  // not per $r\nz$a$b = 0;"
    assert wgsl.unroll(text, {"$r": 2, "$a": 2, "$b": 3}).splitlines() == [
        "acc0 = acc0 + x[0];  // row 0",
        "acc1 = acc1 + x[1];  // row 1",
        "let y = 1;  // not per $r",
        *(f"z{a}{b} = 0;" for a in range(2) for b in range(3))]
