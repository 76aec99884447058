#!/usr/bin/env python3
"""The architecture review's counts of the house, taken the review's way (../shared/reviews/
architecture-2026-11-28.md, "How the figures were taken"), so that a closing note can give them again:

- rooms: a file or folder at src/'s top level; arrows: room A imports room B when a file of A names
  `crate::B` (in a `use`, a path or a `crate::{…}` group); floors: the longest chain of arrows plus one, when
  there is no circle (circles are listed; tests/it/layering.rs's rule looks finer, between the modules of
  different rooms, where a shared room's modules are its files and folders);
- shared rooms each pipeline imports (a pipeline is a room that `src/pipelines.rs` registers);
- functions over 60 and over 100 lines: a brace-matching count over src/**/*.rs, strings and comments
  blanked, a function from its `fn` line to its closing brace;
- all of it without the `#[cfg(test)]` items (the program, not its tests);
- files over 600 lines: src/**/*.rs and fused/*.

Prints a Markdown table. Duplicate pairs come from the `duplicates` tool, not from here.

usage: scripts/house_counts.py [--root DIR]
"""
import argparse
import pathlib
import re
import sys


def registered_pipelines(src):
    """The pipelines src/pipelines.rs registers (its `&crate::NAME::PIPELINE` entries), in its order."""
    return re.findall(r"&crate::([a-z_][a-z0-9_]*)::PIPELINE\b", (src / "pipelines.rs").read_text())


def blank(source):
    """The source with its comments, strings and char literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", source[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', source[i:i + 10]) and (i == 0 or not source[i - 1].isalnum()):
            hashes = re.match(r"r(#*)\"", source[i:]).group(1)
            end = source.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", source[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", source[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", source[i:i + 4]):
            m = re.match(r"'(\\.|[^\\'])'", source[i:i + 4])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def without_tests(text):
    """Blanked source `text` with each `#[cfg(test)]` item (a test module, a test-only function) blanked
    too: the counts are of the program, not of its tests."""
    while (at := text.find("#[cfg(test)]")) >= 0:
        open_brace, semicolon = text.find("{", at), text.find(";", at)
        if open_brace < 0 or 0 <= semicolon < open_brace:
            end = semicolon + 1  # a `use` or a declaration
        else:
            depth, end = 0, open_brace
            for end in range(open_brace, len(text)):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                if depth == 0:
                    break
            end += 1
        text = text[:at] + re.sub(r"[^\n]", " ", text[at:end]) + text[end:]
    return text


def functions(text):
    """(name, lines) of each fn with a body in blanked source `text`."""
    found = []
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", text):
        depth, i, start = 0, m.end(), None
        while i < len(text):
            ch = text[i]
            if ch == ";" and start is None and depth == 0:
                break  # a declaration without a body
            if ch == "{":
                if start is None:
                    start = i
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and start is not None:
                    first = text.count("\n", 0, m.start()) + 1
                    last = text.count("\n", 0, i) + 1
                    found.append((m.group(1), last - first + 1))
                    break
            elif ch in "([" and start is None:
                # parameters and generics: skip the balanced group
                close = {"(": ")", "[": "]"}[ch]
                level = 0
                while i < len(text):
                    if text[i] == ch:
                        level += 1
                    elif text[i] == close:
                        level -= 1
                        if level == 0:
                            break
                    i += 1
            i += 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parents[1], type=pathlib.Path)
    root = parser.parse_args().root
    src = root / "src"
    pipelines = registered_pipelines(src)
    rooms = sorted(p.stem if p.is_file() else p.name for p in src.iterdir()
                   if p.suffix == ".rs" or p.is_dir())
    arrows = {room: set() for room in rooms}
    fns, long_files = [], []
    for path in sorted(src.rglob("*.rs")):
        room = path.relative_to(src).parts[0].removesuffix(".rs")
        raw = path.read_text()
        text = without_tests(blank(raw))
        for m in re.finditer(r"\bcrate::(\{[^}]*\}|[a-z_][a-z0-9_]*)", text):
            names = re.findall(r"(?:^|[{,\s])([a-z_][a-z0-9_]*)", m.group(1).strip("{}")) if m.group(1).startswith("{") \
                else [m.group(1)]
            arrows[room].update(n for n in names if n in arrows and n != room)
        fns.extend((str(path.relative_to(root)), name, lines) for name, lines in functions(text))
        if raw.count("\n") > 600:
            long_files.append((str(path.relative_to(root)), raw.count("\n")))
    for path in sorted((root / "fused").iterdir()):
        if path.suffix in (".cu", ".cuh") and path.read_text().count("\n") > 600:
            long_files.append((str(path.relative_to(root)), path.read_text().count("\n")))

    floors, circles = {}, []

    def floor(room, trail):
        if room in trail:
            circles.append(" → ".join(trail[trail.index(room):] + [room]))
            return 0
        if room not in floors:
            floors[room] = 1 + max((floor(b, trail + [room]) for b in sorted(arrows[room])), default=0)
        return floors[room]

    for room in rooms:
        floor(room, [])
    shared = [r for r in rooms if r not in pipelines and r not in ("main", "lib", "pipelines")]
    print("| count | value |")
    print("|---|---|")
    print(f"| rooms of src/ | {len(rooms)} ({', '.join(rooms)}) |")
    print(f"| arrows | {sum(len(a) for a in arrows.values())} |")
    print(f"| floors | {'— (circles)' if circles else max(floors.values())} |")
    print(f"| circles | {len(set(circles))}{': ' + '; '.join(sorted(set(circles))) if circles else ''} |")
    for p in pipelines:
        if p in arrows:
            imported = sorted(arrows[p] & set(shared))
            print(f"| shared rooms `{p}` imports | {len(imported)} ({', '.join(imported)}) |")
    crossing = {p: sorted(arrows[p] & set(pipelines)) for p in pipelines if p in arrows and arrows[p] & set(pipelines)}
    print(f"| pipelines importing another | {len(crossing)}{' ' + str(crossing) if crossing else ''} |")
    print(f"| functions | {len(fns)} |")
    for limit in (60, 100):
        over = sorted((f for f in fns if f[2] > limit), key=lambda f: -f[2])
        shown = ", ".join(f"`{name}` {lines} ({path})" for path, name, lines in over[:6])
        print(f"| functions over {limit} lines | {len(over)}{': ' + shown if over else ''}{' …' if len(over) > 6 else ''} |")
    long_files.sort(key=lambda f: -f[1])
    print(f"| files over 600 lines | {len(long_files)}: {', '.join(f'{p} {n}' for p, n in long_files)} |")


if __name__ == "__main__":
    sys.exit(main())
