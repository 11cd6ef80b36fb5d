#!/usr/bin/env python3
"""Checks that the platform layer is complete on both sides, from Linux.

1. Every function of `Platform+Linux.swift` has a twin in `Platform+Darwin.swift` with the same
   signature (name, parameters, result, effects), and the other way round.
2. No Swift file outside a `+Linux.swift` file calls a system function or uses a constant that only
   Glibc has, unless the use sits in an `#if os(Linux)` or `#if canImport(Glibc)` branch.

    scripts/check-platform.py        exit 0 when both hold; else one line per problem, exit 1
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLATFORM = ROOT / "Sources/Haul/Platform"

# What Glibc (Linux) has and Darwin does not, as Haul might use it.
LINUX_ONLY = [
    r"\bfdatasync\s*\(", r"\bfallocate\s*\(", r"\bhaul_fallocate\s*\(", r"\bO_DIRECT\b", r"\bO_TMPFILE\b",
    r"\"/proc/", r"\bumount2\s*\(", r"\bmount\s*\(\s*\"", r"\bMNT_DETACH\b", r"\bepoll_\w+", r"\binotify_\w+",
    r"\bsendfile\s*\(", r"\bsplice\s*\(", r"\bmemfd_create\s*\(", r"\bgettid\s*\(", r"\bsyncfs\s*\(",
    r"\bFALLOC_FL_\w+", r"\bsysinfo\s*\(", r"\bprctl\s*\(",
    # Structures on Linux that are pointers on Darwin: `T()` builds only on Linux.
    r"\bposix_spawn_file_actions_t\(\)", r"\bposix_spawnattr_t\(\)", r"\bpthread_t\(\)",
    r"\bpthread_mutex_t\(\)",
]
LINUX_BRANCH = re.compile(r"(?<!!)(os\(Linux\)|canImport\(Glibc\)|canImport\(Musl\))")


def signatures(path):
    """`name(label: Type, ...) -> Result` of every `static func`, whitespace normalised."""
    text = path.read_text()
    found = {}
    for match in re.finditer(r"static func\s+(\w+)\s*(\((?:[^()]|\([^()]*\))*\))\s*([^{]*)\{", text):
        name, parameters, rest = match.groups()
        signature = " ".join((name + parameters + " " + rest).split())
        found[name] = signature
    return found


def check_signatures():
    problems = []
    linux = signatures(PLATFORM / "Platform+Linux.swift")
    darwin = signatures(PLATFORM / "Platform+Darwin.swift")
    for name in sorted(set(linux) | set(darwin)):
        if name not in darwin:
            problems.append(f"Platform.{name} has no Darwin implementation (Platform+Darwin.swift)")
        elif name not in linux:
            problems.append(f"Platform.{name} has no Linux implementation (Platform+Linux.swift)")
        elif linux[name] != darwin[name]:
            problems.append(f"Platform.{name} differs: Linux `{linux[name]}`, Darwin `{darwin[name]}`")
    if not linux:
        problems.append("no platform functions found: is Sources/Haul/Platform where they live?")
    return problems, len(linux)


def check_linux_only_symbols():
    problems = []
    patterns = [re.compile(pattern) for pattern in LINUX_ONLY]
    for path in sorted(list((ROOT / "Sources").rglob("*.swift")) + list((ROOT / "Tests").rglob("*.swift"))):
        if path.name.endswith("+Linux.swift"):
            continue
        branches = []  # for each open #if: whether the branch being read is a Linux one
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith("#if "):
                branches.append(bool(LINUX_BRANCH.search(stripped)))
            elif stripped.startswith("#elseif "):
                branches[-1] = bool(LINUX_BRANCH.search(stripped))
            elif stripped.startswith("#else"):
                branches[-1] = False
            elif stripped.startswith("#endif"):
                branches.pop()
            if stripped.startswith("//") or any(branches):
                continue
            code = line.split("//")[0] if "\"" not in line else line
            for pattern in patterns:
                if pattern.search(code):
                    relative = path.relative_to(ROOT)
                    problems.append(
                        f"{relative}:{number}: `{pattern.pattern}` exists on Linux only: move it to a "
                        f"+Linux.swift file (with a Darwin twin) or an #if os(Linux) branch")
    return problems


def main():
    problems, count = check_signatures()
    problems += check_linux_only_symbols()
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(1)
    print(f"platform layer: {count} functions on both Linux and Darwin; no Linux-only call elsewhere")


if __name__ == "__main__":
    main()
