# Shared by the test scripts: sanitizer settings. Leaks are checked on runs
# that succeed; a run that stops on an error exits at once without freeing,
# so only memory errors and UB are checked there (detect_leaks=0 per call).
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:exitcode=99:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1
