#!/bin/sh
# Compile the client and its JUnit 5 tests and run them (Maven cannot reach its registry
# here; JUnit comes from Debian's junit5 package). JOBFAIR_URL must name a live Jobfair:
# `make test` at the top of the repository starts one (tests/acceptance/test_client_java.py).
#   ./build.sh            compile only
#   ./build.sh test       compile and run the tests
#   ./build.sh test --select-class dev.jobfair.client.AuthTest    ... only these (JUnit's options)
# JOBFAIR_JAVA_BUILD names the output folder (default build/, emptied first): builds that
# run at once (make test's two worker processes) each need their own.
set -eu
cd "$(dirname "$0")"
JUNIT=${JUNIT_JAR:-/usr/share/java/junit-platform-console-standalone.jar}
BUILD=${JOBFAIR_JAVA_BUILD:-build}
rm -rf "$BUILD"
javac -Xlint:all,-serial -Werror --release 17 -d "$BUILD/main" $(find src/main -name '*.java')
jar --create --file "$BUILD/jobfair-client.jar" -C "$BUILD/main" .
if [ "${1:-}" = test ]; then
    javac -Xlint:all,-serial --release 17 -cp "$BUILD/main:$JUNIT" -d "$BUILD/test" $(find src/test -name '*.java')
    shift
    [ $# -gt 0 ] || set -- --scan-class-path
    exec java -jar "$JUNIT" --class-path "$BUILD/main:$BUILD/test" "$@" --disable-banner --details=tree
fi
