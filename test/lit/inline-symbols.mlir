// RUN: remat-opt %s --inline --split-input-file | filecheck %s
// RUN: remat-opt %s --remat='policy=nothing_saveable' --split-input-file | filecheck %s --check-prefix=REMAT

// inline erases the private functions left without callers, but not those
// another op still names: a stablehlo.composite's decomposition (MaxText's
// chlo.erf, defined after its user), a custom_call's called_computations,
// and what those name in turn.

// CHECK-LABEL: module @composite
// CHECK: func.func public @main
// CHECK-NEXT: stablehlo.composite "chlo.erf" %arg0 {decomposition = @chlo.erf.impl_3}
// CHECK-NOT: func.func private @helper
// CHECK: func.func private @chlo.erf.impl_3
// CHECK: func.func private @erf_core
// CHECK-NOT: func.func private @unused
// REMAT-LABEL: module @composite
// REMAT: stablehlo.composite "chlo.erf"
// REMAT: func.func private @chlo.erf.impl_3
module @composite {
  func.func public @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %0 = call @helper(%x) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = stablehlo.cosine %0 : tensor<4xf32>
    %2 = stablehlo.multiply %ct, %1 : tensor<4xf32>
    return %1, %2 : tensor<4xf32>, tensor<4xf32>
  }
  func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.composite "chlo.erf" %a {decomposition = @chlo.erf.impl_3} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @unused(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
  func.func private @chlo.erf.impl_3(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.composite "my.core" %a {decomposition = @erf_core} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @erf_core(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.tanh %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}

// -----

// CHECK-LABEL: module @custom_call
// CHECK: stablehlo.custom_call @my_target(%arg0) {called_computations = [@body]}
// CHECK: func.func private @body
// CHECK-NOT: func.func private @helper
module @custom_call {
  func.func public @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %0 = call @helper(%x) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = stablehlo.multiply %ct, %0 : tensor<4xf32>
    return %0, %1 : tensor<4xf32>, tensor<4xf32>
  }
  func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.custom_call @my_target(%a) {called_computations = [@body]} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @body(%a: tensor<4xf32>) -> tensor<4xf32> {
    return %a : tensor<4xf32>
  }
}
