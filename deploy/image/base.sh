#!/bin/sh
# Make the image's base, jobfair-base:bookworm, from Debian's own packages (`make
# image-base`): debootstrap's minimal Debian 12 with python3 (3.11) and the CA
# certificates, security updates applied, documentation and apt's lists left out, imported
# into podman.  For a machine that cannot pull from an image registry; with one, build
# with --build-arg BASE=docker.io/library/python:3.11-slim-bookworm instead.
#
#   deploy/image/base.sh [TAG]      (as root: debootstrap makes device nodes and chowns)
#   MIRROR=http://…/debian  SECURITY_MIRROR=http://…/debian-security   to choose mirrors
set -eu

TAG=${1:-jobfair-base:bookworm}
SUITE=bookworm
PODMAN=${PODMAN:-podman}

# The mirrors apt uses on this machine (deb822 or one-line sources), else Debian's own.
mirror_of() {
    cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
        grep -v '^[[:space:]]*#' | grep -Eo "https?://[^ ]+/$1/?( |\$)" | head -n 1 | tr -d ' '
}
MIRROR=${MIRROR:-$(mirror_of debian)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-$(mirror_of debian-security)}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}

ROOTFS=$(mktemp -d /var/tmp/jobfair-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

echo "debootstrap $SUITE from $MIRROR into $ROOTFS" >&2
nice debootstrap --variant=minbase --include=python3,ca-certificates \
    "$SUITE" "$ROOTFS" "$MIRROR" >&2

# Later apt installs (the builder stage's python3-venv) leave documentation out too.
cat > "$ROOTFS/etc/dpkg/dpkg.cfg.d/jobfair-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CFG
cat > "$ROOTFS/etc/apt/sources.list" <<LIST
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
LIST
chroot "$ROOTFS" sh -c 'apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq >/dev/null && apt-get clean' >&2
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/log/*.log \
    "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* "$ROOTFS"/usr/share/locale/*
find "$ROOTFS/usr/share/doc" ! -type d ! -name copyright -delete
# The container engine mounts its own /dev, /proc and /sys, and writes the DNS and host
# files that debootstrap copied from this machine.
rm -rf "${ROOTFS:?}"/dev/* "${ROOTFS:?}"/proc/* "${ROOTFS:?}"/sys/*
: > "$ROOTFS/etc/resolv.conf"
echo localhost > "$ROOTFS/etc/hostname"

tar --numeric-owner -C "$ROOTFS" -c . |
    $PODMAN import \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        --message "debootstrap --variant=minbase $SUITE from $MIRROR, upgraded $(date -u +%F)" \
        - "$TAG" >&2
echo "$TAG"
