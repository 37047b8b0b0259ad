#!/usr/bin/env python3
"""No source file imports a file that imports it back.

For every crate in the workspace this reads each `.rs` file under `src/`, takes the module
paths it names (`use crate::…`, `use super::…`, and `crate::…` / `super::…` inside code),
resolves each to the file that holds that module, and reports every pair of files that
name each other. A parent's `mod child;` and its `pub use child::…` re-exports are the
module's facade, not imports, and are not counted; nor are `#[cfg(test)]` modules, which
may reach anywhere. Run from the repository root; exits 1 when it finds a pair.
"""
import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def crate_roots():
    for top in [".", "agent", "loadtest", "fuzz"] + [os.path.join("crates", d) for d in sorted(os.listdir("crates"))]:
        src = os.path.join(top, "src")
        if os.path.isfile(os.path.join(top, "Cargo.toml")) and os.path.isdir(src):
            yield src


def module_files(src):
    """Maps a module path (a tuple of names, () for the crate root) to its file, per target root."""
    roots = {}
    for entry in ("lib.rs", "main.rs"):
        if os.path.isfile(os.path.join(src, entry)):
            roots[entry] = os.path.join(src, entry)
    out = {}
    for root_file in roots.values():
        files = {(): root_file}
        stack = [((), root_file)]
        while stack:
            path, f = stack.pop()
            base = os.path.dirname(f) if os.path.basename(f) in ("lib.rs", "main.rs", "mod.rs") else f[:-3]
            for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", strip_tests(read(f)), re.M):
                name = m.group(1)
                for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                    if os.path.isfile(cand):
                        files[path + (name,)] = cand
                        stack.append((path + (name,), cand))
                        break
        out[root_file] = files
    return out


def read(f):
    with open(f, encoding="utf-8") as fh:
        return fh.read()


def strip_tests(text):
    """Drops `#[cfg(test)]` items (a module or a function) and comments."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        j = m.end()
        semi = text.find(";", j)
        brace = text.find("{", j)
        if brace == -1 or (semi != -1 and semi < brace):
            i = semi + 1
            continue
        depth, k = 0, brace
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1
    out.append(text[i:])
    return "".join(out)


def expand(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = tree.strip()
    brace = tree.find("{")
    if brace == -1:
        return [tree.split(" as ")[0].strip()]
    prefix, inner = tree[:brace], tree[brace + 1:tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    return [prefix + p for part in parts if part.strip() for p in expand(part.strip())]


def named_paths(text):
    """Module paths a file names, facade re-exports (`pub use` of its own children) apart."""
    paths = []
    for m in re.finditer(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text, re.M):
        for p in expand(m.group(2)):
            paths.append((bool(m.group(1)), p.lstrip(":")))
    body = re.sub(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+[^;]+;", "", text, flags=re.M)
    for m in re.finditer(r"\b((?:crate|super)(?:::" + IDENT + r")+)", body):
        paths.append((False, m.group(1)))
    return paths


def resolve(path, here, files):
    segs = path.split("::")
    if segs[0] == "crate":
        mod, segs = (), segs[1:]
    elif segs[0] == "self":
        mod, segs = here, segs[1:]
    elif here + (segs[0],) in files:
        mod = here
    elif segs[0] == "super":
        mod = here
        while segs and segs[0] == "super":
            mod, segs = mod[:-1], segs[1:]
    else:
        return None
    for s in segs:
        if mod + (s,) in files:
            mod = mod + (s,)
        else:
            break
    return mod


def main():
    pairs = []
    for src in crate_roots():
        for files in module_files(src).values():
            edges = {}
            for mod, f in files.items():
                for public, p in named_paths(strip_tests(read(f))):
                    target = resolve(p, mod, files)
                    if target is None or target == mod:
                        continue
                    # A parent re-exporting its own child is the module's facade.
                    if public and target[:len(mod)] == mod:
                        continue
                    # A child naming its ancestor's items through `super` or `crate` is
                    # counted; an ancestor is only counted back through a real `use`.
                    edges.setdefault(mod, set()).add(target)
            for a, targets in edges.items():
                for b in targets:
                    if a < b and a in edges.get(b, set()):
                        pairs.append((files[a], files[b]))
    for a, b in sorted(set(pairs)):
        print(f"{a} <-> {b}")
    if pairs:
        print(f"{len(set(pairs))} pair(s) of files import each other", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
