/* random_model.c - writes a llama2.c checkpoint with seeded random weights,
 * for tests and benchmarks: random_model OUT.bin [dim hidden layers heads
 * kv_heads vocab seq_len seed std] (negative vocab: unshared classifier). */
#include "../nectar.h"
#include "../src/cli.h"
#include "../src/formats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char USAGE[] = "usage: random_model OUT.bin [dim hidden layers heads kv_heads vocab seq_len seed std]\n";

int main(int argc, char **argv) {
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { fputs(USAGE, stdout); return 0; }
    if (argc != 2 && argc != 11) { fputs(USAGE, stderr); return 1; }
    long v[9] = {64, 160, 3, 8, 2, 300, 256, 1, 0};
    for (int i = 0; i < 9 && argc == 11; i++) v[i] = strtol(argv[i + 2], NULL, 10);
    float std = argc == 11 ? strtof(argv[10], NULL) : 0.15f;
    Config c = {(int)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)labs(v[5]), (int)v[6], LLAMA2C_ROPE_THETA,
                LLAMA2C_NORM_EPS};
    Model m;
    if (model_init_random(&m, c, v[5] > 0, (uint64_t)v[7], std) != 0) return 1;
    if (model_save(&m, argv[1]) != 0) return 1;
    fprintf(stderr, "wrote %s: %zu parameters\n", argv[1], m.n_params);
    model_free(&m);
    return 0;
}
