// RUN: remat-opt %s --print-memory --split-input-file | filecheck %s

// A chain: the argument dies at its last use, so at most two 16-byte
// buffers are live at once.
// CHECK: @chain: peak 32 B (32 B) at stablehlo.sine
// CHECK-SAME: arguments 16 B; results 16 B
// CHECK-NEXT: live at the peak: 16 B tensor<4xf32> argument #0; 16 B tensor<4xf32> from stablehlo.sine at line {{[0-9]+}}{{$}}
func.func @chain(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.sine %arg0 : tensor<4xf32>
  %1 = stablehlo.cosine %0 : tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// A value used late stays live across the middle op: three buffers at once.
// CHECK: @late_use: peak 48 B (48 B) at stablehlo.cosine
// CHECK-NEXT: live at the peak: 16 B tensor<4xf32> argument #0; 16 B tensor<4xf32> from stablehlo.sine at line {{[0-9]+}}; 16 B tensor<4xf32> from stablehlo.cosine
func.func @late_use(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.sine %arg0 : tensor<4xf32>
  %1 = stablehlo.cosine %0 : tensor<4xf32>
  %2 = stablehlo.add %1, %arg0 : tensor<4xf32>
  return %2 : tensor<4xf32>
}
