#!/usr/bin/env bash
# The LM data of issue 12 (docs/results/lm/README.md): the Linux kernel source of Debian's linux-source-6.1 package,
# pinned to one version and checksum, tokenised into shards by tools/lm_data.py.
#
#   bash tools/lm_data.sh OUTDIR [tools/lm_data.py options, e.g. --vocab 8192]
#
# The .deb and the unpacked tree go to $LM_DOWNLOAD_DIR (default data/lm-download, git-ignored) and are reused
# when present. Needs apt-get (Debian 12 sources), python3-sentencepiece and python3-numpy (tools/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 OUTDIR [lm_data.py options]" >&2; exit 2; }
out=$1; shift

PACKAGE=linux-source-6.1
VERSION=6.1.192-3   # bookworm-security, 2026-11; its .deb holds usr/src/linux-source-6.1.tar.xz
SHA256=5259c57ca92092da39bd2ea803046da0e3c28f2b6a11ea20f6297468188ceb67
deb=${PACKAGE}_${VERSION}_all.deb
dl=${LM_DOWNLOAD_DIR:-data/lm-download}
tree=$dl/linux-source-6.1

mkdir -p "$dl"
if [ ! -f "$dl/$deb" ]; then
  # apt-get download fetches into the current folder, as the calling user (no root needed).
  if ! (cd "$dl" && apt-get download "$PACKAGE=$VERSION"); then
    echo "lm_data.sh: $PACKAGE=$VERSION is not in the apt sources any more; fetch $deb (sha256 $SHA256)" \
         "from snapshot.debian.org into $dl" >&2
    exit 1
  fi
fi
echo "$SHA256  $dl/$deb" | sha256sum -c --quiet - || { echo "lm_data.sh: $dl/$deb: checksum mismatch" >&2; exit 1; }
if [ ! -d "$tree" ]; then
  dpkg-deb --fsys-tarfile "$dl/$deb" | tar -xO ./usr/src/linux-source-6.1.tar.xz | tar -xJ -C "$dl"
fi
/usr/bin/python3 tools/lm_data.py --source "$tree" --out "$out" --label "Debian $PACKAGE $VERSION (sha256 $SHA256)" "$@"
