"""The autotune's cache file (matmul/tuning_cache.py): choices kept per adapter key and read back by the next
process; a file of another version, an unreadable one and a folder that cannot be written are an empty cache, never
an error. No GPU needed."""
import json
import os

import pytest

from tinynn_gpu.matmul.tuning_cache import CACHE_VERSION, FILE_NAME, TuningCache


def test_choices_are_kept_per_adapter_key_and_read_back(tmp_path):
    first, second = TuningCache(tmp_path / "new", "gpu A"), TuningCache(tmp_path / "new", "gpu B")
    assert first.choices() == {}
    assert first.keep("m=1", "blocked x") == "blocked x"
    second.keep("m=1", "blocked y")
    first.keep("m=2", "lesson8")
    assert TuningCache(tmp_path / "new", "gpu A").choices() == {"m=1": "blocked x", "m=2": "lesson8"}
    assert TuningCache(tmp_path / "new", "gpu B").choices() == {"m=1": "blocked y"}
    assert sorted(os.listdir(tmp_path / "new")) == [FILE_NAME]  # the temporary file renamed over it


@pytest.mark.parametrize("text", [json.dumps({"version": CACHE_VERSION - 1, "choices": {"gpu A": {"m=1": "old"}}}),
                                  "{not json", json.dumps({"version": CACHE_VERSION}),
                                  json.dumps(["a list"]), json.dumps({"version": CACHE_VERSION, "choices": []}),
                                  json.dumps({"version": CACHE_VERSION, "choices": {"gpu A": "x"}}),
                                  json.dumps({"version": CACHE_VERSION, "choices": {"gpu A": ["x"]}})])
def test_an_older_or_unreadable_file_is_an_empty_cache_and_is_replaced(tmp_path, text):
    (tmp_path / FILE_NAME).write_text(text)
    cache = TuningCache(tmp_path, "gpu A")
    assert cache.choices() == {}
    cache.keep("m=2", "new")
    assert json.loads((tmp_path / FILE_NAME).read_text()) == {"version": CACHE_VERSION,
                                                              "choices": {"gpu A": {"m=2": "new"}}}


def test_a_choice_of_the_wrong_type_is_dropped_and_the_others_kept(tmp_path):
    (tmp_path / FILE_NAME).write_text(json.dumps({"version": CACHE_VERSION, "choices": {
        "gpu A": {"m=1": 5, "m=2": "blocked x", "m=3": None}, "gpu B": 7}}))
    cache = TuningCache(tmp_path, "gpu A")
    assert cache.choices() == {"m=2": "blocked x"}
    cache.keep("m=4", "blocked y")
    assert TuningCache(tmp_path, "gpu A").choices() == {"m=2": "blocked x", "m=4": "blocked y"}


def test_a_folder_that_cannot_be_written_only_costs_the_choice(tmp_path):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    cache = TuningCache(blocked / "cache", "gpu A")  # its folder cannot be made
    assert cache.keep("m=1", "blocked x") == "blocked x"
    assert cache.choices() == {}


def test_a_file_that_cannot_be_replaced_leaves_no_temporary_file(tmp_path):
    (tmp_path / FILE_NAME).mkdir()  # a folder where the file should be: the rename fails
    assert TuningCache(tmp_path, "gpu A").keep("m=1", "blocked x") == "blocked x"
    assert os.listdir(tmp_path) == [FILE_NAME]
