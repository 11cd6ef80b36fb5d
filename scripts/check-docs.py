#!/usr/bin/env python3
"""Fails when a public symbol of a library has no `///` documentation comment.

Reads the symbol graphs `swift package dump-symbol-graph --minimum-access-level public` writes (run
it first) for the libraries apps and servers use: Haul, HaulURLSession and HaulDaemon. Members the compiler makes
(`hashValue`, `hash(into:)`, `==` of a synthesized conformance) are not written in the source and
are left out; so are members a type gets from a protocol's extension (documented there).

    swift package dump-symbol-graph --minimum-access-level public && scripts/check-docs.py
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULES = ["Haul", "HaulURLSession", "HaulDaemon"]


def main():
    graphs = list((ROOT / ".build").glob("*/symbolgraph"))
    if not graphs:
        print("no symbol graphs: run `swift package dump-symbol-graph --minimum-access-level public` first")
        sys.exit(1)
    directory = max(graphs, key=lambda path: path.stat().st_mtime)
    missing = []
    counted = 0
    for module in MODULES:
        # The module's own graph, and those of its extensions of other modules' types.
        paths = [directory / f"{module}.symbols.json"] + sorted(directory.glob(f"{module}@*.symbols.json"))
        symbols = [symbol for path in paths for symbol in json.loads(path.read_text())["symbols"]]
        for symbol in symbols:
            if symbol.get("accessLevel") not in ("public", "open"):
                continue
            # Written by the compiler, or inherited from elsewhere: no source line of this module.
            if "location" not in symbol or not symbol["location"]["uri"].startswith("file://" + str(ROOT / "Sources")):
                continue
            counted += 1
            if not symbol.get("docComment"):
                location = symbol["location"]
                path = location["uri"].removeprefix("file://" + str(ROOT) + "/")
                line = location["position"]["line"] + 1
                name = ".".join(symbol["pathComponents"])
                missing.append(f"{path}:{line}: {module}.{name} ({symbol['kind']['displayName']}) has no /// comment")
    for line in missing:
        print(line)
    if missing:
        sys.exit(1)
    print(f"every one of {counted} public symbols of {', '.join(MODULES)} is documented")


if __name__ == "__main__":
    main()
