#!/usr/bin/env python3
"""Writes shmtensord.toml(5) from the sample config (deploy/shmtensord.toml).

The sample is the one description of every key: its comment blocks become
the page's text, each key line (commented out or not) a tagged paragraph
with its default, and each [table] a subsection. Usage:

    config_to_man.py SAMPLE.toml VERSION OUT.5
"""
import re
import sys

KEY = re.compile(r'^#?\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$')
TABLE = re.compile(r'^#?\s*(\[\[?[A-Za-z_.]+\]\]?)\s*(#.*)?$')


def roff(text):
    """Escapes text for roff: backslashes, and lines starting with . or '."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"^([.'])", r"\\&\1", text, flags=re.M)


def paragraphs(comment_lines):
    """Comment lines (without '# ') joined into paragraphs."""
    out, cur = [], []
    for line in comment_lines:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def main():
    sample, version, out_path = sys.argv[1:4]
    with open(sample, encoding="utf-8") as f:
        lines = f.read().splitlines()
    # Blocks: runs of lines between blank lines.
    blocks, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line)
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    page = [
        '.TH SHMTENSORD.TOML 5 "" "shmtensor %s" "File Formats"' % version,
        ".SH NAME",
        "shmtensord.toml \\- configuration of shmtensord",
        ".SH SYNOPSIS",
        ".B shmtensord \\-\\-config",
        ".I FILE",
        ".SH DESCRIPTION",
    ]
    for text in paragraphs([l.lstrip("#").strip() for l in blocks[0]]):
        page += [".PP", roff(text)]
    page.append(".SH KEYS")
    for block in blocks[1:]:
        comments, keys = [], []
        for line in block:
            table = TABLE.match(line)
            key = KEY.match(line)
            if re.match(r"^\s+#", line) and keys and keys[-1][0] == "key":
                # The previous key's note, continued.
                k = keys[-1]
                keys[-1] = k[:3] + ((k[3] + " " + line.strip().lstrip("#")
                                     .strip()).strip(), k[4])
            elif table:
                keys.append(("table", table.group(1), ""))
            elif key and (not line.startswith("#") or
                          re.match(r"^#\s*[a-z_]+\s*=", line)):
                value, _, note = key.group(2).partition("#")
                keys.append(("key", key.group(1), value.strip(),
                             note.strip(), line.startswith("#")))
            else:
                comments.append(line.lstrip("#").strip())
        for k in keys:
            if k[0] == "table":
                page += [".SS " + roff(k[1])]
        text = paragraphs(comments)
        for t in text:
            page += [".PP", roff(t)]
        for k in keys:
            if k[0] != "key":
                continue
            _, name, value, note, commented = k
            page += [".TP", ".B %s" % roff(name)]
            what = ("example, not set by default: " if commented else
                    "default: ") + value
            page.append(roff(what + (" (%s)" % note if note else "")))
    page += [
        ".SH SEE ALSO",
        ".BR shmtensord (8),",
        ".BR shmtensorctl (1)",
    ]
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(page) + "\n")


if __name__ == "__main__":
    main()
