# Shared by the test scripts: sanitizer settings, and writing binary fields.
# Leaks are checked on runs that succeed; a run that stops on an error exits
# at once without freeing, so only memory errors and UB are checked there
# (detect_leaks=0 per call).
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:exitcode=99:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1

# ints V...: int32 little-endian values as raw bytes on stdout
ints() { for v in "$@"; do printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $((v >> 8 & 255)) $((v >> 16 & 255)) $((v >> 24 & 255)))"; done; }
# poke FILE OFFSET V...: overwrite int32 fields of FILE from byte OFFSET on
poke() { local f=$1 at=$2; shift 2; ints "$@" | dd of="$f" bs=1 seek="$at" conv=notrunc status=none; }
