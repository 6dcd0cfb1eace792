// User errors that once escaped as Python tracebacks (regression tests). Each
// is a one-line 'remat-opt: error: ...' on stderr, exit status 1, no traceback:
// * remat-partial-eval on a function declaration (no body);
// * save_from_both_policies with a policy that returns a non-bool verdict
//   (here an Offloadable), which makes the policy itself raise.

// NOTRACE-NOT: Traceback

// RUN: not remat-opt %s --remat-partial-eval='func=decl' 2>&1 | filecheck %s --check-prefixes=NOTRACE,DECL
// RUN: sh -c 'remat-opt %s --remat-partial-eval=func=decl 2> /dev/null; test $? -eq 1'
// DECL: remat-opt: error: {{.*}}@decl

// RUN: not remat-opt %s --remat-partial-eval='policy=save_from_both_policies(dots_saveable, offload_dot_with_no_batch_dims(device, pinned_host))' 2>&1 | filecheck %s --check-prefixes=NOTRACE,BOTH
// BOTH: remat-opt: error: {{.*}}boolean

func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s = stablehlo.sine %d : tensor<4xf32>
  %c = stablehlo.cosine %d : tensor<4xf32>
  %g = stablehlo.multiply %ct, %c : tensor<4xf32>
  return %s, %g : tensor<4xf32>, tensor<4xf32>
}

func.func private @decl(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> tensor<4xf32>

// NOTRACE-NOT: Traceback
