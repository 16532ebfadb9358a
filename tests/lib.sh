# Shared by the test scripts: sanitizer settings, and writing binary fields.
# Leaks are checked on every run, those that stop on an error too: the
# programs free what they allocated on their error paths.
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:exitcode=99:detect_leaks=1
export UBSAN_OPTIONS=halt_on_error=1:exitcode=98:print_stacktrace=1

# ints V...: int32 little-endian values as raw bytes on stdout
ints() { for v in "$@"; do printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((v & 255)) $((v >> 8 & 255)) $((v >> 16 & 255)) $((v >> 24 & 255)))"; done; }
# poke FILE OFFSET V...: overwrite int32 fields of FILE from byte OFFSET on
poke() { local f=$1 at=$2; shift 2; ints "$@" | dd of="$f" bs=1 seek="$at" conv=notrunc status=none; }
# reseal FILE.nectar: write a module file's checksum again (the 64-bit FNV-1a
# of every byte before its last 8), so that a poked field reaches the checks
# behind the checksum
reseal() {
    python3 - "$1" <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
h = 1469598103934665603
for byte in data[:-8]:
    h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
data[-8:] = struct.pack("<Q", h)
open(sys.argv[1], "wb").write(data)
PY
}
