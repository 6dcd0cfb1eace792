// segment-scans: the forward loop keeps its carry every k iterations (a [ceil(n/k)+1]
// buffer written at slot i/k when i % k == 0, else at the scratch slot); the backward loop
// reruns a segment's forward iterations in an inner while when it reaches the segment's
// last iteration, into k-slot buffers it then reads instead of the [n] stacks.
// RUN: remat-opt %s --split-input-file --verify-diagnostics --segment-scans=segments=2 | filecheck %s
// RUN: remat-opt %s --split-input-file --remat-partial-eval=mode=split --segment-scans=segments=2 2>/dev/null | filecheck %s --check-prefix=SPLIT
// RUN: remat-opt %s --split-input-file --segment-scans=segments=3x2 2>/dev/null | filecheck %s --check-prefix=THREE
// RUN: remat-opt %s --split-input-file --remat-partial-eval=mode=split --segment-scans='segments=2 offload=pinned_host' 2>/dev/null | filecheck %s --check-prefix=OFFLOAD
// RUN: sed -n '/^module @shard_map_scan/,/^}/p' %s | remat-opt --segment-scans=segments=2 2>/dev/null | filecheck %s --check-prefix=MANUAL
// RUN: sed -n '/^module @shard_map_scan/,/^}/p' %s | remat-opt --remat-partial-eval=mode=split --segment-scans=segments=2 2>/dev/null | filecheck %s --check-prefix=MANUALSPLIT
// RUN: sed -n '/^module @gspmd_scan/,/^}/p' %s | remat-opt --remat-partial-eval=mode=split --segment-scans=segments=2 2>/dev/null | filecheck %s --check-prefix=GSPMDSPLIT

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

// A scan inside a shard_map body in split form: the forward manual computation (in
// @main_fwd) returns the saved carries, @main_fwd returns them as a residual in place of the
// four stacks, and the backward manual computation (in @main_bwd) takes @main_bwd's argument
// for them and reruns each segment.
// MANUALSPLIT-LABEL: func.func @main_fwd
// MANUALSPLIT-NOT: "f32[8,1,4] output of manual_computation
// MANUALSPLIT-SAME: tensor<6x1x4xf32> {remat.residual = "the carry at the start of every segment of a scan loop, saved by segment-scans"}
// MANUALSPLIT: sdy.manual_computation
// MANUALSPLIT: stablehlo.remainder
// MANUALSPLIT-LABEL: func.func @main_bwd
// MANUALSPLIT-SAME: %arg{{[0-9]+}}: tensor<6x1x4xf32>
// MANUALSPLIT: sdy.manual_computation
// MANUALSPLIT: stablehlo.while
// MANUALSPLIT: stablehlo.while
// MANUALSPLIT: stablehlo.all_reduce

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

// -----

// A scan inside a shard_map body (Shardy): the VJP's forward manual computation runs the
// forward loop and returns its stacks, the backward one takes them for the backward loop
// (jax.export of a pmean-in-the-body scan over 2 devices, 4 iterations, after remat). The
// forward loop now keeps its carry every 2 iterations; the forward computation returns
// those saved carries ([3,1,4] per device, [6,1,4] sharded over "data" on its first
// dimension, as JAX lays out shard_map residuals) instead of the four [4,1,4] stacks. The
// loop's invariants that are arguments of the forward body (the weight, the inputs) are not
// copied out: the backward computation takes the forward one's operands for them, with
// their shardings; a constant is made again. The backward computation reruns each segment
// in a loop of its own inside the backward loop.
// MANUAL-LABEL: module @shard_map_scan
// MANUAL: sdy.manual_computation(%arg0, %arg1)
// MANUAL: stablehlo.remainder
// MANUAL: sdy.return {{.*}}, tensor<3x1x4xf32>{{$}}
// MANUAL-NEXT: } : (tensor<4x4xf32>, tensor<4x2x4xf32>) -> (tensor<f32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<6x1x4xf32>)
// MANUAL: %[[B:.*]]:2 = sdy.manual_computation({{.*}}, %arg1, %arg0) in_shardings=[{{.*}}, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{}, {"data"}, {}]>, <@mesh, [{}, {}]>]
// MANUAL: stablehlo.while
// MANUAL: stablehlo.while
// MANUAL: } : ({{.*}}, tensor<6x1x4xf32>, tensor<4x2x4xf32>, tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x2x4xf32>)
// MANUAL: return %{{.*}}, %[[B]]#0, %[[B]]#1
module @shard_map_scan attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=2]> {stablehlo.mesh = {axes = [{name = "data", size = 2 : i64}]}}
  sdy.mesh @empty_mesh = <[]> {stablehlo.mesh = {axes = []}}
  func.func public @main(%arg0: tensor<4x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}]>}, %arg1: tensor<4x2x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"data"}, {}]>}, %arg2: tensor<f32> {remat.cotangent, sdy.sharding = #sdy.sharding<@empty_mesh, []>}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<4x4xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<4x2x4xf32> {jax.result_info = "result[1][1]", remat.gradient}) {
    %0:9 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{}, {}]>, <@mesh, [{}, {"data"}, {}]>] out_shardings=[<@mesh, []>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, []>] manual_axes={"data"} (%arg3: tensor<4x4xf32>, %arg4: tensor<4x1x4xf32>) {
      %c = stablehlo.constant dense<1> : tensor<i32>
      %c_0 = stablehlo.constant dense<4> : tensor<i32>
      %c_1 = stablehlo.constant dense<0> : tensor<i32>
      %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
      %3 = stablehlo.slice %arg4 [0:1, 0:1, 0:4] : (tensor<4x1x4xf32>) -> tensor<1x1x4xf32>
      %4 = stablehlo.reshape %3 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
      %5 = stablehlo.tanh %4 : tensor<1x4xf32>
      %6 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
      %7 = stablehlo.subtract %6, %5 : tensor<1x4xf32>
      %8 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
      %9 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
      %10 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
      %11 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
      // (bytes as the residuals of the computation count them: its results, the two devices of
      // "data" side by side)
      // expected-remark @+1 {{runs in segments of 2: it keeps 2 carries (+1 scratch each, 96 B) and 2 slots (256 B) instead of 4 slots (512 B), for one more run of its body per iteration}}
      %12:9 = stablehlo.while(%iterArg = %arg4, %iterArg_3 = %cst_2, %iterArg_4 = %arg3, %iterArg_5 = %c_1, %iterArg_6 = %5, %iterArg_7 = %8, %iterArg_8 = %9, %iterArg_9 = %10, %iterArg_10 = %11) : tensor<4x1x4xf32>, tensor<f32>, tensor<4x4xf32>, tensor<i32>, tensor<1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>
      cond {
        %16 = stablehlo.compare LT, %iterArg_5, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %16 : tensor<i1>
      } do {
        %c_11 = stablehlo.constant dense<0> : tensor<i32>
        %16 = stablehlo.dynamic_slice %iterArg, %iterArg_5, %c_11, %c_11, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
        %17 = stablehlo.reshape %16 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
        %cst_12 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
        %18 = stablehlo.dot_general %iterArg_6, %iterArg_4, contracting_dims = [1] x [0] : (tensor<1x4xf32>, tensor<4x4xf32>) -> tensor<1x4xf32>
        %19 = stablehlo.add %18, %17 : tensor<1x4xf32>
        %20 = stablehlo.sine %iterArg_6 : tensor<1x4xf32>
        %21 = stablehlo.cosine %iterArg_6 : tensor<1x4xf32>
        %22 = "stablehlo.all_reduce"(%20) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
        ^bb0(%arg5: tensor<f32>, %arg6: tensor<f32>):
          %38 = stablehlo.add %arg5, %arg6 : tensor<f32>
          stablehlo.return %38 : tensor<f32>
        }) : (tensor<1x4xf32>) -> tensor<1x4xf32>
        %23 = stablehlo.broadcast_in_dim %cst_12, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
        %24 = stablehlo.divide %22, %23 : tensor<1x4xf32>
        %25 = stablehlo.add %19, %24 : tensor<1x4xf32>
        %26 = stablehlo.tanh %25 : tensor<1x4xf32>
        %27 = stablehlo.broadcast_in_dim %iterArg_3, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
        %28 = stablehlo.subtract %27, %26 : tensor<1x4xf32>
        %c_13 = stablehlo.constant dense<0> : tensor<i32>
        %29 = stablehlo.broadcast_in_dim %iterArg_6, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
        %30 = stablehlo.dynamic_update_slice %iterArg_7, %29, %iterArg_5, %c_13, %c_13 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
        %c_14 = stablehlo.constant dense<0> : tensor<i32>
        %31 = stablehlo.broadcast_in_dim %21, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
        %32 = stablehlo.dynamic_update_slice %iterArg_8, %31, %iterArg_5, %c_14, %c_14 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
        %c_15 = stablehlo.constant dense<0> : tensor<i32>
        %33 = stablehlo.broadcast_in_dim %26, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
        %34 = stablehlo.dynamic_update_slice %iterArg_9, %33, %iterArg_5, %c_15, %c_15 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
        %c_16 = stablehlo.constant dense<0> : tensor<i32>
        %35 = stablehlo.broadcast_in_dim %28, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
        %36 = stablehlo.dynamic_update_slice %iterArg_10, %35, %iterArg_5, %c_16, %c_16 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
        %37 = stablehlo.add %iterArg_5, %c : tensor<i32>
        stablehlo.return %iterArg, %iterArg_3, %iterArg_4, %37, %26, %30, %32, %34, %36 : tensor<4x1x4xf32>, tensor<f32>, tensor<4x4xf32>, tensor<i32>, tensor<1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>
      }
      %13 = stablehlo.multiply %12#4, %12#4 : tensor<1x4xf32>
      %14 = stablehlo.reduce(%13 init: %cst) applies stablehlo.add across dimensions = [0, 1] : (tensor<1x4xf32>, tensor<f32>) -> tensor<f32>
      %15 = "stablehlo.all_reduce"(%14) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
      ^bb0(%arg5: tensor<f32>, %arg6: tensor<f32>):
        %16 = stablehlo.add %arg5, %arg6 : tensor<f32>
        stablehlo.return %16 : tensor<f32>
      }) : (tensor<f32>) -> tensor<f32>
      sdy.return %15, %5, %7, %12#5, %12#6, %12#7, %12#8, %12#4, %15 : tensor<f32>, tensor<1x4xf32>, tensor<1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<1x4xf32>, tensor<f32>
    } : (tensor<4x4xf32>, tensor<4x2x4xf32>) -> (tensor<f32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<8x1x4xf32>, tensor<8x1x4xf32>, tensor<8x1x4xf32>, tensor<8x1x4xf32>, tensor<2x4xf32>, tensor<f32>)
    %1 = sdy.manual_computation(%arg0) in_shardings=[<@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"data"}, {}]>] manual_axes={"data"} (%arg3: tensor<4x4xf32>) {
      sdy.return %arg3 : tensor<4x4xf32>
    } : (tensor<4x4xf32>) -> tensor<8x4xf32>
    %2:2 = sdy.manual_computation(%arg2, %0#1, %0#2, %1, %0#3, %0#4, %0#5, %0#6, %0#7) in_shardings=[<@mesh, []>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{"data"}, {}, {}]>, <@mesh, [{"data"}, {}]>] out_shardings=[<@mesh, [{}, {}]>, <@mesh, [{}, {"data"}, {}]>] manual_axes={"data"} (%arg3: tensor<f32>, %arg4: tensor<1x4xf32>, %arg5: tensor<1x4xf32>, %arg6: tensor<4x4xf32>, %arg7: tensor<4x1x4xf32>, %arg8: tensor<4x1x4xf32>, %arg9: tensor<4x1x4xf32>, %arg10: tensor<4x1x4xf32>, %arg11: tensor<1x4xf32>) {
      %c = stablehlo.constant dense<1> : tensor<i32>
      %c_0 = stablehlo.constant dense<4> : tensor<i32>
      %c_1 = stablehlo.constant dense<0> : tensor<i32>
      %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %3 = stablehlo.broadcast_in_dim %arg3, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
      %4 = stablehlo.multiply %arg11, %3 : tensor<1x4xf32>
      %5 = stablehlo.multiply %3, %arg11 : tensor<1x4xf32>
      %6 = stablehlo.add %4, %5 : tensor<1x4xf32>
      %7 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
      %8 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
      %9:9 = stablehlo.while(%iterArg = %arg7, %iterArg_2 = %arg8, %iterArg_3 = %arg9, %iterArg_4 = %arg10, %iterArg_5 = %arg6, %iterArg_6 = %c_1, %iterArg_7 = %7, %iterArg_8 = %6, %iterArg_9 = %8) : tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<4x4xf32>, tensor<1x4xf32>, tensor<4x1x4xf32>
      cond {
        %16 = stablehlo.compare LT, %iterArg_6, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %16 : tensor<i1>
      } do {
        %16 = stablehlo.subtract %c_0, %iterArg_6 : tensor<i32>
        %17 = stablehlo.subtract %16, %c : tensor<i32>
        %c_10 = stablehlo.constant dense<0> : tensor<i32>
        %18 = stablehlo.dynamic_slice %iterArg, %17, %c_10, %c_10, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
        %19 = stablehlo.reshape %18 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
        %c_11 = stablehlo.constant dense<0> : tensor<i32>
        %20 = stablehlo.dynamic_slice %iterArg_2, %17, %c_11, %c_11, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
        %21 = stablehlo.reshape %20 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
        %c_12 = stablehlo.constant dense<0> : tensor<i32>
        %22 = stablehlo.dynamic_slice %iterArg_3, %17, %c_12, %c_12, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
        %23 = stablehlo.reshape %22 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
        %c_13 = stablehlo.constant dense<0> : tensor<i32>
        %24 = stablehlo.dynamic_slice %iterArg_4, %17, %c_13, %c_13, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
        %25 = stablehlo.reshape %24 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
        %cst_14 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
        %26 = stablehlo.multiply %iterArg_8, %25 : tensor<1x4xf32>
        %27 = stablehlo.multiply %26, %23 : tensor<1x4xf32>
        %28 = stablehlo.add %26, %27 : tensor<1x4xf32>
        %29 = "stablehlo.all_reduce"(%28) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
        ^bb0(%arg12: tensor<f32>, %arg13: tensor<f32>):
          %42 = stablehlo.add %arg12, %arg13 : tensor<f32>
          stablehlo.return %42 : tensor<f32>
        }) : (tensor<1x4xf32>) -> tensor<1x4xf32>
        %30 = stablehlo.broadcast_in_dim %cst_14, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
        %31 = stablehlo.divide %29, %30 : tensor<1x4xf32>
        %32 = stablehlo.multiply %31, %21 : tensor<1x4xf32>
        %33 = stablehlo.dot_general %28, %19, contracting_dims = [0] x [0] : (tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<4x4xf32>
        %34 = stablehlo.transpose %33, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
        %35 = stablehlo.dot_general %28, %iterArg_5, contracting_dims = [1] x [1] : (tensor<1x4xf32>, tensor<4x4xf32>) -> tensor<1x4xf32>
        %36 = stablehlo.add %32, %35 : tensor<1x4xf32>
        %37 = "stablehlo.all_reduce"(%34) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
        ^bb0(%arg12: tensor<f32>, %arg13: tensor<f32>):
          %42 = stablehlo.add %arg12, %arg13 : tensor<f32>
          stablehlo.return %42 : tensor<f32>
        }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
        %38 = stablehlo.add %iterArg_7, %37 : tensor<4x4xf32>
        %c_15 = stablehlo.constant dense<0> : tensor<i32>
        %39 = stablehlo.broadcast_in_dim %28, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
        %40 = stablehlo.dynamic_update_slice %iterArg_9, %39, %17, %c_15, %c_15 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
        %41 = stablehlo.add %iterArg_6, %c : tensor<i32>
        stablehlo.return %iterArg, %iterArg_2, %iterArg_3, %iterArg_4, %iterArg_5, %41, %38, %36, %40 : tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<4x4xf32>, tensor<1x4xf32>, tensor<4x1x4xf32>
      }
      %10 = stablehlo.multiply %9#7, %arg5 : tensor<1x4xf32>
      %11 = stablehlo.multiply %10, %arg4 : tensor<1x4xf32>
      %12 = stablehlo.add %10, %11 : tensor<1x4xf32>
      %13 = stablehlo.broadcast_in_dim %12, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
      %14 = stablehlo.pad %13, %cst, low = [0, 0, 0], high = [3, 0, 0], interior = [0, 0, 0] : (tensor<1x1x4xf32>, tensor<f32>) -> tensor<4x1x4xf32>
      %15 = stablehlo.add %9#8, %14 : tensor<4x1x4xf32>
      sdy.return %9#6, %15 : tensor<4x4xf32>, tensor<4x1x4xf32>
    } : (tensor<f32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<8x4xf32>, tensor<8x1x4xf32>, tensor<8x1x4xf32>, tensor<8x1x4xf32>, tensor<8x1x4xf32>, tensor<2x4xf32>) -> (tensor<4x4xf32>, tensor<4x2x4xf32>)
    return %0#0, %2#0, %2#1 : tensor<f32>, tensor<4x4xf32>, tensor<4x2x4xf32>
  }
}

// -----

// The same scan under GSPMD (jax_use_shardy_partitioner=False): the shard_map body is
// inlined, and the four stacks leave the manual region and come back in through custom
// calls (@Sharding, @SPMDShardToFullShape, @Sharding, @SPMDFullToShardShape). The pair is
// found through that round trip; the saved carries ([3,1,4] per device) go from the
// forward loop to the backward one directly, both loops being in the region, and the
// stacks' round trips go.
// CHECK-LABEL: module @gspmd_scan
// CHECK: %[[FWD:.*]]:{{[0-9]+}} = stablehlo.while
// CHECK: stablehlo.remainder
// CHECK-NOT: -> tensor<8x1x4xf32>
// CHECK: stablehlo.while({{.*}}%[[FWD]]#{{[0-9]+}}{{.*}}) : {{.*}}tensor<3x1x4xf32>
//
// In split form the pair spans @main_fwd and @main_bwd, each with its own manual region:
// the saved carries leave @main_fwd's region as a residual tiled over the devices
// ([3,1,4] per device, [6,1,4] in all) and come back into @main_bwd's; the loop's
// invariants that are arguments entering the region (W, xs) cross as the arguments
// themselves and enter again; the stacks ([8,1,4] each) no longer cross, and the forward
// loop no longer writes them.
// GSPMDSPLIT-LABEL: func.func @main_fwd
// GSPMDSPLIT-NOT: tensor<8x1x4xf32> {mhlo.sharding
// GSPMDSPLIT-SAME: tensor<4x2x4xf32> {mhlo.sharding = "{devices=[1,2,1]<=[2]}", remat.residual = "from the argument arg1"}
// GSPMDSPLIT-SAME: tensor<6x1x4xf32> {mhlo.sharding = "{devices=[2,1,1]0,1}", remat.residual = "the carry at the start of every segment of a scan loop, saved by segment-scans"}
// GSPMDSPLIT: stablehlo.while({{.*}}) : tensor<4x1x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<1x4xf32>, tensor<3x1x4xf32>
// GSPMDSPLIT: stablehlo.remainder
// GSPMDSPLIT: @SPMDShardToFullShape({{.*}}) {mhlo.sharding = "{devices=[2,1,1]0,1}"} : (tensor<3x1x4xf32>) -> tensor<6x1x4xf32>
// GSPMDSPLIT-LABEL: func.func @main_bwd
// GSPMDSPLIT-SAME: %[[SAVED:arg[0-9]+]]: tensor<6x1x4xf32> {mhlo.sharding = "{devices=[2,1,1]0,1}"}
// GSPMDSPLIT: @Sharding(%[[SAVED]])
// GSPMDSPLIT-NEXT: @SPMDFullToShardShape({{.*}}) {mhlo.sharding = "{manual}"} : (tensor<6x1x4xf32>) -> tensor<3x1x4xf32>
// GSPMDSPLIT: stablehlo.while
// GSPMDSPLIT: stablehlo.while
module @gspmd_scan attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x4xf32> {mhlo.sharding = "{replicated}"}, %arg1: tensor<4x2x4xf32> {mhlo.sharding = "{devices=[1,2,1]<=[2]}"}, %arg2: tensor<f32> {mhlo.sharding = "{replicated}", remat.cotangent}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<4x4xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<4x2x4xf32> {jax.result_info = "result[1][1]", remat.gradient}) {
    %0 = stablehlo.custom_call @Sharding(%arg0) {mhlo.sharding = "{replicated}"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %1 = stablehlo.custom_call @SPMDFullToShardShape(%0) {mhlo.sharding = "{manual}"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %2 = stablehlo.custom_call @Sharding(%arg1) {mhlo.sharding = "{devices=[1,2,1]<=[2]}"} : (tensor<4x2x4xf32>) -> tensor<4x2x4xf32>
    %3 = stablehlo.custom_call @SPMDFullToShardShape(%2) {mhlo.sharding = "{manual}"} : (tensor<4x2x4xf32>) -> tensor<4x1x4xf32>
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<4> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_2 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %4 = stablehlo.slice %3 [0:1, 0:1, 0:4] : (tensor<4x1x4xf32>) -> tensor<1x1x4xf32>
    %5 = stablehlo.reshape %4 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
    %6 = stablehlo.tanh %5 : tensor<1x4xf32>
    %7 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
    %8 = stablehlo.subtract %7, %6 : tensor<1x4xf32>
    %9 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
    %10 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
    %11 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
    %12 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
    // expected-remark @+1 {{runs in segments of 2: it keeps 2 carries (+1 scratch each, 96 B) and 2 slots (256 B) instead of 4 slots (512 B), for one more run of its body per iteration}}
    %13:9 = stablehlo.while(%iterArg = %3, %iterArg_7 = %cst_2, %iterArg_8 = %1, %iterArg_9 = %c_1, %iterArg_10 = %6, %iterArg_11 = %9, %iterArg_12 = %10, %iterArg_13 = %11, %iterArg_14 = %12) : tensor<4x1x4xf32>, tensor<f32>, tensor<4x4xf32>, tensor<i32>, tensor<1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>
    cond {
      %70 = stablehlo.compare LT, %iterArg_9, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %70 : tensor<i1>
    } do {
      %c_15 = stablehlo.constant dense<0> : tensor<i32>
      %70 = stablehlo.dynamic_slice %iterArg, %iterArg_9, %c_15, %c_15, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
      %71 = stablehlo.reshape %70 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
      %cst_16 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %72 = stablehlo.dot_general %iterArg_10, %iterArg_8, contracting_dims = [1] x [0] : (tensor<1x4xf32>, tensor<4x4xf32>) -> tensor<1x4xf32>
      %73 = stablehlo.add %72, %71 : tensor<1x4xf32>
      %74 = stablehlo.sine %iterArg_10 : tensor<1x4xf32>
      %75 = stablehlo.cosine %iterArg_10 : tensor<1x4xf32>
      %76 = "stablehlo.all_reduce"(%74) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
      ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
        %92 = stablehlo.add %arg3, %arg4 : tensor<f32>
        stablehlo.return %92 : tensor<f32>
      }) : (tensor<1x4xf32>) -> tensor<1x4xf32>
      %77 = stablehlo.broadcast_in_dim %cst_16, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
      %78 = stablehlo.divide %76, %77 : tensor<1x4xf32>
      %79 = stablehlo.add %73, %78 : tensor<1x4xf32>
      %80 = stablehlo.tanh %79 : tensor<1x4xf32>
      %81 = stablehlo.broadcast_in_dim %iterArg_7, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
      %82 = stablehlo.subtract %81, %80 : tensor<1x4xf32>
      %c_17 = stablehlo.constant dense<0> : tensor<i32>
      %83 = stablehlo.broadcast_in_dim %iterArg_10, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
      %84 = stablehlo.dynamic_update_slice %iterArg_11, %83, %iterArg_9, %c_17, %c_17 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
      %c_18 = stablehlo.constant dense<0> : tensor<i32>
      %85 = stablehlo.broadcast_in_dim %75, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
      %86 = stablehlo.dynamic_update_slice %iterArg_12, %85, %iterArg_9, %c_18, %c_18 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
      %c_19 = stablehlo.constant dense<0> : tensor<i32>
      %87 = stablehlo.broadcast_in_dim %80, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
      %88 = stablehlo.dynamic_update_slice %iterArg_13, %87, %iterArg_9, %c_19, %c_19 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
      %c_20 = stablehlo.constant dense<0> : tensor<i32>
      %89 = stablehlo.broadcast_in_dim %82, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
      %90 = stablehlo.dynamic_update_slice %iterArg_14, %89, %iterArg_9, %c_20, %c_20 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
      %91 = stablehlo.add %iterArg_9, %c : tensor<i32>
      stablehlo.return %iterArg, %iterArg_7, %iterArg_8, %91, %80, %84, %86, %88, %90 : tensor<4x1x4xf32>, tensor<f32>, tensor<4x4xf32>, tensor<i32>, tensor<1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>
    }
    %14 = stablehlo.multiply %13#4, %13#4 : tensor<1x4xf32>
    %15 = stablehlo.reduce(%14 init: %cst) applies stablehlo.add across dimensions = [0, 1] : (tensor<1x4xf32>, tensor<f32>) -> tensor<f32>
    %16 = "stablehlo.all_reduce"(%15) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
    ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
      %70 = stablehlo.add %arg3, %arg4 : tensor<f32>
      stablehlo.return %70 : tensor<f32>
    }) : (tensor<f32>) -> tensor<f32>
    %17 = stablehlo.custom_call @Sharding(%6) {mhlo.sharding = "{manual}"} : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %18 = stablehlo.custom_call @SPMDShardToFullShape(%17) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<1x4xf32>) -> tensor<2x4xf32>
    %19 = stablehlo.custom_call @Sharding(%8) {mhlo.sharding = "{manual}"} : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %20 = stablehlo.custom_call @SPMDShardToFullShape(%19) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<1x4xf32>) -> tensor<2x4xf32>
    %21 = stablehlo.custom_call @Sharding(%1) {mhlo.sharding = "{manual}"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %22 = stablehlo.custom_call @SPMDShardToFullShape(%21) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<4x4xf32>) -> tensor<8x4xf32>
    %23 = stablehlo.custom_call @Sharding(%13#5) {mhlo.sharding = "{manual}"} : (tensor<4x1x4xf32>) -> tensor<4x1x4xf32>
    %24 = stablehlo.custom_call @SPMDShardToFullShape(%23) {mhlo.sharding = "{devices=[2,1,1]<=[2]}"} : (tensor<4x1x4xf32>) -> tensor<8x1x4xf32>
    %25 = stablehlo.custom_call @Sharding(%13#6) {mhlo.sharding = "{manual}"} : (tensor<4x1x4xf32>) -> tensor<4x1x4xf32>
    %26 = stablehlo.custom_call @SPMDShardToFullShape(%25) {mhlo.sharding = "{devices=[2,1,1]<=[2]}"} : (tensor<4x1x4xf32>) -> tensor<8x1x4xf32>
    %27 = stablehlo.custom_call @Sharding(%13#7) {mhlo.sharding = "{manual}"} : (tensor<4x1x4xf32>) -> tensor<4x1x4xf32>
    %28 = stablehlo.custom_call @SPMDShardToFullShape(%27) {mhlo.sharding = "{devices=[2,1,1]<=[2]}"} : (tensor<4x1x4xf32>) -> tensor<8x1x4xf32>
    %29 = stablehlo.custom_call @Sharding(%13#8) {mhlo.sharding = "{manual}"} : (tensor<4x1x4xf32>) -> tensor<4x1x4xf32>
    %30 = stablehlo.custom_call @SPMDShardToFullShape(%29) {mhlo.sharding = "{devices=[2,1,1]<=[2]}"} : (tensor<4x1x4xf32>) -> tensor<8x1x4xf32>
    %31 = stablehlo.custom_call @Sharding(%13#4) {mhlo.sharding = "{manual}"} : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %32 = stablehlo.custom_call @SPMDShardToFullShape(%31) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<1x4xf32>) -> tensor<2x4xf32>
    %33 = stablehlo.custom_call @Sharding(%16) {mhlo.sharding = "{manual}"} : (tensor<f32>) -> tensor<f32>
    %34 = stablehlo.custom_call @SPMDShardToFullShape(%33) {mhlo.sharding = "{replicated}"} : (tensor<f32>) -> tensor<f32>
    %35 = stablehlo.custom_call @Sharding(%arg2) {mhlo.sharding = "{replicated}"} : (tensor<f32>) -> tensor<f32>
    %36 = stablehlo.custom_call @SPMDFullToShardShape(%35) {mhlo.sharding = "{manual}"} : (tensor<f32>) -> tensor<f32>
    %37 = stablehlo.custom_call @Sharding(%18) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %38 = stablehlo.custom_call @SPMDFullToShardShape(%37) {mhlo.sharding = "{manual}"} : (tensor<2x4xf32>) -> tensor<1x4xf32>
    %39 = stablehlo.custom_call @Sharding(%20) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %40 = stablehlo.custom_call @SPMDFullToShardShape(%39) {mhlo.sharding = "{manual}"} : (tensor<2x4xf32>) -> tensor<1x4xf32>
    %41 = stablehlo.custom_call @Sharding(%22) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<8x4xf32>) -> tensor<8x4xf32>
    %42 = stablehlo.custom_call @SPMDFullToShardShape(%41) {mhlo.sharding = "{manual}"} : (tensor<8x4xf32>) -> tensor<4x4xf32>
    %43 = stablehlo.custom_call @Sharding(%24) {mhlo.sharding = "{devices=[2,1,1]<=[2]}"} : (tensor<8x1x4xf32>) -> tensor<8x1x4xf32>
    %44 = stablehlo.custom_call @SPMDFullToShardShape(%43) {mhlo.sharding = "{manual}"} : (tensor<8x1x4xf32>) -> tensor<4x1x4xf32>
    %45 = stablehlo.custom_call @Sharding(%26) {mhlo.sharding = "{devices=[2,1,1]<=[2]}"} : (tensor<8x1x4xf32>) -> tensor<8x1x4xf32>
    %46 = stablehlo.custom_call @SPMDFullToShardShape(%45) {mhlo.sharding = "{manual}"} : (tensor<8x1x4xf32>) -> tensor<4x1x4xf32>
    %47 = stablehlo.custom_call @Sharding(%28) {mhlo.sharding = "{devices=[2,1,1]<=[2]}"} : (tensor<8x1x4xf32>) -> tensor<8x1x4xf32>
    %48 = stablehlo.custom_call @SPMDFullToShardShape(%47) {mhlo.sharding = "{manual}"} : (tensor<8x1x4xf32>) -> tensor<4x1x4xf32>
    %49 = stablehlo.custom_call @Sharding(%30) {mhlo.sharding = "{devices=[2,1,1]<=[2]}"} : (tensor<8x1x4xf32>) -> tensor<8x1x4xf32>
    %50 = stablehlo.custom_call @SPMDFullToShardShape(%49) {mhlo.sharding = "{manual}"} : (tensor<8x1x4xf32>) -> tensor<4x1x4xf32>
    %51 = stablehlo.custom_call @Sharding(%32) {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %52 = stablehlo.custom_call @SPMDFullToShardShape(%51) {mhlo.sharding = "{manual}"} : (tensor<2x4xf32>) -> tensor<1x4xf32>
    %c_3 = stablehlo.constant dense<1> : tensor<i32>
    %c_4 = stablehlo.constant dense<4> : tensor<i32>
    %c_5 = stablehlo.constant dense<0> : tensor<i32>
    %cst_6 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %53 = stablehlo.broadcast_in_dim %36, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
    %54 = stablehlo.multiply %52, %53 : tensor<1x4xf32>
    %55 = stablehlo.multiply %53, %52 : tensor<1x4xf32>
    %56 = stablehlo.add %54, %55 : tensor<1x4xf32>
    %57 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
    %58 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<4x1x4xf32>
    %59:9 = stablehlo.while(%iterArg = %44, %iterArg_7 = %46, %iterArg_8 = %48, %iterArg_9 = %50, %iterArg_10 = %42, %iterArg_11 = %c_5, %iterArg_12 = %57, %iterArg_13 = %56, %iterArg_14 = %58) : tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<4x4xf32>, tensor<1x4xf32>, tensor<4x1x4xf32>
    cond {
      %70 = stablehlo.compare LT, %iterArg_11, %c_4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %70 : tensor<i1>
    } do {
      %70 = stablehlo.subtract %c_4, %iterArg_11 : tensor<i32>
      %71 = stablehlo.subtract %70, %c_3 : tensor<i32>
      %c_15 = stablehlo.constant dense<0> : tensor<i32>
      %72 = stablehlo.dynamic_slice %iterArg, %71, %c_15, %c_15, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
      %73 = stablehlo.reshape %72 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
      %c_16 = stablehlo.constant dense<0> : tensor<i32>
      %74 = stablehlo.dynamic_slice %iterArg_7, %71, %c_16, %c_16, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
      %75 = stablehlo.reshape %74 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
      %c_17 = stablehlo.constant dense<0> : tensor<i32>
      %76 = stablehlo.dynamic_slice %iterArg_8, %71, %c_17, %c_17, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
      %77 = stablehlo.reshape %76 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
      %c_18 = stablehlo.constant dense<0> : tensor<i32>
      %78 = stablehlo.dynamic_slice %iterArg_9, %71, %c_18, %c_18, sizes = [1, 1, 4] : (tensor<4x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x4xf32>
      %79 = stablehlo.reshape %78 : (tensor<1x1x4xf32>) -> tensor<1x4xf32>
      %cst_19 = stablehlo.constant dense<2.000000e+00> : tensor<f32>
      %80 = stablehlo.multiply %iterArg_13, %79 : tensor<1x4xf32>
      %81 = stablehlo.multiply %80, %77 : tensor<1x4xf32>
      %82 = stablehlo.add %80, %81 : tensor<1x4xf32>
      %83 = "stablehlo.all_reduce"(%82) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
      ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
        %96 = stablehlo.add %arg3, %arg4 : tensor<f32>
        stablehlo.return %96 : tensor<f32>
      }) : (tensor<1x4xf32>) -> tensor<1x4xf32>
      %84 = stablehlo.broadcast_in_dim %cst_19, dims = [] : (tensor<f32>) -> tensor<1x4xf32>
      %85 = stablehlo.divide %83, %84 : tensor<1x4xf32>
      %86 = stablehlo.multiply %85, %75 : tensor<1x4xf32>
      %87 = stablehlo.dot_general %82, %73, contracting_dims = [0] x [0] : (tensor<1x4xf32>, tensor<1x4xf32>) -> tensor<4x4xf32>
      %88 = stablehlo.transpose %87, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %89 = stablehlo.dot_general %82, %iterArg_10, contracting_dims = [1] x [1] : (tensor<1x4xf32>, tensor<4x4xf32>) -> tensor<1x4xf32>
      %90 = stablehlo.add %86, %89 : tensor<1x4xf32>
      %91 = "stablehlo.all_reduce"(%88) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids}> ({
      ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
        %96 = stablehlo.add %arg3, %arg4 : tensor<f32>
        stablehlo.return %96 : tensor<f32>
      }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %92 = stablehlo.add %iterArg_12, %91 : tensor<4x4xf32>
      %c_20 = stablehlo.constant dense<0> : tensor<i32>
      %93 = stablehlo.broadcast_in_dim %82, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
      %94 = stablehlo.dynamic_update_slice %iterArg_14, %93, %71, %c_20, %c_20 : (tensor<4x1x4xf32>, tensor<1x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4x1x4xf32>
      %95 = stablehlo.add %iterArg_11, %c_3 : tensor<i32>
      stablehlo.return %iterArg, %iterArg_7, %iterArg_8, %iterArg_9, %iterArg_10, %95, %92, %90, %94 : tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x1x4xf32>, tensor<4x4xf32>, tensor<i32>, tensor<4x4xf32>, tensor<1x4xf32>, tensor<4x1x4xf32>
    }
    %60 = stablehlo.multiply %59#7, %40 : tensor<1x4xf32>
    %61 = stablehlo.multiply %60, %38 : tensor<1x4xf32>
    %62 = stablehlo.add %60, %61 : tensor<1x4xf32>
    %63 = stablehlo.broadcast_in_dim %62, dims = [1, 2] : (tensor<1x4xf32>) -> tensor<1x1x4xf32>
    %64 = stablehlo.pad %63, %cst_6, low = [0, 0, 0], high = [3, 0, 0], interior = [0, 0, 0] : (tensor<1x1x4xf32>, tensor<f32>) -> tensor<4x1x4xf32>
    %65 = stablehlo.add %59#8, %64 : tensor<4x1x4xf32>
    %66 = stablehlo.custom_call @Sharding(%59#6) {mhlo.sharding = "{manual}"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %67 = stablehlo.custom_call @SPMDShardToFullShape(%66) {mhlo.sharding = "{replicated}"} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %68 = stablehlo.custom_call @Sharding(%65) {mhlo.sharding = "{manual}"} : (tensor<4x1x4xf32>) -> tensor<4x1x4xf32>
    %69 = stablehlo.custom_call @SPMDShardToFullShape(%68) {mhlo.sharding = "{devices=[1,2,1]<=[2]}"} : (tensor<4x1x4xf32>) -> tensor<4x2x4xf32>
    return %34, %67, %69 : tensor<f32>, tensor<4x4xf32>, tensor<4x2x4xf32>
  }
}
