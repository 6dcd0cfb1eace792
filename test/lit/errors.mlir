// Bad input gives one clear message on stderr, exit status 1, no Python
// traceback and no output file. Every filecheck run below also uses the
// NOTRACE prefix, whose checks (at the top and the bottom of this file) reject
// a traceback before the first and after the last expected line.
//
// This file has three parts: a valid joint function @main (with @helper), a
// malformed part, and a @main with neither cotangent markers nor JAX
// transpose name stacks. Errors that do not need an input are given an empty
// module on stdin.

// NOTRACE-NOT: Traceback

// Malformed MLIR: 'file:line:col: error: <parser message>', with the line of
// the bad op in the whole file, also when split (the error is in the second
// part), and '<stdin>' as the file name for stdin.
// RUN: not remat-opt %s 2>&1 | filecheck %s --check-prefixes=NOTRACE,PARSE
// RUN: echo BEGIN > %t.split
// RUN: not remat-opt %s --split-input-file 2>> %t.split
// RUN: filecheck %s --check-prefixes=NOTRACE,SPLITPARSE --input-file=%t.split
// RUN: not remat-opt - < %s 2>&1 | filecheck %s --check-prefixes=NOTRACE,STDIN

// Input that is neither MLIR nor any other format remat-opt reads. Without NUL
// bytes it is read as text (the format is told from the content: a byte that is
// not UTF-8 may sit in a comment, nowhere else), so the problem is located; binary
// garbage is named as such.
// RUN: printf '\x80\x81\x82' > %t.garbage
// RUN: not remat-opt %t.garbage 2>&1 | filecheck %s --check-prefixes=NOTRACE,GARBAGE
// GARBAGE: {{.*}}.garbage:1:1: error: a byte that is not UTF-8 outside a comment
// RUN: printf '\x80\x00\x82' > %t.binary
// RUN: not remat-opt %t.binary 2>&1 | filecheck %s --check-prefixes=NOTRACE,BINARY
// BINARY: {{.*}}.binary: error: not MLIR text, MLIR bytecode, a StableHLO portable artifact or a serialized jax.export.Exported

// A missing input file.
// RUN: not remat-opt %t.does-not-exist.mlir 2>&1 | filecheck %s --check-prefixes=NOTRACE,MISSING
// MISSING: remat-opt: error: cannot read '{{.*}}does-not-exist.mlir': No such file or directory

// An unknown pass in a pipeline suggests the close name.
// RUN: echo 'module {}' | not remat-opt --pass-pipeline='builtin.module(canonicalise)' 2>&1 | filecheck %s --check-prefixes=NOTRACE,UNKPASS
// UNKPASS: remat-opt: error: unknown pass 'canonicalise'; did you mean canonicalize?

// An unknown flag suggests the close flag (argparse's usage error, status 1).
// RUN: echo 'module {}' | not remat-opt --canonicalise 2>&1 | filecheck %s --check-prefixes=NOTRACE,UNKFLAG
// RUN: echo 'module {}' | not remat-opt --split-input-files 2>&1 | filecheck %s --check-prefixes=NOTRACE,UNKFLAG2
// UNKFLAG: remat-opt: error: unrecognized arguments: --canonicalise (--canonicalise: did you mean --canonicalize?)
// UNKFLAG2: remat-opt: error: unrecognized arguments: --split-input-files ({{.*}}did you mean --split-input-file?)

// An unknown pass option suggests the closest option, as a flag and in a
// pipeline; a pass without options says so; a core pass names the option.
// RUN: echo 'module {}' | not remat-opt --remat-partial-eval='polcy=nothing_saveable' 2>&1 | filecheck %s --check-prefixes=NOTRACE,UNKOPT
// RUN: echo 'module {}' | not remat-opt --pass-pipeline='builtin.module(remat-partial-eval{polcy=nothing_saveable})' 2>&1 | filecheck %s --check-prefixes=NOTRACE,UNKOPT
// RUN: echo 'module {}' | not remat-opt --strip-checkpoint-names='policy=x' 2>&1 | filecheck %s --check-prefixes=NOTRACE,NOOPTS
// RUN: echo 'module {}' | not remat-opt --pass-pipeline='builtin.module(canonicalize{max-iteration=2})' 2>&1 | filecheck %s --check-prefixes=NOTRACE,COREOPT
// UNKOPT: remat-opt: error: unknown option 'polcy' for pass 'remat-partial-eval'; did you mean policy?
// NOOPTS: remat-opt: error: unknown option 'policy' for pass 'strip-checkpoint-names'; it takes no options
// COREOPT: remat-opt: error: bad options for pass 'canonicalize': {{.*}}max-iteration

// Bad option values: the mode, an unknown policy (the known ones are listed),
// a misspelt policy (the close ones are suggested), a policy given arguments
// it does not take, an option a policy does not take (its options are listed;
// levels is the pass's), a malformed cotangent index list.
// RUN: echo 'module {}' | not remat-opt --remat-partial-eval='mode=sideways' 2>&1 | filecheck %s --check-prefixes=NOTRACE,BADMODE
// RUN: echo 'module {}' | not remat-opt --remat-partial-eval='policy=bogus' 2>&1 | filecheck %s --check-prefixes=NOTRACE,BADPOLICY
// RUN: echo 'module {}' | not remat-opt --remat-partial-eval='policy=nothing_savable' 2>&1 | filecheck %s --check-prefixes=NOTRACE,CLOSEPOLICY
// RUN: echo 'module {}' | not remat-opt --remat-partial-eval='policy=dots_saveable(a)' 2>&1 | filecheck %s --check-prefixes=NOTRACE,POLICYARGS
// RUN: echo 'module {}' | not remat-opt --remat-partial-eval='policy=auto(10%,levels=2)' 2>&1 | filecheck %s --check-prefixes=NOTRACE,POLICYOPT
// RUN: echo 'module {}' | not remat-opt --remat-partial-eval='policy=save_only_these_names(names=[a])' 2>&1 | filecheck %s --check-prefixes=NOTRACE,NAMESOPT
// RUN: echo 'module {}' | not remat-opt --remat-partial-eval='cotangent-args=x' 2>&1 | filecheck %s --check-prefixes=NOTRACE,BADINDEX
// BADMODE: remat-opt: error: bad value for option 'mode' of pass 'remat-partial-eval': expected joint or split, got 'sideways'
// BADPOLICY: remat-opt: error: bad value for option 'policy' of pass 'remat-partial-eval': unknown policy 'bogus' in 'bogus'; known policies: everything_saveable, nothing_saveable, dots_saveable,
// CLOSEPOLICY: remat-opt: error: bad value for option 'policy' of pass 'remat-partial-eval': unknown policy 'nothing_savable' in 'nothing_savable'; did you mean nothing_saveable
// POLICYARGS: remat-opt: error: bad value for option 'policy' of pass 'remat-partial-eval': policy 'dots_saveable' takes no arguments
// POLICYOPT: remat-opt: error: bad value for option 'policy' of pass 'remat-partial-eval': policy 'auto' has no option 'levels' (in 'auto(10%,levels=2)'); its options: budget, offload, device, objective, solver, score, monotone
// NAMESOPT: remat-opt: error: bad value for option 'policy' of pass 'remat-partial-eval': policy 'save_only_these_names' has no option 'names' {{.*}}; it takes arguments only, no name=value options: save_only_these_names(a, b)
// BADINDEX: remat-opt: error: bad value for option 'cotangent-args' of pass 'remat-partial-eval':

// Pipeline text: not anchored on builtin.module, a missing ')', a stray ')',
// an unclosed '{'.
// RUN: echo 'module {}' | not remat-opt --pass-pipeline='func.func(cse)' 2>&1 | filecheck %s --check-prefixes=NOTRACE,UNANCHORED
// RUN: echo 'module {}' | not remat-opt --pass-pipeline='builtin.module(cse' 2>&1 | filecheck %s --check-prefixes=NOTRACE,NOCLOSE
// RUN: echo 'module {}' | not remat-opt --pass-pipeline='builtin.module(cse))' 2>&1 | filecheck %s --check-prefixes=NOTRACE,STRAY
// RUN: echo 'module {}' | not remat-opt --pass-pipeline='builtin.module(canonicalize{max-iterations=2)' 2>&1 | filecheck %s --check-prefixes=NOTRACE,BRACE
// UNANCHORED: remat-opt: error: pass pipeline 'func.func(cse)' must be anchored on builtin.module, e.g. 'builtin.module(inline,canonicalize)'
// NOCLOSE: remat-opt: error: expected ')' at the end of pass pipeline 'builtin.module(cse'
// STRAY: remat-opt: error: unbalanced ')' in pass pipeline
// BRACE: remat-opt: error: unbalanced brackets or quotes in pass pipeline

// Conflicting flags.
// RUN: echo 'module {}' | not remat-opt --pass-pipeline='builtin.module(cse)' --cse 2>&1 | filecheck %s --check-prefixes=NOTRACE,BOTHFORMS
// RUN: echo 'module {}' | not remat-opt --emit-bytecode --split-input-file 2>&1 | filecheck %s --check-prefixes=NOTRACE,BCSPLIT
// BOTHFORMS: remat-opt: error: use either --pass-pipeline or per-pass flags, not both
// BCSPLIT: remat-opt: error: --emit-bytecode cannot be combined with --split-input-file

// Errors found while rewriting, one per part (the parts are processed on
// their own, so the malformed second part reports its parse error in
// between): a function that does not exist (the functions are listed), a
// function with no way to tell forward from backward (the message says how
// to mark cotangents; the valid first part gives no error), a cotangent
// index out of range. An error about a function is located at it.
// (A BEGIN line is written first so that CHECK-NEXT can pin the first line.)
// RUN: echo BEGIN > %t.nofunc
// RUN: not remat-opt %s --split-input-file --remat-partial-eval='func=nope' 2>> %t.nofunc
// RUN: filecheck %s --check-prefixes=NOTRACE,NOFUNC --input-file=%t.nofunc
// RUN: echo BEGIN > %t.nocot
// RUN: not remat-opt %s --split-input-file --remat-partial-eval 2>> %t.nocot
// RUN: filecheck %s --check-prefixes=NOTRACE,NOCOT --input-file=%t.nocot
// RUN: echo BEGIN > %t.range
// RUN: not remat-opt %s --split-input-file --remat-partial-eval='cotangent-args=3' 2>> %t.range
// RUN: filecheck %s --check-prefixes=NOTRACE,RANGE --input-file=%t.range
// NOFUNC: BEGIN
// NOFUNC-NEXT: error: no function @nope in the module (functions: @main, @helper)
// NOFUNC-NEXT: {{.*}}errors.mlir:{{[0-9]+}}:8: error: custom op 'stablehlo.bogus' is unknown
// NOFUNC-NEXT: error: no function @nope in the module (functions: @main)
// NOCOT: BEGIN
// NOCOT-NEXT: {{.*}}errors.mlir:{{[0-9]+}}:8: error: custom op 'stablehlo.bogus' is unknown
// NOCOT-NEXT: {{.*}}errors.mlir:{{[0-9]+}}:1: error: cannot tell forward from backward in @main: no argument carries the 'remat.cotangent' attribute and no op location has a JAX 'transpose(' name-stack frame. Mark the cotangent arguments with {remat.cotangent} (remat_passes.export_vjp does this), or pass cotangent-args=<i,j,...> to remat-partial-eval.
// NOCOT-NOT: error
// RANGE: BEGIN
// RANGE-NEXT: {{.*}}errors.mlir:{{[0-9]+}}:1: error: cotangent argument index 3 is out of range (@main has 2 arguments)
// RANGE-NEXT: {{.*}}errors.mlir:{{[0-9]+}}:8: error: custom op 'stablehlo.bogus' is unknown
// RANGE-NEXT: {{.*}}errors.mlir:{{[0-9]+}}:1: error: cotangent argument index 3 is out of range (@main has 2 arguments)

// The exit status is exactly 1 (argparse alone would exit 2).
// RUN: sh -c 'remat-opt --canonicalise < /dev/null 2> /dev/null; test $? -eq 1'
// RUN: sh -c 'remat-opt %s 2> /dev/null; test $? -eq 1'
// RUN: sh -c 'remat-opt %s --split-input-file --remat-partial-eval=func=nope 2> /dev/null; test $? -eq 1'

// On error, -o writes no file, and an existing file is left as it was.
// RUN: rm -f %t.out
// RUN: not remat-opt %s -o %t.out
// RUN: not test -e %t.out
// RUN: not remat-opt %s --split-input-file --remat-partial-eval='func=nope' -o %t.out
// RUN: not test -e %t.out
// RUN: not remat-opt %s --split-input-file --print-saved-residuals -o %t.out
// RUN: not test -e %t.out
// RUN: echo keep > %t.keep
// RUN: not remat-opt %s --split-input-file --remat-partial-eval='func=nope' -o %t.keep
// RUN: filecheck %s --check-prefix=KEEP --input-file=%t.keep
// KEEP: {{^keep$}}

func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %s = stablehlo.sine %x : tensor<4xf32>
  %c = stablehlo.cosine %x : tensor<4xf32>
  %g = stablehlo.multiply %ct, %c : tensor<4xf32>
  return %s, %g : tensor<4xf32>, tensor<4xf32>
}
func.func private @helper(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}

// -----

func.func @bad(%x: tensor<4xf32>) -> tensor<4xf32> {
  // PARSE: {{^.*}}errors.mlir:[[# @LINE + 4]]:8: error: custom op 'stablehlo.bogus' is unknown
  // SPLITPARSE: BEGIN
  // SPLITPARSE-NEXT: {{^.*}}errors.mlir:[[# @LINE + 2]]:8: error: custom op 'stablehlo.bogus' is unknown
  // STDIN: {{^}}<stdin>:[[# @LINE + 1]]:8: error: custom op 'stablehlo.bogus' is unknown
  %0 = stablehlo.bogus %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %s = stablehlo.sine %x : tensor<4xf32>
  %c = stablehlo.cosine %x : tensor<4xf32>
  %g = stablehlo.multiply %ct, %c : tensor<4xf32>
  return %s, %g : tensor<4xf32>, tensor<4xf32>
}

// SPLITPARSE-NOT: error
// NOTRACE-NOT: Traceback
