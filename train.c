/* train.c - compile a document into Nectar modules.
 *
 *   ./train -m model.bin -z tokenizer.bin -d doc.txt -o doc.nectar --arch mlp --rho 0.1
 *
 * The options a user compiling a document needs; the run itself, its steps
 * from the model to the module file, is src/train_run.c, which `./study fit`
 * runs too with the fitting knobs and the instruments of finished studies.
 */
#include "src/train_run.h"

#include <stdio.h>

static void usage(FILE *f) {
    fprintf(f,
        "usage: train -m MODEL (-d DOC.txt | -D DOC.ids) -o OUT.nectar [options]\n"
        "  -m MODEL          a GGUF file (Llama architecture; its tokenizer too) or a llama2.c checkpoint\n"
        "  -z TOKENIZER      tokenizer.bin, for text input with a llama2.c checkpoint\n"
        "  -d DOC.txt        document text (BOS first where the tokenizer adds one)\n"
        "  -D DOC.ids        document token ids\n"
        "  -o OUT.nectar     module file to write\n"
        "  --chat            the model's chat template: the document goes into the user's turn, each\n"
        "                    text prompt ends the turn, self-study writes chat tasks (infer --chat\n"
        "                    uses the modules); the default for a model with a ChatML template and a\n"
        "                    text document. A chat run has a real model's defaults (its recipe):\n"
        "                    quadrature, 2000 regression steps, then 400 KL steps, on a smaller\n"
        "                    self-study (each option below says where it differs). A model read as\n"
        "                    plain text has the plain recipe's defaults: MLP, 6000 pure-KL steps; if\n"
        "                    it is large (10M parameters or more), the large plain recipe's: 2000\n"
        "                    regression steps then 400 KL steps on 200 spans and no tasks\n"
        "  --later-document  the document as a later one of a composition (infer with several\n"
        "                    documents): it continues the documents before it, so its text gets no\n"
        "                    BOS and, with --chat, no turn opening; infer puts the modules only after\n"
        "                    another document, and one fitted without it only first\n"
        "  --arch mlp|quad   module architecture (default mlp; quad with --chat)\n"
        "  --rho R           budget: params / (2 n d) per module (default 0.1)\n"
        "  --loss PRESET     kl (default: pure KL) | regression (the default with --chat or a large\n"
        "                    model) | mixed (regression + 1 KL); the regression terms are divided by\n"
        "                    their targets' variance\n"
        "  --steps N         optimisation steps (default 6000; 2000 with --chat or a large model; 0,\n"
        "                    with no --kl-steps stage, evaluates the initial modules)\n"
        "  --lr LR           peak learning rate of the --steps (default 3e-2)\n"
        "  --kl-steps N      then N pure-KL steps going on from the fitted modules, with fresh AdamW\n"
        "                    moments and their own warmup and decay: a regression fit, then KL, in\n"
        "                    one run (default 0; 400 with --chat or a large model, and the\n"
        "                    regression loss)\n"
        "  --n-prompts N     self-study spans and continuations of the document (default 50; 96 for\n"
        "                    a chat, 200 for a large model read as plain text)\n"
        "  --tasks N         self-study task prompts (needs a tokenizer): the full-cache model writes\n"
        "                    tasks about the document and answers them: quote, continue and question\n"
        "                    tasks, a third each, from 8 N tries; with --chat, questions it writes\n"
        "                    and quote and summary requests, from 4 N (default 300; 64 with --chat, 0\n"
        "                    for a large model without)\n"
        "  --eval-tasks N    evaluation-only tasks (default 100; 0 with --chat or a large model): made\n"
        "                    as the self-study tasks but from another seed, none asking what a\n"
        "                    self-study prompt asks, answered by the full cache and never trained on;\n"
        "                    kept in the module file, measured as their own split (\"tasks\")\n"
        "  --prompts FILE    extra prompts, one per line (text, needs a tokenizer; \\n is a newline)\n"
        "  --qa FILE         then the multiple-choice questions of FILE (as infer --qa): accuracy of\n"
        "                    the full cache, the fitted modules and no document, and agreement with the\n"
        "                    full cache's choice, in the tables and in the JSON (\"qa\")\n"
        "  --checkpoint P    write a checkpoint to P every quarter of the steps\n"
        "  --resume P        continue from checkpoint P (same data and options)\n"
        "  --init FILE       start from the modules of FILE, fitted to this model and document with the\n"
        "                    same architecture, budget and held-out prompts; a new optimiser and\n"
        "                    schedule\n"
        "  -s SEED           seed of prompts, split, init and batches (default 1234)\n"
        "  --json            one JSON object on stdout instead of tables\n"
        "  --gpu             fit on the GPU (builds with nvcc)\n"
        "  --help            this text\n"
        "The fitting knobs (batch, loss weights, the KL stage's rate, MLP depths, ...) and the\n"
        "instruments of finished studies are ./study fit's options: ./study fit --help.\n");
}

int main(int argc, char **argv) {
    TrainOptions o;
    if (train_options_parse(argc, argv, &o, usage, 0) != 0) return 1;
    return train_run(&o) != 0;
}
