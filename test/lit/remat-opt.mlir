// The remat-opt driver: input, output, splitting, pipelines, IR dumps,
// bytecode, the pass list and the residual report. Without --split-input-file
// the whole file is one module holding @main (a joint VJP function) and
// @pipeline (plain code for the core passes).

// Parse and print, from a file, from stdin given as '-', and from stdin by
// default; one module, the '// -----' line is just a comment.
// RUN: remat-opt %s | filecheck %s --check-prefix=ROUND
// RUN: remat-opt - < %s | filecheck %s --check-prefix=ROUND
// RUN: remat-opt < %s | filecheck %s --check-prefix=ROUND

// -o writes the file and nothing goes to stdout.
// RUN: rm -f %t
// RUN: remat-opt %s --strip-checkpoint-names -o %t | filecheck %s --allow-empty --check-prefix=NOSTDOUT
// RUN: filecheck %s --check-prefix=STRIP --input-file=%t

// --split-input-file: each part is its own module; outputs joined by '// -----'.
// RUN: remat-opt %s --split-input-file --strip-checkpoint-names | filecheck %s --check-prefix=SPLIT

// A textual pipeline.
// RUN: remat-opt %s --pass-pipeline='builtin.module(inline,strip-checkpoint-names,canonicalize)' | filecheck %s --check-prefix=PIPE

// Per-pass flags run in command-line order: stripping the names after
// partial-eval keeps the value named 'a' saved (and drops the remat.*
// bookkeeping); stripping them first leaves save_only_these_names(a) nothing
// to save, so the sine is recomputed.
// RUN: remat-opt %s --remat-partial-eval='policy=save_only_these_names(a)' --strip-checkpoint-names | filecheck %s --check-prefix=NAMESFIRST
// RUN: remat-opt %s --strip-checkpoint-names --remat-partial-eval='policy=save_only_these_names(a)' | filecheck %s --check-prefix=STRIPFIRST

// IR dumps go to stderr with MLIR's headers, one per pass, in order; the
// output file gets the final module only.
// RUN: remat-opt %s --canonicalize --remat-partial-eval='policy=nothing_saveable' --strip-checkpoint-names --mlir-print-ir-after-all -o %t.after 2> %t.after.err
// RUN: filecheck %s --check-prefix=DUMPAFTER --input-file=%t.after.err
// RUN: filecheck %s --check-prefix=FINAL --input-file=%t.after
// RUN: remat-opt %s --canonicalize --strip-checkpoint-names --mlir-print-ir-before-all -o %t.before 2> %t.before.err
// RUN: filecheck %s --check-prefix=DUMPBEFORE --input-file=%t.before.err

// Bytecode out, and back in (from a file and from stdin).
// RUN: remat-opt %s --remat-partial-eval='policy=nothing_saveable' --emit-bytecode -o %t.bc
// RUN: not grep -q "func.func" %t.bc
// RUN: remat-opt %t.bc | filecheck %s --check-prefix=BYTECODE
// RUN: remat-opt %s --remat-partial-eval='policy=nothing_saveable' --emit-bytecode | remat-opt - | filecheck %s --check-prefix=BYTECODE
// RUN: remat-opt %s --emit-bytecode | remat-opt - | filecheck %s --check-prefix=ROUND

// --list-passes and --version.
// RUN: remat-opt --list-passes | filecheck %s --check-prefix=LIST
// RUN: remat-opt --version | filecheck %s --check-prefix=VERSION

// --print-saved-residuals: the report on stdout (one residual per line, as
// JAX prints them), the module to -o only; remat-partial-eval runs with its
// defaults (everything saveable) when the pipeline has none.
// RUN: remat-opt %s --print-saved-residuals | filecheck %s --check-prefix=RESDEFAULT
// RUN: remat-opt %s --print-saved-residuals --remat-partial-eval='policy=nothing_saveable' -o %t.res | filecheck %s --check-prefix=RESNOTHING
// RUN: filecheck %s --check-prefix=RESMODULE --input-file=%t.res
// RUN: remat-opt %s --print-saved-residuals --pass-pipeline='builtin.module(remat-partial-eval{policy=dots_saveable})' | filecheck %s --check-prefix=RESDOTS

// A core pass with options: max-iterations=2 canonicalizes, max-iterations=0
// leaves the IR alone (so the option does reach the pass), in both syntaxes.
// RUN: remat-opt %s --pass-pipeline='builtin.module(canonicalize{max-iterations=2})' | filecheck %s --check-prefix=CANON
// RUN: remat-opt %s --pass-pipeline='builtin.module(canonicalize{max-iterations=0})' | filecheck %s --check-prefix=NOCANON
// RUN: remat-opt %s --canonicalize='max-iterations=0' | filecheck %s --check-prefix=NOCANON

// --mlir-print-debuginfo prints locations.
// RUN: remat-opt %s --mlir-print-debuginfo | filecheck %s --check-prefix=DEBUGINFO

// ROUND: module {
// ROUND-NEXT: func.func @main(%arg0: tensor<5x4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<5xf32> {remat.cotangent})
// ROUND: stablehlo.custom_call @remat.name(%{{.*}}) {backend_config = "a"}
// ROUND-NOT: // -----
// ROUND: func.func @pipeline(%arg0: tensor<4xf32>)
// ROUND-NEXT: stablehlo.cosine %arg0
// ROUND-NOT: // -----

// NOSTDOUT-NOT: {{.}}

// STRIP-LABEL: func.func @main
// STRIP-NOT: remat.name
// STRIP: return
// STRIP-LABEL: func.func @pipeline
// STRIP-NOT: remat.name
// STRIP: return

// SPLIT: module {
// SPLIT-NEXT: func.func @main(
// SPLIT-NOT: remat.name
// SPLIT: return
// SPLIT-NEXT: }
// SPLIT-NEXT: }
// SPLIT-NEXT: // -----
// SPLIT-NEXT: module {
// SPLIT-NEXT: func.func @pipeline(
// SPLIT-NOT: remat.name
// SPLIT-NOT: // -----

// Markers stripped, dead cosine erased, constants merged and hoisted.
// PIPE-LABEL: func.func @pipeline
// PIPE-NEXT: %[[K:.*]] = stablehlo.constant dense<1.000000e+00> : tensor<4xf32>
// PIPE-NEXT: %[[S:.*]] = stablehlo.sine %arg0
// PIPE-NEXT: %[[M:.*]] = stablehlo.multiply %[[S]], %[[K]]
// PIPE-NEXT: %[[A:.*]] = stablehlo.add %[[M]], %[[K]]
// PIPE-NEXT: return %[[A]]

// NAMESFIRST-LABEL: func.func @main
// NAMESFIRST-NOT: remat.recompute
// NAMESFIRST-NOT: remat.name
// NAMESFIRST: %[[S:.*]] = stablehlo.sine
// NAMESFIRST-NOT: stablehlo.sine
// NAMESFIRST: stablehlo.multiply %arg2, %[[S]]
// NAMESFIRST-NOT: remat.recompute
// NAMESFIRST-NOT: remat.name
// NAMESFIRST: return

// STRIPFIRST-LABEL: func.func @main
// STRIPFIRST-NOT: remat.name
// STRIPFIRST: %[[S:.*]] = stablehlo.sine {{.*}}{remat.recompute = {{[0-9]+}} : i64}
// STRIPFIRST-NEXT: stablehlo.multiply %arg2, %[[S]]

// DUMPAFTER: // -----// IR Dump After Canonicalizer (canonicalize) //----- //
// DUMPAFTER-NEXT: module {
// DUMPAFTER-NOT: remat.recompute
// DUMPAFTER: func.func @pipeline
// DUMPAFTER-NOT: stablehlo.cosine
// DUMPAFTER: // -----// IR Dump After RematPartialEval (remat-partial-eval) //----- //
// DUMPAFTER-NEXT: module {
// DUMPAFTER: remat.recompute
// DUMPAFTER: // -----// IR Dump After StripCheckpointNames (strip-checkpoint-names) //----- //
// DUMPAFTER-NEXT: module {
// DUMPAFTER-NOT: remat.recompute
// DUMPAFTER-NOT: remat.name
// DUMPAFTER-NOT: IR Dump

// FINAL-NOT: IR Dump
// FINAL: module {
// FINAL: func.func @main
// FINAL: func.func @pipeline
// FINAL-NOT: IR Dump

// DUMPBEFORE: // -----// IR Dump Before Canonicalizer (canonicalize) //----- //
// DUMPBEFORE-NEXT: module {
// DUMPBEFORE: func.func @pipeline
// DUMPBEFORE-NEXT: stablehlo.cosine
// DUMPBEFORE: // -----// IR Dump Before StripCheckpointNames (strip-checkpoint-names) //----- //
// DUMPBEFORE-NEXT: module {
// DUMPBEFORE: func.func @pipeline
// DUMPBEFORE-NOT: stablehlo.cosine
// DUMPBEFORE: remat.name
// DUMPBEFORE-NOT: IR Dump

// BYTECODE-LABEL: func.func @main(%arg0: tensor<5x4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<5xf32> {remat.cotangent})
// BYTECODE: stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] {remat.recompute = {{[0-9]+}} : i64}
// BYTECODE-LABEL: func.func @pipeline

// LIST: Passes of remat_passes:
// LIST-NEXT: annotate-host-offload {{.*}}annotate_device_placement
// LIST-NEXT: func
// LIST-NEXT: fold-dot-transposes {{.*}}transposed order
// LIST-NEXT: func
// LIST-NEXT: across-halves {{.*}}(default: False)
// LIST-NEXT: inline {{.*}}func.call
// LIST-NEXT: insert-reduce-precision {{.*}}reduce_precision
// LIST-NEXT: func
// LIST-NEXT: region-regex {{.*}}checkpoint regions
// LIST-NEXT: round-read-back {{.*}}jax.checkpoint{{.*}}(default: False)
// LIST-NEXT: round-exact {{.*}}identity{{.*}}(default: True)
// LIST-NEXT: outline-loop-backwards {{.*}}gradient accumulation
// LIST-NEXT: func
// LIST-NEXT: mode {{.*}}(default: joint)
// LIST-NEXT: place-optimization-barriers {{.*}}optimization_barrier
// LIST-NEXT: func
// LIST-NEXT: in-loops {{.*}}(default: False)
// LIST-NEXT: tie-to-cotangent {{.*}}XLA:CPU{{.*}}(default: False)
// LIST-NEXT: groups {{.*}}per-region{{.*}}(default: per-use)
// LIST-NEXT: function-region {{.*}}module policy{{.*}}(default: False)
// LIST-NEXT: fence-producers {{.*}}backward readers{{.*}}(default: True)
// LIST-NEXT: fence-chains {{.*}}computes it once{{.*}}(default: False)
// LIST-NEXT: remat {{.*}}default pipeline
// LIST: prevent-cse {{.*}}(default: True)
// LIST-NEXT: prevent-cse-in-loops {{.*}}(default: False)
// LIST-NEXT: tie-to-cotangent {{.*}}(default: False)
// LIST-NEXT: barrier-groups {{.*}}(default: per-use)
// LIST-NEXT: fence-chains {{.*}}(default: False)
// LIST-NEXT: round-read-back {{.*}}(default: False)
// LIST-NEXT: scan-segments {{.*}}(default: 0)
// LIST-NEXT: scan-segments-offload {{.*}}pinned_host{{.*}}
// LIST-NEXT: remat-partial-eval {{.*}}checkpoint policy
// LIST-NEXT: policy {{.*}}save_only_these_names
// LIST-NEXT: mode {{.*}}(default: joint)
// LIST-NEXT: cotangent-args
// LIST-NEXT: func {{.*}}(default: main)
// LIST-NEXT: region-regex
// LIST-NEXT: region-policy {{.*}}(default: nothing_saveable)
// LIST-NEXT: levels {{.*}}(default: auto)
// LIST-NEXT: round-exact {{.*}}priced{{.*}}(default: True)
// LIST-NEXT: segment-scans {{.*}}every k iterations
// LIST-NEXT: segments {{.*}}(default: 0)
// LIST-NEXT: func {{.*}}(default: main)
// LIST-NEXT: offload {{.*}}pinned_host{{.*}}
// LIST-NEXT: sink-loop-constants {{.*}}constants alone
// LIST-NEXT: func {{.*}}(default: main)
// LIST-NEXT: strip-checkpoint-names {{.*}}markers
// LIST-NEXT: Core MLIR passes
// LIST-DAG: canonicalize
// LIST-DAG: cse
// LIST-DAG: symbol-dce

// VERSION: remat-opt {{[0-9]+\.[0-9]+\.[0-9]+}}

// RESDEFAULT: // saved residuals of @main: 2 values, 40 bytes
// RESDEFAULT-NEXT: f32[5] named 'a' from f.py:3:8 (f)
// RESDEFAULT-NEXT: f32[5] output of cos from f.py:4:8 (f)
// RESDEFAULT-NOT: {{.}}

// RESNOTHING: // saved residuals of @main: 2 values, 96 bytes
// RESNOTHING-NEXT: f32[5,4] from the argument W1
// RESNOTHING-NEXT: f32[4] from the argument x
// RESNOTHING-NOT: {{.}}

// RESMODULE-LABEL: func.func @main
// RESMODULE: stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] {remat.recompute = {{[0-9]+}} : i64}

// RESDOTS: // saved residuals of @main: 1 value, 20 bytes
// RESDOTS-NEXT: f32[5] output of dot_general from f.py:2:8 (f)
// RESDOTS-NOT: {{.}}

// CANON-LABEL: func.func @pipeline
// CANON-NEXT: %[[K:.*]] = stablehlo.constant dense<1.000000e+00> : tensor<4xf32>
// CANON-NEXT: %[[S:.*]] = stablehlo.sine %arg0
// CANON-NEXT: %[[N:.*]] = stablehlo.custom_call @remat.name(%[[S]])
// CANON-NEXT: %[[M:.*]] = stablehlo.multiply %[[N]], %[[K]]
// CANON-NEXT: %[[A:.*]] = stablehlo.add %[[M]], %[[K]]
// CANON-NEXT: return %[[A]]

// NOCANON-LABEL: func.func @pipeline
// NOCANON-NEXT: stablehlo.cosine %arg0
// NOCANON-NEXT: stablehlo.sine %arg0
// NOCANON-NEXT: stablehlo.custom_call @remat.name
// NOCANON-NEXT: stablehlo.constant
// NOCANON-NEXT: stablehlo.multiply
// NOCANON-NEXT: stablehlo.constant
// NOCANON-NEXT: stablehlo.add

// DEBUGINFO: func.func @main(%arg0: tensor<5x4xf32> loc("W1"), %arg1: tensor<4xf32> loc("x"),

func.func @main(%w1: tensor<5x4xf32> loc("W1"), %x: tensor<4xf32> loc("x"), %ct: tensor<5xf32> {remat.cotangent} loc("ct")) -> (tensor<5xf32>, tensor<5xf32>) {
  %h = stablehlo.dot_general %w1, %x, contracting_dims = [1] x [0] : (tensor<5x4xf32>, tensor<4xf32>) -> tensor<5xf32> loc("jit(f)/jvp()/dot_general"("f"("f.py":2:8)))
  %s = stablehlo.sine %h : tensor<5xf32> loc("jit(f)/jvp()/sin"("f"("f.py":3:8)))
  %a = stablehlo.custom_call @remat.name(%s) {backend_config = "a"} : (tensor<5xf32>) -> tensor<5xf32> loc("jit(f)/jvp()/name"("f"("f.py":3:8)))
  %c = stablehlo.cosine %h : tensor<5xf32> loc("jit(f)/jvp()/cos"("f"("f.py":4:8)))
  %g1 = stablehlo.multiply %ct, %a : tensor<5xf32> loc("jit(f)/transpose(jvp())/mul"("f"("f.py":5:8)))
  %g2 = stablehlo.multiply %g1, %c : tensor<5xf32> loc("jit(f)/transpose(jvp())/mul"("f"("f.py":4:8)))
  return %a, %g2 : tensor<5xf32>, tensor<5xf32>
}

// -----

func.func @pipeline(%x: tensor<4xf32>) -> tensor<4xf32> {
  %dead = stablehlo.cosine %x : tensor<4xf32>
  %0 = stablehlo.sine %x : tensor<4xf32>
  %1 = stablehlo.custom_call @remat.name(%0) {backend_config = "b"} : (tensor<4xf32>) -> tensor<4xf32>
  %c = stablehlo.constant dense<1.0> : tensor<4xf32>
  %2 = stablehlo.multiply %1, %c : tensor<4xf32>
  %c2 = stablehlo.constant dense<1.0> : tensor<4xf32>
  %3 = stablehlo.add %2, %c2 : tensor<4xf32>
  return %3 : tensor<4xf32>
}
