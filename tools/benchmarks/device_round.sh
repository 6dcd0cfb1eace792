#!/usr/bin/env bash
# One round of GPU measurements on a lent device machine, as one prepared command (the
# device is lent for minutes: every step here is one the memory page still waits for).
#
#   bash tools/benchmarks/device_round.sh [STEP...]      (run from the repository root)
#   bash tools/benchmarks/device_round.sh --parallel [STEP...]   (every model at once, then
#                                                         STEPs, dumps by default)
#
# Steps, in this order by default (each writes what it measured under $OUT, so that a
# round cut off by the machine's time limit still hands back what it finished):
#   gpt       `xla --models gpt --merge`: its rows predate round_read_back (split forward
#             temp 1,451,328 B vs JAX's 1,058,784 B under none/all/except)
#   mlp-scan  the offload rows with the copy back to the device after its barrier (expected:
#             off_dots backward temp 4,460,864 B -> JAX's 4,199,232 B); ~45 s on an H200
#   dumps     `xla_dump` of the programs whose estimate the page still misses
#   equinox, convnet, mlp, gpt-scan    `xla --models KEY --merge` (their offload rows)
#   (on an H200, 2026-11-27: mlp + equinox ~4 min, dumps ~1 min, convnet + gpt-scan
#   ~2.5 min; gpt more than 4.5 min)
# $OUT gets three files: xla_gpu.json (tools/benchmarks/results/, copied after each step),
# dumps.txt (what xla_dump printed) and dumps.tgz (the scheduled HLO and buffer
# assignments it read); `python -m tools.benchmarks render` on the host remakes the page.
#
# The machine has jax with CUDA but may lack igraph: wheels downloaded on the host into
# .whl (see docs/benchmarks.md) are installed first when that folder is there.
set -u
export OUT="${OUT:-/tmp/device_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && SITE="/tmp/site:"
fi
export PYTHONPATH="${SITE:-}$PWD"
RESULTS=tools/benchmarks/results/xla_gpu.json
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(gpt mlp-scan dumps equinox convnet mlp gpt-scan)

if [ "${steps[0]}" = "--parallel" ]; then
  # Every model at once, each in its own copy of the tree and its own process (the
  # measurement is mostly XLA compiles on the host's cores; the GPU is shared, nothing
  # preallocated; on an H200, 2026-11-27: all six in under 6 minutes, GPT last). Each
  # writes its log to $OUT/xla.KEY.log; $OUT/xla_gpu_parts.tgz holds their results
  # (par_KEY/tools/benchmarks/results/xla_gpu.json), which `xla_memory.merge` folds into
  # results/xla_gpu.json on the host. The dumps run beside them. Run so, each program
  # without host offload that an earlier serial round measured on the same GPU came out
  # the same to the byte; those with host offload vary from one process to the next,
  # serially too (the page says by how much).
  export XLA_PYTHON_CLIENT_PREALLOCATE=false BENCH_COMMIT="$(git rev-parse --short HEAD)"
  models=(gpt mlp-scan equinox convnet mlp gpt-scan)
  for m in "${models[@]}"; do
    ( dir="/tmp/par_$m"; rm -rf "$dir"; mkdir -p "$dir"
      tar --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C "$dir"
      cd "$dir" && PYTHONPATH="${SITE:-}$dir" \
        python3 -m tools.benchmarks xla --models "$m" > "$OUT/xla.$m.log" 2>&1 \
        ; echo "== $m exit $? ($(date +%T))" ) &
  done
  steps=("${steps[@]:1}")
  [ ${#steps[@]} -eq 0 ] && steps=(dumps)
  for step in "${steps[@]}"; do bash "$0" "$step"; done
  wait
  # (the machine hands back a few files: the results go back as one archive)
  (cd /tmp && tar -czf "$OUT/xla_gpu_parts.tgz" par_*/"$RESULTS")
  echo "== done ($(date +%T))"
  exit 0
fi

save() { cp "$RESULTS" "$OUT/xla_gpu.json" 2>/dev/null; }

for step in "${steps[@]}"; do
  echo "== $step ($(date +%T))"
  case "$step" in
    dumps)   # (the machine hands back a few files: all dumps go into one archive)
      : > "$OUT/dumps.txt"
      mkdir -p /tmp/dumps
      for program in "mlp-scan off_dots" "equinox only" "convnet none" "gpt off_dots" \
                     "equinox off_names"; do
        set -- $program
        dir="/tmp/dumps/$1_${2//=/_}"
        rm -rf "$dir"
        echo "=== $program" >> "$OUT/dumps.txt"
        python3 -m tools.benchmarks.xla_dump "$1" "$2" "$dir" 2>&1 | grep -v "^[IW][0-9]" \
          >> "$OUT/dumps.txt"
      done
      (cd /tmp/dumps && find . \( -path "*/ours/*" -o -path "*/jax/*" \) \
         \( -name "*after_optimizations.txt" -o -name "*buffer-assignment.txt" \
            -o -name "*memory-usage-report.txt" \) -print0 \
         | tar -czf "$OUT/dumps.tgz" --null -T -) ;;
    mlp|equinox|convnet|gpt|mlp-scan|gpt-scan)
      python3 -m tools.benchmarks xla --models "$step" --merge && save ;;
    *)
      echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "== done ($(date +%T))"
