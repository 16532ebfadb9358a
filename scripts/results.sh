#!/usr/bin/env bash
# The README's results tables, from one command: fits Nectar modules to the
# default document for the default model (data/) and prints markdown.
#   scripts/results.sh capacity   MLP and quadrature at rho 2%, 5%, 10%
#   scripts/results.sh losses     regression, mixed and pure KL at rho 2%, 10%
set -eu
cd "$(dirname "$0")/.."
what=${1:-capacity}
make -s train
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# value of "key" inside the "split" object of a one-line JSON file
json() { sed -E "s/.*\"$2\": \{([^}]*)\}.*/\1/; s/.*\"$3\": ([-0-9.e+]+).*/\1/" "$1"; }
fit() {  # fit NAME ARGS...: train with the default data, JSON into $tmp/NAME.json
    local name=$1; shift
    echo "fitting $name ..." >&2
    ./train -m data/model.bin -z data/tokenizer.bin -d data/doc.txt --prompts data/prompts.txt \
        -o "$tmp/$name.nectar" --json "$@" > "$tmp/$name.json" 2> "$tmp/$name.log" || { cat "$tmp/$name.log" >&2; exit 1; }
}
row() {  # row LABEL NAME SPLIT
    local f="$tmp/$2.json" s=$3
    printf '| %s | %s | %s | %.4f | %.4f | %.2f | %.3f / %.3f | %.3f / %.3f | %.3g | %.3g | %.3g |\n' \
        "$1" "$s" "$(sed -E 's/.*"params": ([0-9]+).*/\1/' "$f")" \
        "$(json "$f" $s acc_full)" "$(json "$f" $s acc_nectar)" "$(json "$f" $s gap_pp)" \
        "$(json "$f" $s agree)" "$(json "$f" $s agree_nodoc)" "$(json "$f" $s kl)" "$(json "$f" $s kl_nodoc)" \
        "$(json "$f" $s score_mse)" "$(json "$f" $s target_mse)" "$(json "$f" $s rte)"
}
header() {
    echo "| $1 | split | params | acc full | acc Nectar | gap (pp) | agree Nectar / no doc | KL Nectar / no doc | score MSE | target MSE | RTE |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
}
case $what in
capacity)
    for arch in mlp quad; do for rho in 0.02 0.05 0.1; do fit "$arch-$rho" --arch $arch --rho $rho; done; done
    header "module, rho"
    for split in random challenge; do
        for arch in mlp quad; do for rho in 0.02 0.05 0.1; do row "$arch $rho" "$arch-$rho" $split; done; done
    done ;;
losses)
    for loss in regression mixed kl; do for rho in 0.02 0.1; do fit "$loss-$rho" --arch mlp --rho $rho --loss $loss; done; done
    header "MLP loss, rho"
    for split in random challenge; do
        for loss in regression mixed kl; do for rho in 0.02 0.1; do row "$loss $rho" "$loss-$rho" $split; done; done
    done ;;
*) echo "usage: scripts/results.sh capacity|losses" >&2; exit 1 ;;
esac
n=$(sed -E 's/.*"random": \{"n_prompts": ([0-9]+), "n_positions": ([0-9]+).*/\1 prompts, \2 positions/' "$tmp"/*-0.1.json | head -n 1)
c=$(sed -E 's/.*"challenge": \{"n_prompts": ([0-9]+), "n_positions": ([0-9]+).*/\1 prompts, \2 positions/' "$tmp"/*-0.1.json | head -n 1)
echo
echo "Held-out: random split $n; challenge split $c."
