#!/bin/sh
# Installs exactly the locked .debs, from a read-only directory, with no network and no package index:
# every file is checked against the sha256 the lock gives it (the list, rendered from matrix.lock)
# before dpkg sees any, then one dpkg run installs them all (it orders their configuration itself).
# Usage: install_debs.sh DEBS_DIR LIST   (LIST: sha256sum lines, "<sha256>  <file name>")
set -eu
debs=$1
list=$2
cd "$debs"
sha256sum --check --strict --quiet "$list"
set --
while read -r _sha256 name; do
    set -- "$@" "$debs/$name"
done < "$list"
DEBIAN_FRONTEND=noninteractive dpkg --install --log=/dev/null "$@"
# What dpkg leaves that differs from run to run (inode numbers, dated logs, backups): not in the image.
rm -f /var/cache/ldconfig/aux-cache /var/log/alternatives.log /var/lib/dpkg/status-old /var/lib/dpkg/available-old \
    /var/cache/debconf/config.dat-old /var/cache/debconf/templates.dat-old
