// User errors that once escaped as Python tracebacks (regression tests). Each is
// an error located at what it is about, exit status 1, no traceback.
//
// RUN: remat-opt %s --split-input-file --verify-diagnostics --remat-partial-eval='policy=save_from_both_policies(dots_saveable, offload_dot_with_no_batch_dims(device, pinned_host))'
//
// Without --verify-diagnostics: one line per case on stderr, nothing else, status 1.
// RUN: not remat-opt %s --split-input-file --remat-partial-eval='policy=save_from_both_policies(dots_saveable, offload_dot_with_no_batch_dims(device, pinned_host))' 2>&1 | filecheck %s
// RUN: sh -c 'remat-opt %s --remat-partial-eval 2> /dev/null; test $? -eq 1'
// CHECK-NOT: Traceback
// CHECK: errors-uncaught.mlir:[[# @LINE + 6]]:1: error: @main is a declaration without a body
// CHECK-NEXT: errors-uncaught.mlir:{{[0-9]+}}:8: error: policy save_from_both_policies{{.*}} failed on stablehlo.cosine: {{.*}}boolean{{.*}}
// CHECK-NOT: {{.}}

// remat-partial-eval on a function declaration: there is no body to rewrite.
// expected-error @+1 {{@main is a declaration without a body; there is nothing to rewrite}}
func.func private @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> tensor<4xf32>

// -----

// save_from_both_policies with a policy that returns a non-bool verdict (an Offloadable):
// the policy itself raises, on the first op it is asked about.
func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %s = stablehlo.sine %d : tensor<4xf32>
  // expected-error @+1 {{failed on stablehlo.cosine: The return value of the policies should be a boolean}}
  %c = stablehlo.cosine %d : tensor<4xf32>
  %g = stablehlo.multiply %ct, %c : tensor<4xf32>
  return %s, %g : tensor<4xf32>, tensor<4xf32>
}
