""".ci/backports.py: the backports source made from a machine's own apt entries."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / ".ci" / "backports.py"


@pytest.fixture
def backports(tmp_path, monkeypatch):
    if not SCRIPT.is_file():
        pytest.skip("not a source checkout")
    spec = importlib.util.spec_from_file_location("backports", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "sources.list.d").mkdir()
    monkeypatch.setattr(module, "APT", tmp_path)
    monkeypatch.setattr(module, "codename", lambda: "bookworm")
    return module


def test_an_inline_signed_by_key_is_carried_over(backports, capsys):
    """deb822 field names are case-insensitive and a key may be inline, on continuation lines."""
    (backports.APT / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBGPL\n -----END PGP PUBLIC KEY BLOCK-----\n")
    backports.main()
    out = capsys.readouterr().out
    assert "URIs: http://deb.example/debian\nSuites: bookworm-backports\n" in out
    assert out.endswith("Signed-By: \n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n mQINBGPL\n"
                        " -----END PGP PUBLIC KEY BLOCK-----\n")
