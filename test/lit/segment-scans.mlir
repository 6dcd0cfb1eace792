// segment-scans: the forward loop keeps its carry every k iterations (a [ceil(n/k)+1]
// buffer written at slot i/k when i % k == 0, else at the scratch slot); the backward loop
// reruns a segment's forward iterations in an inner while when it reaches the segment's
// last iteration, into k-slot buffers it then reads instead of the [n] stacks.
// RUN: remat-opt %s --split-input-file --verify-diagnostics --segment-scans=segments=2 | filecheck %s
// RUN: remat-opt %s --split-input-file --remat-partial-eval=mode=split --segment-scans=segments=2 2>/dev/null | filecheck %s --check-prefix=SPLIT
// RUN: remat-opt %s --split-input-file --segment-scans=segments=3x2 2>/dev/null | filecheck %s --check-prefix=THREE
// RUN: remat-opt %s --split-input-file --remat-partial-eval=mode=split --segment-scans='segments=2 offload=pinned_host' 2>/dev/null | filecheck %s --check-prefix=OFFLOAD

// Three levels (segments=3x2): in the backward, a segment of 3 is rerun to save its carry
// every 2 iterations (2 + 1 saved carries and a scratch slot), then a sub-segment of 2
// into the slots.
// THREE-LABEL: func.func public @main
// THREE: stablehlo.while{{.*}} tensor<3x2xf32>
// THREE: stablehlo.while
// THREE: %[[SUB:.*]]:7 = stablehlo.while{{.*}} tensor<3x2xf32>
// THREE: stablehlo.remainder
// THREE: stablehlo.dynamic_update_slice %{{.*}} : (tensor<3x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<3x2xf32>
// THREE: stablehlo.dynamic_slice %[[SUB]]#6
// THREE: %[[SEG:.*]]:8 = stablehlo.while
// THREE: stablehlo.sine
// THREE: stablehlo.dynamic_slice %[[SEG]]#6

// In split form the saved carries cross as a residual in place of the stacks.
// SPLIT-LABEL: func.func @main_fwd
// SPLIT-SAME: tensor<4x2xf32> {remat.residual = "the carry at the start of every segment of a scan loop, saved by segment-scans"}
// SPLIT-NOT: tensor<5x2xf32> {remat.residual = "f32[5,2]
// SPLIT: stablehlo.remainder
// SPLIT-LABEL: func.func @main_bwd
// SPLIT-SAME: %arg2: tensor<4x2xf32>, %arg3: tensor<f32> {remat.cotangent}
// SPLIT: stablehlo.while
// SPLIT: stablehlo.while
// SPLIT: stablehlo.sine
// SPLIT-LABEL: func.func @main_fwd
// SPLIT-NOT: stablehlo.remainder
// SPLIT-LABEL: func.func @main_bwd

// offload=pinned_host: the forward loop moves each saved carry to host memory as it writes
// it, the buffer crosses in host memory, and the backward moves a saved carry back to the
// device as it reads it.
// OFFLOAD-LABEL: func.func @main_fwd
// OFFLOAD-SAME: tensor<4x2xf32> {mhlo.memory_kind = "pinned_host", remat.residual = "the carry at the start of every segment
// OFFLOAD: %[[HOST:.*]] = stablehlo.custom_call @annotate_device_placement(%{{.*}}) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}}
// OFFLOAD: stablehlo.reshape %[[HOST]]
// OFFLOAD-LABEL: func.func @main_bwd
// OFFLOAD-SAME: %arg2: tensor<4x2xf32> {mhlo.memory_kind = "pinned_host"}
// OFFLOAD: stablehlo.dynamic_slice
// OFFLOAD-NEXT: %[[SLOT:.*]] = stablehlo.reshape
// OFFLOAD-NEXT: stablehlo.custom_call @annotate_device_placement(%[[SLOT]]) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}}

// A 5-step scan in segments of 2: 3 saved carries (+1 scratch slot), segments 2, 2 and 1.
// CHECK-LABEL: func.func public @main
// CHECK: stablehlo.while{{.*}} tensor<4x2xf32>
// CHECK: %[[REM:.*]] = stablehlo.remainder %{{.*}}, %[[K:.*]] : tensor<i32>
// CHECK: stablehlo.dynamic_update_slice %{{.*}} : (tensor<4x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<4x2xf32>
// CHECK-NOT: tensor<5x2xf32>, tensor<5x2xf32>
// CHECK: stablehlo.while
// CHECK: %[[END:.*]] = stablehlo.minimum
// CHECK: %[[HI:.*]] = stablehlo.select
// CHECK: %[[START:.*]] = stablehlo.dynamic_slice %{{.*}} : (tensor<4x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
// CHECK: %[[SEG:.*]]:8 = stablehlo.while
// CHECK: stablehlo.compare LT
// CHECK: stablehlo.sine
// CHECK: stablehlo.cosine
// CHECK: stablehlo.dynamic_update_slice %{{.*}} : (tensor<2x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<2x2xf32>
// CHECK: stablehlo.dynamic_slice %[[SEG]]#6
// CHECK: stablehlo.dynamic_slice %[[SEG]]#7
func.func public @main(%arg0: tensor<2x2xf32>, %arg1: tensor<5x2xf32>, %arg2: tensor<f32> {remat.cotangent}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<2x2xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<5x2xf32> {jax.result_info = "result[1][1]", remat.gradient}) {
  %c = stablehlo.constant dense<1> : tensor<i32>
  %c_0 = stablehlo.constant dense<5> : tensor<i32>
  %c_1 = stablehlo.constant dense<0> : tensor<i32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %0 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<5x2xf32>
  %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<5x2xf32>
  // expected-remark @+1 {{runs in segments of 2: it keeps 3 carries (+1 scratch each, 32 B) and 2 slots (32 B) instead of 5 slots (80 B), for one more run of its body per iteration}}
  %3:6 = stablehlo.while(%iterArg = %arg1, %iterArg_7 = %arg0, %iterArg_8 = %c_1, %iterArg_9 = %0, %iterArg_10 = %1, %iterArg_11 = %2) : tensor<5x2xf32>, tensor<2x2xf32>, tensor<i32>, tensor<2xf32>, tensor<5x2xf32>, tensor<5x2xf32>
  cond {
    %9 = stablehlo.compare LT, %iterArg_8, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %9 : tensor<i1>
  } do {
    %c_12 = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.dynamic_slice %iterArg, %iterArg_8, %c_12, sizes = [1, 2] : (tensor<5x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
    %10 = stablehlo.reshape %9 : (tensor<1x2xf32>) -> tensor<2xf32>
    %11 = stablehlo.dot_general %iterArg_9, %iterArg_7, contracting_dims = [0] x [0] : (tensor<2xf32>, tensor<2x2xf32>) -> tensor<2xf32>
    %12 = stablehlo.add %11, %10 : tensor<2xf32>
    %13 = stablehlo.sine %12 : tensor<2xf32>
    %14 = stablehlo.cosine %12 : tensor<2xf32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %15 = stablehlo.broadcast_in_dim %iterArg_9, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %16 = stablehlo.dynamic_update_slice %iterArg_10, %15, %iterArg_8, %c_13 : (tensor<5x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<5x2xf32>
    %c_14 = stablehlo.constant dense<0> : tensor<i32>
    %17 = stablehlo.broadcast_in_dim %14, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %18 = stablehlo.dynamic_update_slice %iterArg_11, %17, %iterArg_8, %c_14 : (tensor<5x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<5x2xf32>
    %19 = stablehlo.add %iterArg_8, %c : tensor<i32>
    stablehlo.return %iterArg, %iterArg_7, %19, %13, %16, %18 : tensor<5x2xf32>, tensor<2x2xf32>, tensor<i32>, tensor<2xf32>, tensor<5x2xf32>, tensor<5x2xf32>
  }
  %4 = stablehlo.reduce(%3#3 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %5 = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %6 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %7 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<5x2xf32>
  %c_4 = stablehlo.constant dense<0> : tensor<i32>
  %c_5 = stablehlo.constant dense<5> : tensor<i32>
  %c_6 = stablehlo.constant dense<1> : tensor<i32>
  %8:7 = stablehlo.while(%iterArg = %3#4, %iterArg_7 = %3#5, %iterArg_8 = %arg0, %iterArg_9 = %c_4, %iterArg_10 = %6, %iterArg_11 = %5, %iterArg_12 = %7) : tensor<5x2xf32>, tensor<5x2xf32>, tensor<2x2xf32>, tensor<i32>, tensor<2x2xf32>, tensor<2xf32>, tensor<5x2xf32>
  cond {
    %9 = stablehlo.compare LT, %iterArg_9, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %9 : tensor<i1>
  } do {
    %9 = stablehlo.subtract %c_5, %iterArg_9 : tensor<i32>
    %10 = stablehlo.subtract %9, %c_6 : tensor<i32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %11 = stablehlo.dynamic_slice %iterArg, %10, %c_13, sizes = [1, 2] : (tensor<5x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
    %12 = stablehlo.reshape %11 : (tensor<1x2xf32>) -> tensor<2xf32>
    %c_14 = stablehlo.constant dense<0> : tensor<i32>
    %13 = stablehlo.dynamic_slice %iterArg_7, %10, %c_14, sizes = [1, 2] : (tensor<5x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
    %14 = stablehlo.reshape %13 : (tensor<1x2xf32>) -> tensor<2xf32>
    %15 = stablehlo.multiply %iterArg_11, %14 : tensor<2xf32>
    %16 = stablehlo.dot_general %15, %12, contracting_dims = [] x [] : (tensor<2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
    %17 = stablehlo.transpose %16, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %18 = stablehlo.add %iterArg_10, %17 : tensor<2x2xf32>
    %19 = stablehlo.dot_general %15, %iterArg_8, contracting_dims = [0] x [1] : (tensor<2xf32>, tensor<2x2xf32>) -> tensor<2xf32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %20 = stablehlo.broadcast_in_dim %15, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %21 = stablehlo.dynamic_update_slice %iterArg_12, %20, %10, %c_15 : (tensor<5x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<5x2xf32>
    %22 = stablehlo.add %iterArg_9, %c_6 : tensor<i32>
    stablehlo.return %iterArg, %iterArg_7, %iterArg_8, %22, %18, %19, %21 : tensor<5x2xf32>, tensor<5x2xf32>, tensor<2x2xf32>, tensor<i32>, tensor<2x2xf32>, tensor<2xf32>, tensor<5x2xf32>
  }
  return %4, %8#4, %8#6 : tensor<f32>, tensor<2x2xf32>, tensor<5x2xf32>
}

// -----

// Two steps cannot be cut into segments of two: the pair stays as it was.
// CHECK-LABEL: func.func public @main
// CHECK-NOT: stablehlo.remainder
// CHECK: tensor<2x2xf32>, tensor<2x2xf32>
func.func public @main(%arg0: tensor<2x2xf32>, %arg1: tensor<2x2xf32>, %arg2: tensor<f32> {remat.cotangent}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<2x2xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<2x2xf32> {jax.result_info = "result[1][1]", remat.gradient}) {
  %c = stablehlo.constant dense<1> : tensor<i32>
  %c_0 = stablehlo.constant dense<2> : tensor<i32>
  %c_1 = stablehlo.constant dense<0> : tensor<i32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %0 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  // expected-remark @+1 {{@main: a scan loop was not segmented: segments=2 is not less than the trip count 2}}
  %3:6 = stablehlo.while(%iterArg = %arg1, %iterArg_7 = %arg0, %iterArg_8 = %c_1, %iterArg_9 = %0, %iterArg_10 = %1, %iterArg_11 = %2) : tensor<2x2xf32>, tensor<2x2xf32>, tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2x2xf32>
  cond {
    %9 = stablehlo.compare LT, %iterArg_8, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %9 : tensor<i1>
  } do {
    %c_12 = stablehlo.constant dense<0> : tensor<i32>
    %9 = stablehlo.dynamic_slice %iterArg, %iterArg_8, %c_12, sizes = [1, 2] : (tensor<2x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
    %10 = stablehlo.reshape %9 : (tensor<1x2xf32>) -> tensor<2xf32>
    %11 = stablehlo.dot_general %iterArg_9, %iterArg_7, contracting_dims = [0] x [0] : (tensor<2xf32>, tensor<2x2xf32>) -> tensor<2xf32>
    %12 = stablehlo.add %11, %10 : tensor<2xf32>
    %13 = stablehlo.sine %12 : tensor<2xf32>
    %14 = stablehlo.cosine %12 : tensor<2xf32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %15 = stablehlo.broadcast_in_dim %iterArg_9, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %16 = stablehlo.dynamic_update_slice %iterArg_10, %15, %iterArg_8, %c_13 : (tensor<2x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<2x2xf32>
    %c_14 = stablehlo.constant dense<0> : tensor<i32>
    %17 = stablehlo.broadcast_in_dim %14, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %18 = stablehlo.dynamic_update_slice %iterArg_11, %17, %iterArg_8, %c_14 : (tensor<2x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<2x2xf32>
    %19 = stablehlo.add %iterArg_8, %c : tensor<i32>
    stablehlo.return %iterArg, %iterArg_7, %19, %13, %16, %18 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<i32>, tensor<2xf32>, tensor<2x2xf32>, tensor<2x2xf32>
  }
  %4 = stablehlo.reduce(%3#3 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<2xf32>, tensor<f32>) -> tensor<f32>
  %5 = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<2xf32>
  %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %6 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %7 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<2x2xf32>
  %c_4 = stablehlo.constant dense<0> : tensor<i32>
  %c_5 = stablehlo.constant dense<2> : tensor<i32>
  %c_6 = stablehlo.constant dense<1> : tensor<i32>
  %8:7 = stablehlo.while(%iterArg = %3#4, %iterArg_7 = %3#5, %iterArg_8 = %arg0, %iterArg_9 = %c_4, %iterArg_10 = %6, %iterArg_11 = %5, %iterArg_12 = %7) : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<i32>, tensor<2x2xf32>, tensor<2xf32>, tensor<2x2xf32>
  cond {
    %9 = stablehlo.compare LT, %iterArg_9, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %9 : tensor<i1>
  } do {
    %9 = stablehlo.subtract %c_5, %iterArg_9 : tensor<i32>
    %10 = stablehlo.subtract %9, %c_6 : tensor<i32>
    %c_13 = stablehlo.constant dense<0> : tensor<i32>
    %11 = stablehlo.dynamic_slice %iterArg, %10, %c_13, sizes = [1, 2] : (tensor<2x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
    %12 = stablehlo.reshape %11 : (tensor<1x2xf32>) -> tensor<2xf32>
    %c_14 = stablehlo.constant dense<0> : tensor<i32>
    %13 = stablehlo.dynamic_slice %iterArg_7, %10, %c_14, sizes = [1, 2] : (tensor<2x2xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
    %14 = stablehlo.reshape %13 : (tensor<1x2xf32>) -> tensor<2xf32>
    %15 = stablehlo.multiply %iterArg_11, %14 : tensor<2xf32>
    %16 = stablehlo.dot_general %15, %12, contracting_dims = [] x [] : (tensor<2xf32>, tensor<2xf32>) -> tensor<2x2xf32>
    %17 = stablehlo.transpose %16, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
    %18 = stablehlo.add %iterArg_10, %17 : tensor<2x2xf32>
    %19 = stablehlo.dot_general %15, %iterArg_8, contracting_dims = [0] x [1] : (tensor<2xf32>, tensor<2x2xf32>) -> tensor<2xf32>
    %c_15 = stablehlo.constant dense<0> : tensor<i32>
    %20 = stablehlo.broadcast_in_dim %15, dims = [1] : (tensor<2xf32>) -> tensor<1x2xf32>
    %21 = stablehlo.dynamic_update_slice %iterArg_12, %20, %10, %c_15 : (tensor<2x2xf32>, tensor<1x2xf32>, tensor<i32>, tensor<i32>) -> tensor<2x2xf32>
    %22 = stablehlo.add %iterArg_9, %c_6 : tensor<i32>
    stablehlo.return %iterArg, %iterArg_7, %iterArg_8, %22, %18, %19, %21 : tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>, tensor<i32>, tensor<2x2xf32>, tensor<2xf32>, tensor<2x2xf32>
  }
  return %4, %8#4, %8#6 : tensor<f32>, tensor<2x2xf32>, tensor<2x2xf32>
}
