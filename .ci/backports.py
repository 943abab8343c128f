"""Print an apt source entry (deb822) for this Debian release's backports suite: the machine's own where it has one,
else made from its Debian source (the same mirror and keyring, the suite renamed). So the repository names no
mirror, and CI takes backports from wherever the machine takes the rest of Debian.

    python3 .ci/backports.py > DIR/backports.sources   # .ci/run: a private apt configuration in DIR

It reads /etc/apt/sources.list.d/*.sources (deb822 stanzas) and /etc/apt/sources.list (one-line entries).
"""
import re
import sys
from pathlib import Path

APT = Path("/etc/apt")


def codename() -> str:
    release = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', Path("/etc/os-release").read_text(), re.MULTILINE))
    if not release.get("VERSION_CODENAME"):
        sys.exit("/etc/os-release names no VERSION_CODENAME: not a Debian release this script knows")
    return release["VERSION_CODENAME"]


def stanzas():
    """(file, {field: value}) of every deb822 entry, then of every one-line entry (as the same fields)."""
    for path in sorted(APT.glob("sources.list.d/*.sources")):
        for block in re.split(r"\n\s*\n", path.read_text()):
            fields, key = {}, None
            for line in block.splitlines():
                if line.startswith("#") or not line.strip():
                    continue
                if line[0].isspace() and key:  # a continuation line
                    fields[key] += "\n" + line
                elif ":" in line:
                    key, value = line.split(":", 1)
                    key = key.strip().lower()  # field names are case-insensitive
                    fields[key] = value.strip()
            if fields:
                yield path, fields
    one_line = APT / "sources.list"
    if one_line.exists():
        for line in one_line.read_text().splitlines():
            match = re.match(r"^\s*(deb)\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s+(.*)$", line)
            if match:
                kind, options, uri, suite, components = match.groups()
                options = dict(option.split("=", 1) for option in (options or "").split() if "=" in option)
                fields = {"types": kind, "uris": uri, "suites": suite, "components": components}
                if "signed-by" in options:
                    fields["signed-by"] = options["signed-by"]
                yield one_line, fields


def main():
    name = codename()
    entries = [(path, fields) for path, fields in stanzas() if "deb" in fields.get("types", "").split()
               and fields.get("enabled", "yes") != "no"]
    for suite in (f"{name}-backports", name):
        found = [fields for _, fields in entries if suite in fields.get("suites", "").split()]
        if found:
            fields = found[0]
            break
    else:
        sys.exit(f"no apt source entry for suite {name!r} in {APT}/sources.list.d/*.sources or {APT}/sources.list")
    print("Types: deb")
    print(f"URIs: {fields['uris']}")
    print(f"Suites: {name}-backports")
    print("Components: main")
    if "signed-by" in fields:
        print(f"Signed-By: {fields['signed-by']}")


if __name__ == "__main__":
    main()
