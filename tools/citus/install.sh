#!/bin/sh
# Citus for Debian's PostgreSQL 15, for `make citus`.
#
# Citus is not in Debian's archive nor on PyPI. With internet, install its packages
# (https://docs.citusdata.com: postgresql-15-citus-13.2 from packagecloud) and this script
# finds it installed. Without, give it a Citus source tree: CITUS_SRC=/path/to/citus
# (e.g. `git archive v13.2.2` of github.com/citusdata/citus). It is copied to
# build/citus-src (the cache: a second run builds nothing), patched, built against
# PostgreSQL 15's headers and installed into PostgreSQL 15's lib and extension folders.
set -eu
PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
LIBDIR=$($PG_CONFIG --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
if [ -f "$LIBDIR/citus.so" ]; then
    echo "citus: installed ($LIBDIR/citus.so)"
    exit 0
fi
if [ -z "${CITUS_SRC:-}" ]; then
    echo "citus: not installed, and no source tree given." >&2
    echo "  With internet: install postgresql-15-citus-13.2 from Citus's package repository." >&2
    echo "  Without: make citus CITUS_SRC=/path/to/a/citus/source/tree (tag v13.2.2)." >&2
    exit 2
fi
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql-15 \
    postgresql-server-dev-15 libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev \
    libselinux1-dev libxslt1-dev libpam0g-dev libssl-dev >/dev/null
CACHE=build/citus-src
if [ ! -f "$CACHE/.built" ]; then
    rm -rf "$CACHE" && mkdir -p "$CACHE"
    cp -a "$CITUS_SRC"/. "$CACHE"/
    # Debian's PostgreSQL 15.20 headers declare have_createdb_privilege(), which Citus
    # 13.2.2 also defines for PostgreSQL < 16 as a static inline: drop Citus's copy.
    python3 - "$CACHE/src/include/pg_version_compat.h" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
start = text.find("static inline bool\nhave_createdb_privilege(void)")
if start >= 0 and "have_createdb_privilege" in open(
    "/usr/include/postgresql/15/server/commands/dbcommands.h"
).read():
    end = text.index("typedef bool TU_UpdateIndexes;", start)
    open(path, "w").write(text[:start] + text[end:])
PY
    (cd "$CACHE" && ./configure PG_CONFIG=$PG_CONFIG >/dev/null && make -j2 >/dev/null)
    touch "$CACHE/.built"
fi
(cd "$CACHE" && $SUDO make install >/dev/null)
echo "citus: built from $CITUS_SRC and installed ($LIBDIR/citus.so)"
