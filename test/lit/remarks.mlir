// The remarks remat-partial-eval makes, each on the function it is about, checked with
// --verify-diagnostics (expected-remark), and the IR each case becomes.
// RUN: remat-opt %s --split-input-file --verify-diagnostics --remat-partial-eval='policy=save_only_these_names(h)' | filecheck %s

// A forward while loop with no matching backward loop is one atomic op.
// CHECK-LABEL: func.func @main
// CHECK: stablehlo.while
// CHECK: stablehlo.multiply
// expected-remark @+2 {{@main: 1 forward stablehlo.while loop(s) are not scan loops with a matching backward loop; each is treated as one atomic op}}
// expected-remark @+1 {{@main: save_only_these_names('h'): @main has no checkpoint names at all}}
func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %w:2 = stablehlo.while(%i = %c0, %v = %x) : tensor<i32>, tensor<4xf32>
    cond {
      %c3 = stablehlo.constant dense<3> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %c1 = stablehlo.constant dense<1> : tensor<i32>
      %n = stablehlo.add %i, %c1 : tensor<i32>
      %s = stablehlo.sine %v : tensor<4xf32>
      stablehlo.return %n, %s : tensor<i32>, tensor<4xf32>
    }
  %g = stablehlo.multiply %ct, %w#1 : tensor<4xf32>
  return %w#1, %g : tensor<4xf32>, tensor<4xf32>
}

// -----

// A forward while loop the backward never reads (a library's random initialisation whose
// values it then replaces) was neither saved nor recomputed: no remark of it.
// CHECK-LABEL: func.func @main
// CHECK: stablehlo.while
// CHECK-NOT: remat.recompute
// expected-remark @+1 {{@main: save_only_these_names('h'): @main has no checkpoint names at all}}
func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %w:2 = stablehlo.while(%i = %c0, %v = %x) : tensor<i32>, tensor<4xf32>
    cond {
      %c3 = stablehlo.constant dense<3> : tensor<i32>
      %lt = stablehlo.compare LT, %i, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %c1 = stablehlo.constant dense<1> : tensor<i32>
      %n = stablehlo.add %i, %c1 : tensor<i32>
      %s = stablehlo.sine %v : tensor<4xf32>
      stablehlo.return %n, %s : tensor<i32>, tensor<4xf32>
    }
  %g = stablehlo.multiply %ct, %x : tensor<4xf32>
  return %w#1, %g : tensor<4xf32>, tensor<4xf32>
}

// -----

// A call is saved whole until inlined.
// CHECK-LABEL: func.func private @f
// CHECK-LABEL: func.func @main
// CHECK: call @f(%arg0)
// CHECK-NOT: remat.recompute
func.func private @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %s = stablehlo.sine %x : tensor<4xf32>
  return %s : tensor<4xf32>
}
// expected-remark @+2 {{@main: 1 func.call op(s) are kept as atomic calls}}
// expected-remark @+1 {{'h' matches nothing}}
func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %s = func.call @f(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %g = stablehlo.multiply %ct, %s : tensor<4xf32>
  return %s, %g : tensor<4xf32>, tensor<4xf32>
}

// -----

// The name the policy saves is there: no remark; the unnamed cosine is recomputed.
// CHECK-LABEL: func.func @main
// CHECK: %[[H:.*]] = stablehlo.custom_call @remat.name
// CHECK: stablehlo.cosine %arg0 {remat.recompute
func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %s = stablehlo.sine %x : tensor<4xf32>
  %h = stablehlo.custom_call @remat.name(%s) {backend_config = "h"} : (tensor<4xf32>) -> tensor<4xf32>
  %c = stablehlo.cosine %x : tensor<4xf32>
  %p = stablehlo.multiply %h, %c : tensor<4xf32>
  %g = stablehlo.multiply %ct, %p : tensor<4xf32>
  return %h, %g : tensor<4xf32>, tensor<4xf32>
}
