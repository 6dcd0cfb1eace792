// RUN: remat-opt %s --remat-partial-eval='policy=save_only_these_names(act)' 2>/dev/null | filecheck %s
// RUN: remat-opt %s --print-saved-residuals --remat-partial-eval='policy=save_only_these_names(act)' 2>&1 | filecheck %s --check-prefix=RES

// A shard_map inside a scanned layer (regions/manual_nested.py): export_vjp of
// lax.scan(layer, x, ws)[0] on a mesh of 2 devices, where layer runs
// shard_map(lambda h, w: sin(checkpoint_name(tanh(h @ w), "act"))) (private calls
// inlined). The per-iteration policy recomputes the manual computation of the forward
// body, so the body value the policy saves (the named tanh) becomes a new result of it,
// laid out as a shard_map residual (first dimension over "d"), and the forward loop
// stacks it; the backward body's recomputation of the manual computation takes it back
// as an operand, and its sine and cosine read it there instead of computing it.
// CHECK-LABEL: func.func public @main
// CHECK: stablehlo.while
// CHECK: sdy.manual_computation({{.*}}) in_shardings={{.*}} out_shardings=[<@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>]
// CHECK: %[[ACT:.*]] = stablehlo.custom_call @remat.name
// CHECK: sdy.return {{.*}}, %[[ACT]] :
// CHECK: stablehlo.while
// CHECK: sdy.manual_computation(%{{[^,]*}}, %{{[^,]*}}, %{{[^)]*}}) in_shardings=[<@mesh, [{"d"}, {}]>, <@mesh, [{}, {}]>, <@mesh, [{"d"}, {}]>] out_shardings={{.*}} manual_axes={"d"} (%{{[^:]*}}: tensor<2x4xf32>, %{{[^:]*}}: tensor<4x4xf32>, %[[ARG:[^:]*]]: tensor<2x4xf32>)
// CHECK-NOT: remat.name
// CHECK: stablehlo.sine %[[ARG]]
// CHECK-NEXT: stablehlo.cosine %[[ARG]]

// The residuals: the carry-ins, and the named value stacked per iteration, as
// jax.checkpoint of the layer inside the scan keeps them.
// RES: // saved residuals of @main: 3 values, 576 bytes
// RES-NEXT: f32[3,4,4] from the argument arg1
// RES-NEXT: f32[3,4,4] the carry-in of each iteration, stacked by the scan loop
// RES-NEXT: f32[3,4,4] output of manual_computation from line {{[0-9]+}} of each iteration, stacked by the scan loop
module @jit_f attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["d"=2]> {stablehlo.mesh = {axes = [{name = "d", size = 2 : i64}]}}
  sdy.mesh @mesh_0 = <["d"=2]> {stablehlo.mesh = {axes = [{name = "d", size = 2 : i64}]}}
  func.func public @main(%arg0: tensor<4x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"d"}, {}]>}, %arg1: tensor<3x4x4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {}, {}]>}, %arg2: tensor<4x4xf32> {remat.cotangent}) -> (tensor<4x4xf32> {jax.result_info = "result[0]"}, tensor<4x4xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<3x4x4xf32> {jax.result_info = "result[1][1]", remat.gradient}) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<3> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x8x4xf32>
    %1 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x4x4xf32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x4x4xf32>
    %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x4x4xf32>
    %4:7 = stablehlo.while(%iterArg = %arg1, %iterArg_2 = %c_1, %iterArg_3 = %arg0, %iterArg_4 = %0, %iterArg_5 = %1, %iterArg_6 = %2, %iterArg_7 = %3) : tensor<3x4x4xf32>, tensor<i32>, tensor<4x4xf32>, tensor<3x8x4xf32>, tensor<3x4x4xf32>, tensor<3x4x4xf32>, tensor<3x4x4xf32>
    cond {
      %7 = stablehlo.compare LT, %iterArg_2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %7 : tensor<i1>
    } do {
      %c_8 = stablehlo.constant dense<0> : tensor<i32>
      %7 = stablehlo.dynamic_slice %iterArg, %iterArg_2, %c_8, %c_8, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %8 = stablehlo.reshape %7 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %9:4 = sdy.manual_computation(%iterArg_3, %8) in_shardings=[<@mesh, [{"d"}, {}]>, <@mesh, [{}, {}]>] out_shardings=[<@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>] manual_axes={"d"} (%arg3: tensor<2x4xf32>, %arg4: tensor<4x4xf32>) {
        %cst_13 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
        %19 = stablehlo.dot_general %arg3, %arg4, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
        %20 = stablehlo.tanh %19 : tensor<2x4xf32>
        %21 = stablehlo.broadcast_in_dim %cst_13, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
        %22 = stablehlo.add %21, %20 : tensor<2x4xf32>
        %23 = stablehlo.broadcast_in_dim %cst_13, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
        %24 = stablehlo.subtract %23, %20 : tensor<2x4xf32>
        %25 = stablehlo.multiply %22, %24 : tensor<2x4xf32>
        %26 = stablehlo.custom_call @remat.name(%20) {backend_config = "act"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
        %27 = stablehlo.sine %26 : tensor<2x4xf32>
        %28 = stablehlo.cosine %26 : tensor<2x4xf32>
        sdy.return %27, %arg4, %25, %28 : tensor<2x4xf32>, tensor<4x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
      } : (tensor<4x4xf32>, tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>)
      %c_9 = stablehlo.constant dense<0> : tensor<i32>
      %10 = stablehlo.broadcast_in_dim %9#1, dims = [1, 2] : (tensor<8x4xf32>) -> tensor<1x8x4xf32>
      %11 = stablehlo.dynamic_update_slice %iterArg_4, %10, %iterArg_2, %c_9, %c_9 : (tensor<3x8x4xf32>, tensor<1x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x8x4xf32>
      %c_10 = stablehlo.constant dense<0> : tensor<i32>
      %12 = stablehlo.broadcast_in_dim %iterArg_3, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
      %13 = stablehlo.dynamic_update_slice %iterArg_5, %12, %iterArg_2, %c_10, %c_10 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32>
      %c_11 = stablehlo.constant dense<0> : tensor<i32>
      %14 = stablehlo.broadcast_in_dim %9#2, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
      %15 = stablehlo.dynamic_update_slice %iterArg_6, %14, %iterArg_2, %c_11, %c_11 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32>
      %c_12 = stablehlo.constant dense<0> : tensor<i32>
      %16 = stablehlo.broadcast_in_dim %9#3, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
      %17 = stablehlo.dynamic_update_slice %iterArg_7, %16, %iterArg_2, %c_12, %c_12 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32>
      %18 = stablehlo.add %iterArg_2, %c : tensor<i32>
      stablehlo.return %iterArg, %18, %9#0, %11, %13, %15, %17 : tensor<3x4x4xf32>, tensor<i32>, tensor<4x4xf32>, tensor<3x8x4xf32>, tensor<3x4x4xf32>, tensor<3x4x4xf32>, tensor<3x4x4xf32>
    }
    %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x4x4xf32>
    %6:7 = stablehlo.while(%iterArg = %4#3, %iterArg_2 = %4#4, %iterArg_3 = %4#5, %iterArg_4 = %4#6, %iterArg_5 = %c_1, %iterArg_6 = %arg2, %iterArg_7 = %5) : tensor<3x8x4xf32>, tensor<3x4x4xf32>, tensor<3x4x4xf32>, tensor<3x4x4xf32>, tensor<i32>, tensor<4x4xf32>, tensor<3x4x4xf32>
    cond {
      %7 = stablehlo.compare LT, %iterArg_5, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %7 : tensor<i1>
    } do {
      %7 = stablehlo.subtract %c_0, %iterArg_5 : tensor<i32>
      %8 = stablehlo.subtract %7, %c : tensor<i32>
      %c_8 = stablehlo.constant dense<0> : tensor<i32>
      %9 = stablehlo.dynamic_slice %iterArg, %8, %c_8, %c_8, sizes = [1, 8, 4] : (tensor<3x8x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x8x4xf32>
      %10 = stablehlo.reshape %9 : (tensor<1x8x4xf32>) -> tensor<8x4xf32>
      %c_9 = stablehlo.constant dense<0> : tensor<i32>
      %11 = stablehlo.dynamic_slice %iterArg_2, %8, %c_9, %c_9, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %12 = stablehlo.reshape %11 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %c_10 = stablehlo.constant dense<0> : tensor<i32>
      %13 = stablehlo.dynamic_slice %iterArg_3, %8, %c_10, %c_10, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %14 = stablehlo.reshape %13 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %c_11 = stablehlo.constant dense<0> : tensor<i32>
      %15 = stablehlo.dynamic_slice %iterArg_4, %8, %c_11, %c_11, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %16 = stablehlo.reshape %15 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %17:2 = sdy.manual_computation(%iterArg_6, %10, %12, %14, %16) in_shardings=[<@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>, <@mesh, [{"d"}, {}]>] out_shardings=[<@mesh, [{"d"}, {}]>, <@mesh, [{}, {}]>] manual_axes={"d"} (%arg3: tensor<2x4xf32>, %arg4: tensor<4x4xf32>, %arg5: tensor<2x4xf32>, %arg6: tensor<2x4xf32>, %arg7: tensor<2x4xf32>) {
        %21 = stablehlo.multiply %arg3, %arg7 : tensor<2x4xf32>
        %22 = stablehlo.multiply %21, %arg6 : tensor<2x4xf32>
        %23 = stablehlo.dot_general %22, %arg5, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
        %24 = stablehlo.transpose %23, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
        %25 = stablehlo.dot_general %22, %arg4, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
        %26 = "stablehlo.all_reduce"(%24) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "d">]>, use_global_device_ids}> ({
        ^bb0(%arg8: tensor<f32>, %arg9: tensor<f32>):
          %27 = stablehlo.add %arg8, %arg9 : tensor<f32>
          stablehlo.return %27 : tensor<f32>
        }) : (tensor<4x4xf32>) -> tensor<4x4xf32>
        sdy.return %25, %26 : tensor<2x4xf32>, tensor<4x4xf32>
      } : (tensor<4x4xf32>, tensor<8x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
      %c_12 = stablehlo.constant dense<0> : tensor<i32>
      %18 = stablehlo.broadcast_in_dim %17#1, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
      %19 = stablehlo.dynamic_update_slice %iterArg_7, %18, %8, %c_12, %c_12 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32>
      %20 = stablehlo.add %iterArg_5, %c : tensor<i32>
      stablehlo.return %iterArg, %iterArg_2, %iterArg_3, %iterArg_4, %20, %17#0, %19 : tensor<3x8x4xf32>, tensor<3x4x4xf32>, tensor<3x4x4xf32>, tensor<3x4x4xf32>, tensor<i32>, tensor<4x4xf32>, tensor<3x4x4xf32>
    }
    return %4#2, %6#5, %6#6 : tensor<4x4xf32>, tensor<4x4xf32>, tensor<3x4x4xf32>
  }
}
