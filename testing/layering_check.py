#!/usr/bin/env python3
"""Checks that the tree keeps its layers: every quoted #include of the C++
sources is allowed by the rules below, which are the architecture
CONTRIBUTING.md draws (proto -> common -> {daemon, client} -> {python, ctl};
inside the daemon os -> memory -> ledger -> store -> server -> the top; the
server sees the store through its facade only), and
the installed headers (client/include/, common/include/) include only each
other, Abseil and system headers: never an internal or generated one, which
`cmake --install` does not install. Prints each
include that breaks a rule, naming the file, line and rule, and exits 1 if
there is one.

Usage: layering_check.py [SOURCE_DIR]   (default: this file's repository)
"""

import os
import pathlib
import re
import sys

DAEMON_LAYERS = ["os", "memory", "ledger", "store", "server"]


def daemon_layer(include):
    """The daemon layer an include names ("top" for daemon/x.h), or None."""
    parts = include.split("/")
    if parts[0] != "daemon":
        return None
    return parts[1] if len(parts) > 2 else "top"


# What the gRPC adapters (daemon/server) may see of the store: the facade
# that owns the one lock and admits every call (a Caller), the monitoring
# views built under it, and the limits. Its tables, and the pools inside
# it, are the store's own.
STORE_FACADE = {"daemon/store/object_store.h", "daemon/store/caller.h",
                "daemon/store/store_views.h", "daemon/store/limits.h"}


# Where the project's own headers live, as an include names them.
PROJECT_PREFIXES = ("client/", "common/", "daemon/", "python/", "ctl/",
                    "proto/", "tests/", "testing/", "bench/", "shmtensor/")


def rules_for(path, client_headers, public_headers):
    """(rule, predicate) pairs: an include for which a predicate is true
    breaks that rule. `client_headers`: the client's public headers as
    sources include them ("shmtensor/client.h"); `public_headers`: every
    installed header so named (the client's and common's)."""
    top = path.parts[0]
    rules = []
    if len(path.parts) > 1 and path.parts[1] == "include":
        rules.append(("an installed header includes only installed ones",
                      lambda i: i.startswith(PROJECT_PREFIXES) and
                      i not in public_headers))
    if top in ("common", "daemon"):
        rules.append(("the client is not below " + top,
                      lambda i: i.startswith("client/") or
                      i in client_headers))
        rules.append((f"the binding and the CLI are not below {top}",
                      lambda i: i.startswith(("python/", "ctl/"))))
    if top == "common":
        rules.append(("common stands on the proto only",
                      lambda i: i.startswith("daemon/")))
    if top in ("client", "python", "ctl"):
        rules.append(("the daemon is not a library of " + top,
                      lambda i: i.startswith("daemon/")))
    if top == "client":
        rules.append(("the binding and the CLI sit above the client",
                      lambda i: i.startswith(("python/", "ctl/"))))
    if path.parts[:2] == ("daemon", "server"):
        rules.append(("the gRPC adapters reach the store through its facade "
                      "only (" + ", ".join(sorted(STORE_FACADE)) + "), "
                      "and the pools not at all",
                      lambda i: (i.startswith("daemon/store/") and
                                 i not in STORE_FACADE) or
                      i.startswith("daemon/memory/")))
    if top == "daemon" and len(path.parts) > 2:
        layer = path.parts[1]
        if layer in DAEMON_LAYERS:
            above = DAEMON_LAYERS[DAEMON_LAYERS.index(layer) + 1:] + ["top"]
            rules.append((f"daemon/{layer} includes only the layers "
                          "before it (os, memory, store, server)",
                          lambda i, a=above: daemon_layer(i) in a))
    return rules


def violations(root):
    # Quoted and angle-bracket includes alike (the root is on the include
    # path, so <daemon/...> compiles too).
    include = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
    client_headers = {
        f"shmtensor/{h.name}"
        for h in (root / "client/include/shmtensor").glob("*.h")}
    public_headers = client_headers | {
        f"shmtensor/{h.name}"
        for h in (root / "common/include/shmtensor").glob("*.h")}
    found = []
    for folder in ("common", "daemon", "client", "python/src", "ctl"):
        for f in sorted((root / folder).rglob("*")):
            if f.suffix not in (".h", ".cc", ".cu"):
                continue
            rel = f.relative_to(root)
            rules = rules_for(rel, client_headers, public_headers)
            for n, line in enumerate(f.read_text().splitlines(), 1):
                m = include.match(line)
                if not m:
                    continue
                name = m.group(1)
                if name.startswith("."):  # Relative: as from the root.
                    name = os.path.normpath(str(rel.parent / name))
                for rule, breaks in rules:
                    if breaks(name):
                        found.append(f"{rel}:{n}: includes \"{m.group(1)}\": "
                                     f"{rule}")
    return found


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parents[1])
    if not (root / "daemon").is_dir():
        print(f"{root}: not a shmtensor source tree", file=sys.stderr)
        return 2
    found = violations(root)
    for v in found:
        print(v)
    print(f"layering: {len(found)} includes break a rule")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
