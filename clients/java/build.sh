#!/bin/sh
# Compile the client and its JUnit 5 tests and run them (Maven cannot reach its registry
# here; JUnit comes from Debian's junit5 package). JOBFAIR_URL must name a live Jobfair:
# `make test` at the top of the repository starts one (tests/acceptance/test_client_java.py).
#   ./build.sh            compile only
#   ./build.sh test       compile and run the tests
#   ./build.sh test --select-class dev.jobfair.client.AuthTest    ... only these (JUnit's options)
set -eu
cd "$(dirname "$0")"
JUNIT=${JUNIT_JAR:-/usr/share/java/junit-platform-console-standalone.jar}
rm -rf build
javac -Xlint:all,-serial -Werror --release 17 -d build/main $(find src/main -name '*.java')
jar --create --file build/jobfair-client.jar -C build/main .
if [ "${1:-}" = test ]; then
    javac -Xlint:all,-serial --release 17 -cp "build/main:$JUNIT" -d build/test $(find src/test -name '*.java')
    shift
    [ $# -gt 0 ] || set -- --scan-class-path
    exec java -jar "$JUNIT" --class-path build/main:build/test "$@" --disable-banner --details=tree
fi
