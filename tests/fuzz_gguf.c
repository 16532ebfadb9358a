/* fuzz_gguf.c - a libFuzzer harness for the GGUF reader: each input is
 * opened as a GGUF file and, when it is read, walked by walk_gguf (every
 * getter on every key, every dequantization, the Llama checks). Neither may
 * crash, read out of bounds or break an invariant. Not part of `make test`
 * (it needs clang's libFuzzer):
 *
 *   clang -g -O1 -std=c11 -fsanitize=fuzzer,address,undefined -o tests/fuzz_gguf tests/fuzz_gguf.c src/gguf.c -lm
 *   mkdir -p tests/tmp_fuzz && cp tests/data/gguf_*.gguf tests/tmp_fuzz/
 *   tests/fuzz_gguf -max_total_time=300 -max_len=200000 tests/tmp_fuzz
 */
#include <stdio.h>
#include <stdlib.h>

#include "../src/gguf.h"
#include "gguf_walk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *quiet;                       /* the reader's sentences, discarded */
    if (!quiet && !(quiet = fopen("/dev/null", "w"))) abort();
    gguf_set_error_stream(quiet);
    GgufFile f;
    if (gguf_open_memory(&f, data, size, "input.gguf") == 0) {
        if (walk_gguf(&f) != 0) abort();      /* a broken invariant: a finding */
        gguf_close(&f);
    }
    return 0;
}
