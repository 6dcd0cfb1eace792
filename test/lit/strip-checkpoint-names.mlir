// RUN: remat-opt %s --strip-checkpoint-names --split-input-file | filecheck %s

// The marker is an identity: its uses read the operand instead.
// CHECK-LABEL: func.func @one_marker
// CHECK-NOT: remat.name
// CHECK: %[[S:.*]] = stablehlo.sine %arg0
// CHECK: return %[[S]]
func.func @one_marker(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.sine %arg0 : tensor<4xf32>
  %1 = stablehlo.custom_call @remat.name(%0) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// Other custom calls stay.
// CHECK-LABEL: func.func @other_custom_call
// CHECK: stablehlo.custom_call @something_else
// CHECK-NOT: remat.name
func.func @other_custom_call(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.custom_call @remat.name(%arg0) {backend_config = "x"} : (tensor<4xf32>) -> tensor<4xf32>
  %1 = stablehlo.custom_call @something_else(%0) : (tensor<4xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}
