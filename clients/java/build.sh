#!/bin/sh
# Compile the client and its JUnit 5 tests and run them (Maven cannot reach its registry
# here; JUnit comes from Debian's junit5 package). JOBFAIR_URL must name a live Jobfair:
# `make test` at the top of the repository starts one (tests/acceptance/test_client_suites.py).
#   ./build.sh            compile only
#   ./build.sh test       compile and run the tests
#   ./build.sh test --select-class dev.jobfair.client.AuthTest    ... only these (JUnit's options)
# JOBFAIR_JAVA_BUILD names the output folder (default build/, emptied first): builds that
# run at once (make test's two worker processes) each need their own.
#
# OpenTelemetry (the client's optional tracing, docs/tracing.md) is compiled in where its
# jars are: OTEL_CLASSPATH (the API) and OTEL_SDK_CLASSPATH (the SDK, for the tests), by
# default version OTEL_VERSION of the local Maven repository's. Without them the tracing
# bridge and its test are left out, and the build says so.
set -eu
cd "$(dirname "$0")"
JUNIT=${JUNIT_JAR:-/usr/share/java/junit-platform-console-standalone.jar}
BUILD=${JOBFAIR_JAVA_BUILD:-build}
M2=${MAVEN_REPOSITORY:-$HOME/.m2/repository}/io/opentelemetry
V=${OTEL_VERSION:-1.66.0}
jars() {
    for a in "$@"; do printf '%s:' "$M2/$a/$V/$a-$V.jar"; done
}
present() {
    IFS=:; for j in $1; do [ -f "$j" ] || { unset IFS; return 1; }; done; unset IFS
}
OTEL_CLASSPATH=${OTEL_CLASSPATH:-$(jars opentelemetry-api opentelemetry-context opentelemetry-common)}
OTEL_SDK_CLASSPATH=${OTEL_SDK_CLASSPATH:-$(jars opentelemetry-sdk opentelemetry-sdk-trace opentelemetry-sdk-common opentelemetry-sdk-metrics opentelemetry-sdk-logs)}
if present "$OTEL_CLASSPATH"; then
    echo "OpenTelemetry: tracing compiled in ($OTEL_CLASSPATH)"
    LEAVE_OUT=none
else
    echo "OpenTelemetry: not found ($OTEL_CLASSPATH): tracing left out"
    OTEL_CLASSPATH= LEAVE_OUT='OpenTelemetry*'
fi
rm -rf "$BUILD"
javac -Xlint:all,-serial -Werror --release 17 -cp "$OTEL_CLASSPATH" -d "$BUILD/main" \
    $(find src/main -name '*.java' ! -name "$LEAVE_OUT")
jar --create --file "$BUILD/jobfair-client.jar" -C "$BUILD/main" .
if [ "${1:-}" = test ]; then
    if [ -n "$OTEL_CLASSPATH" ] && present "$OTEL_SDK_CLASSPATH"; then
        echo "OpenTelemetry SDK: its test runs"
        CP="$BUILD/main:$OTEL_CLASSPATH$OTEL_SDK_CLASSPATH"
    else
        echo "OpenTelemetry SDK: not found ($OTEL_SDK_CLASSPATH): its test left out"
        CP="$BUILD/main" LEAVE_OUT='OpenTelemetry*'
    fi
    javac -Xlint:all,-serial --release 17 -cp "$CP:$JUNIT" -d "$BUILD/test" \
        $(find src/test -name '*.java' ! -name "$LEAVE_OUT")
    shift
    [ $# -gt 0 ] || set -- --scan-class-path
    exec java -jar "$JUNIT" --class-path "$CP:$BUILD/test" "$@" --disable-banner --details=tree
fi
