#!/bin/sh
# Adds the image's fixed non-root account the server runs as, by appending its lines to the account
# files. useradd would stamp /etc/shadow with the day of the build and leave passwd- backups and
# lastlog entries behind; these lines hold nothing but the arguments, so the layer is the same on
# every build. Then makes the account's home and the cache mount point, owned by it (a named volume
# mounted there starts with that owner).
# Usage: add_user.sh NAME ID HOME CACHE_DIR   (ID is the uid and the gid; ROOT, if set, prefixes every path)
set -eu
name=$1
id=$2
home=$3
cache=$4
root=${ROOT:-}
taken() {  # FIELD VALUE FILE: VALUE is already in that colon-separated field of FILE
    cut -d: -f"$1" "$3" | grep -qx -- "$2"
}
for file in passwd group; do
    if taken 1 "$name" "$root/etc/$file" || taken 3 "$id" "$root/etc/$file"; then
        echo "add_user.sh: $name or id $id is already in /etc/$file" >&2
        exit 1
    fi
done
printf '%s:x:%s:%s::%s:/bin/sh\n' "$name" "$id" "$id" "$home" >> "$root/etc/passwd"
printf '%s:x:%s:\n' "$name" "$id" >> "$root/etc/group"
# Locked password, no dates: nothing in the shadow files depends on when the image was built.
if [ -f "$root/etc/shadow" ]; then
    printf '%s:!:::::::\n' "$name" >> "$root/etc/shadow"
fi
if [ -f "$root/etc/gshadow" ]; then
    printf '%s:!::\n' "$name" >> "$root/etc/gshadow"
fi
mkdir -p "$root$home" "$root$cache"
chown "$id:$id" "$root$home" "$root$cache"
chmod 0755 "$root$home" "$root$cache"
