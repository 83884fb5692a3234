#!/bin/bash
# The base image for offline builds: Debian bookworm from debootstrap (minbase, from the
# apt mirror this host uses), trimmed the way debian:bookworm-slim is, imported into the
# engine as $BASE_TAG. Does nothing when that image exists (BASE_FORCE=1 rebuilds it).
set -euo pipefail

DOCKER=${DOCKER:-/usr/bin/docker}
BASE_TAG=${BASE_TAG:-directlog/debian-base:bookworm}
SUITE=bookworm

if [ "${BASE_FORCE:-0}" != 1 ] && "$DOCKER" image inspect "$BASE_TAG" >/dev/null 2>&1; then
    exit 0
fi

# The first URI this host's apt uses for a suite, from its deb822 .sources files, then its
# one-line .list files; comments and disabled stanzas are skipped.
host_mirror() {
    local suite=$1 file
    shopt -s nullglob
    {
        for file in /etc/apt/sources.list.d/*.sources; do
            sed '/^[[:space:]]*#/d' "$file"
            echo
        done | awk -v RS= -v suite="$suite" '{
            uri = ""; found = 0; key = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^[A-Za-z-]+:$/) { key = $i; continue }
                if (key == "URIs:" && uri == "") uri = $i
                if (key == "Suites:" && $i == suite) found = 1
                if (key == "Enabled:" && $i == "no") found = -1
            }
            if (uri != "" && found == 1) print uri
        }'
        for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [ -f "$file" ] || continue
            awk -v suite="$suite" '$1 == "deb" {
                for (i = 2; i < NF; i++) if ($i !~ /^\[/ && $(i + 1) == suite) { print $i; break }
            }' "$file"
        done
    } | head -n 1
}

MIRROR=${DEBIAN_MIRROR:-$(host_mirror "$SUITE")}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-$(host_mirror "$SUITE-security")}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}

if ! command -v debootstrap >/dev/null; then
    echo "base.sh: installing debootstrap with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi

work=$(mktemp -d /var/tmp/directlog-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
echo "base.sh: debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    exit 1
}

# What debian:bookworm-slim has: deb822 sources with updates and security, no docs, man
# pages or translations installed, no package caches kept, and nothing of this host's.
rm -f "$root/etc/apt/sources.list"
cat >"$root/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
DPKG
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
APT
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
find "$root/usr/share/doc" -mindepth 2 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/{man,info}/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* \
    "$root"/var/log/* "$root"/tmp/* "$root"/etc/resolv.conf "$root"/etc/hostname
: >"$root/etc/machine-id"

tar --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -C "$root" -c . |
    "$DOCKER" import --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' \
        --message "debootstrap --variant=minbase $SUITE" - "$BASE_TAG" >/dev/null
echo "base.sh: imported $BASE_TAG"
