#!/bin/bash
# The manual pages render without a groff warning, and say what their
# sources say: every option of --help is in shmtensord(8) and
# shmtensorctl(1), every key of the sample config in shmtensord.toml(5).
#   man/check_pages.sh MAN_DIR SAMPLE_TOML BIN_DIR
set -euo pipefail
man_dir=$1 sample=$2 bin=$3
command -v groff >/dev/null || { echo "no groff: skipped"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
pages=("$man_dir/shmtensord.toml.5")
for p in shmtensord.8 shmtensorctl.1; do
  [[ -f "$man_dir/$p" ]] && pages+=("$man_dir/$p")
done
for page in "${pages[@]}"; do
  warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1)
  [[ -z "$warnings" ]] || fail "$page: $warnings"
  text=$(groff -man -Tutf8 "$page" 2>/dev/null | col -bx)
  grep -q "^NAME" <<<"$text" || fail "$page has no NAME"
  case "$(basename "$page")" in
    shmtensord.toml.5)
      keys=$(grep -oE '^#? ?[a-z_]+ *=' "$sample" | tr -d '# =' | sort -u)
      ;;
    *)
      program=$(basename "$page" | cut -d. -f1)
      keys=$("$bin/$program" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u)
      ;;
  esac
  for k in $keys; do
    grep -qF -- "$k" <<<"$text" || fail "$page does not name $k"
  done
  echo "$(basename "$page"): $(wc -w <<<"$keys") keys or options, no warning"
done
