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
#   gpt, mlp-scan, equinox, convnet, mlp, gpt-scan    `xla --models KEY --merge`
#   dumps     `xla_dump` of the programs whose estimate the page misses most (joint
#             forms with `--joint`)
#   barriers  the barriers benchmark from scratch ($OUT/barriers_gpu.json; copy it to
#             results/ on the host; stops after BARRIERS_LIMIT seconds, default 540, with
#             the rows it measured and "complete": false)
#   barriers-chains   the same with fence-chains forced on ($OUT/barriers_gpu_chains_on.json)
#   compile-threads   rp.jit's build with its compiles side by side (16 threads) against one
#             at a time, and whether it chose the same ($OUT/compile_threads.json; about
#             24 builds of the training benchmark's step; the GPU default waits on it)
#   train     the training benchmark (rp.jit, jax.grad(rp.jit(loss)) and jax.checkpoint
#             beside jax.jit: step time and XLA's memory) on the GPU ($OUT/train_gpu.json;
#             the page's train.json is the CPU's: keep it apart on the host)
#   (not by default. Run these through this script, or with JAX_PLATFORMS=cuda: `python -m
#   tools.benchmarks` runs on the CPU unless told otherwise, and 2026-11-30 a bare barriers
#   run on the device measured XLA:CPU)
#   (one after another on an H200, 2026-11-27: about 13 minutes in all, GPT alone more than
#   4.5; with --parallel all of it took 341 s: use that where the lend is 15 minutes.
#   2026-12-04, with MONOTONE=larger PEAK=1 RUN_LIMIT=465 and step none: 436 s, then the
#   train step 280 s, of a 15-minute lend)
# $OUT gets xla_gpu.json (tools/benchmarks/results/, copied after each step; with
# --parallel instead xla_gpu_parts.tgz and xla_logs.tgz, a log per model), dumps.txt
# (what xla_dump printed) and dumps.tgz (the scheduled HLO and buffer assignments it read).
# Name the commit measured: BENCH_COMMIT=<the host's HEAD> bash tools/benchmarks/...
# With --parallel and MONOTONE=larger (or smaller), each model also runs
# `xla --monotone RULE --models KEY` on the stored results, in a copy of its own beside the
# rest; $OUT/xla_gpu_monotone.tgz holds those results. PEAK=1 likewise runs
# `xla --peak --models KEY` ($OUT/xla_gpu_peak.tgz); ROWS=0 leaves out the plain runs (a
# round of the extra runs alone). Step `none` runs nothing (no dumps).
#
# The machine has jax with CUDA but may lack igraph: wheels downloaded on the host into
# .whl are installed first when that folder is there (carry it; it is not tracked):
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl igraph==1.0.0 texttable
# Back on the host, after --parallel:
#   python -m tools.benchmarks xla --merge-from FILES_AT/xla_gpu_parts.tgz
#   python -m tools.benchmarks xla --merge-monotone-from FILES_AT/xla_gpu_monotone.tgz
#   python -m tools.benchmarks xla --merge-peak-from FILES_AT/xla_gpu_peak.tgz
#   python -m tools.benchmarks render
set -u
export OUT="${OUT:-/tmp/device_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && SITE="/tmp/site:"
fi
export PYTHONPATH="${SITE:-}$PWD"
RESULTS="${RESULTS:-tools/benchmarks/results/xla_gpu.json}"   # (on CPU, to try it: xla.json)
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(gpt mlp-scan equinox convnet mlp gpt-scan dumps)

if [ "${steps[0]}" = "--parallel" ]; then
  # Every model at once, each in its own copy of the tree and its own process (the
  # measurement is mostly XLA compiles on the host's cores; the GPU is shared, nothing
  # preallocated; on an H200, 2026-11-27: all six in under 6 minutes, GPT last). Each
  # writes its log to /tmp/par_logs/xla.KEY.log (in $OUT/xla_logs.tgz);
  # $OUT/xla_gpu_parts.tgz holds their results
  # (par_KEY/tools/benchmarks/results/xla_gpu.json), which `xla_memory.merge` folds into
  # results/xla_gpu.json on the host. The dumps run beside them. Run so, each program
  # without host offload that an earlier serial round measured on the same GPU came out
  # the same to the byte; those with host offload vary from one process to the next,
  # serially too (the page says by how much).
  # (the device copy's .git can be older than the tree it measures: 2026-11-28 it named the
  # session's first commit; give BENCH_COMMIT=<the host's HEAD> on the command line)
  export XLA_PYTHON_CLIENT_PREALLOCATE=false \
    BENCH_COMMIT="${BENCH_COMMIT:-$(git rev-parse --short HEAD)}"
  rm -rf /tmp/par_logs; mkdir -p /tmp/par_logs
  models=(${PARALLEL_MODELS:-gpt mlp-scan equinox convnet mlp gpt-scan})
  # a run per model beside the rest: NAME (its copy /tmp/NAME_KEY, its log, its archive
  # $OUT/xla_gpu_NAME.tgz) and the xla flags it adds; ROWS=0 leaves out the plain runs
  runs=()
  [ "${ROWS:-1}" != 0 ] && runs+=("par:")
  [ -n "${MONOTONE:-}" ] && runs+=("mono:--monotone $MONOTONE")  # (on the stored results)
  [ -n "${PEAK:-}" ] && runs+=("peak:--peak")
  for run in "${runs[@]}"; do
    name="${run%%:*}"; flags="${run#*:}"
    for m in "${models[@]}"; do
      ( dir="/tmp/${name}_$m"; rm -rf "$dir"; mkdir -p "$dir"
        tar --exclude=./.git --exclude=./.whl -cf - . | tar -xf - -C "$dir"
        # (a plain run hands back only what it measures: no stored rows)
        [ "$name" = par ] && rm -f "$dir/$RESULTS"
        # (the extra runs yield the cores to the plain ones; RUN_LIMIT=S stops each run
        # after S seconds, so that the archives below are made before the call's limit)
        prio=0; [ "$name" != par ] && prio=10
        cd "$dir" && PYTHONPATH="${SITE:-}$dir" nice -n $prio \
          timeout -k 5 "${RUN_LIMIT:-0}" python3 -m tools.benchmarks xla $flags \
          --models "$m" > "/tmp/par_logs/$name.$m.log" 2>&1 \
          ; echo "== $name $m exit $? ($(date +%T))" ) &
    done
  done
  steps=("${steps[@]:1}")
  [ ${#steps[@]} -eq 0 ] && steps=(dumps)
  for step in "${steps[@]}"; do bash "$0" "$step"; done
  wait
  # (the machine hands back a few files: the results go back as one archive per run)
  for run in "${runs[@]}"; do
    name="${run%%:*}"
    archive="$(case $name in par) echo parts;; mono) echo monotone;; *) echo $name;; esac)"
    (cd /tmp && tar -czf "$OUT/xla_gpu_$archive.tgz" $(ls ${name}_*/"$RESULTS" 2>/dev/null))
  done
  # (at most 8 files come back: 2026-11-28 the six logs beside the dumps crowded out the
  # results; the logs go back as one archive, their last lines here)
  (cd /tmp/par_logs && tar -czf "$OUT/xla_logs.tgz" *.log && tail -n 2 *.log)
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
      # (first the split forwards whose temp is above JAX's on an H200 since our halves run
      # as rp.jit runs them, 2026-12-04: XLA:GPU keeps in scratch what JAX's forward holds
      # as outputs, 2 MiB of the scanned MLP's stacked weights, 256 KiB in the MLP; and
      # Equinox's joint form under save_from_both_policies, 2,910,080 B at 2110709 and
      # 3,630,976 B at 933aac5 (JAX 3,368,820 B; its products now folded with their
      # transposes, fold-dot-transposes); then
      # the joint forms: objective=peak's lowest budgets, where the GPU's estimate missed
      # most on an H200, 2026-11-28: the GPT and Equinox recomputing everything, the conv
      # net keeping everything)
      for program in "mlp-scan off_dots" "mlp nothing" "equinox both --joint" \
                     "gpt auto=0 --joint" \
                     "equinox auto=0 --joint" "convnet all --joint" "equinox only" \
                     "gpt off_dots"; do
        set -- $program
        dir="/tmp/dumps/$1_${2//=/_}${3:+_joint}"
        rm -rf "$dir"
        echo "=== $program" >> "$OUT/dumps.txt"
        python3 -m tools.benchmarks.xla_dump "$1" "$2" "$dir" ${3:-} 2>&1 \
          | grep -v "^[IW][0-9]" >> "$OUT/dumps.txt"
      done
      (cd /tmp/dumps && find . \( -path "*/ours/*" -o -path "*/jax/*" \) \
         \( -name "*after_optimizations.txt" -o -name "*buffer-assignment.txt" \
            -o -name "*memory-usage-report.txt" \) -print0 \
         | tar -czf "$OUT/dumps.tgz" --null -T -) ;;
    barriers|barriers-chains)   # (into $OUT, from scratch: results/'s rows would count as done)
      [ "$step" = barriers ] && { file="$OUT/barriers_gpu.json"; flags=(); } \
        || { file="$OUT/barriers_gpu_chains_on.json"; flags=(--fence-chains on); }
      python3 -m tools.benchmarks barriers --out "$file" "${flags[@]}" \
        --time-limit "${BARRIERS_LIMIT:-540}" 2>&1 | grep -v "^[IW][0-9]" | tail -n 5 ;;
    compile-threads)
      python3 -m tools.benchmarks.compile_threads --threads "${COMPILE_THREADS:-16}" \
        --rounds 3 --out "$OUT/compile_threads.json" 2>&1 | grep -v "^[IW][0-9]" | tail -n 12 ;;
    train)
      python3 -m tools.benchmarks train 2>&1 | grep -v "^[IW][0-9]" | tail -n 40
      cp tools/benchmarks/results/train.json "$OUT/train_gpu.json" ;;
    mlp|equinox|convnet|gpt|mlp-scan|gpt-scan)
      python3 -m tools.benchmarks xla --models "$step" --merge && save ;;
    none) ;;
    *)
      echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "== done ($(date +%T))"
