// shard_map (sdy.manual_computation) pairs: the policy applies to the forward body's ops,
// as jax.checkpoint applies it inside a shard_map. What the backward manual computation
// reads is recomputed by a recompute manual computation behind the barrier, collectives
// included (every device runs the same program, so they run again in lockstep); the
// forward one keeps its primal output and the values the policy saves. Under
// nothing_saveable the residuals are the sharded inputs, not the gathered weights:
// FSDP's memory saving. Under dots_saveable the two dots inside stay residuals of the
// forward computation, sharded over "data" (the axis they vary over), as JAX saves them.
// Input: export_vjp of an FSDP loss (all_gather of W over "data", psum of the loss) on a
// 4x2 mesh of host devices, jax 0.10.2 with Shardy.
//
// RUN: remat-opt %s --remat='policy=nothing_saveable' | filecheck %s
// RUN: remat-opt %s --print-saved-residuals --remat='policy=nothing_saveable' | filecheck %s --check-prefix=RES
// RUN: remat-opt %s --remat='policy=dots_saveable' | filecheck %s --check-prefix=DOTS
// RUN: remat-opt %s --print-saved-residuals --remat='policy=dots_saveable' | filecheck %s --check-prefix=DOTS-RES
//
// auto plans the body op by op: at budget 0 it gives nothing_saveable's module; at 512 B (two
// of the body's 2x8 values, every device's copy: 8x8) it keeps the first dot and the tanh of
// the second (the same bytes as dots_saveable, and the tanh is not recomputed).
// RUN: remat-opt %s --remat='policy=auto(budget=0)' | filecheck %s
// RUN: remat-opt %s --print-saved-residuals --remat='policy=auto(budget=0)' | filecheck %s --check-prefix=AUTO0-RES
// RUN: remat-opt %s --remat='policy=auto(budget=512)' | filecheck %s --check-prefix=AUTO
// RUN: remat-opt %s --print-saved-residuals --remat='policy=auto(budget=512)' | filecheck %s --check-prefix=AUTO-RES
// (A JAX module without locations: the saved-residuals reports end with the remark
// that says the backward is found by the cotangent marks alone.)

// The forward computation keeps only the loss (its all_gather and psum stay); the
// recompute one gathers W again and returns what the backward one reads.
// CHECK-LABEL: func.func public @main
// CHECK: %[[F:.*]] = sdy.manual_computation(%arg0, %arg1) {{.*}} out_shardings=[<@mesh, []>]
// CHECK: stablehlo.all_gather
// CHECK: stablehlo.all_reduce
// CHECK: sdy.return %{{[0-9]+}} : tensor<f32>
// CHECK: %[[B:.*]]:3 = stablehlo.optimization_barrier %arg0, %arg1, %arg2
// CHECK: %[[R:.*]]:6 = sdy.manual_computation(%[[B]]#0, %[[B]]#1)
// CHECK: stablehlo.all_gather
// CHECK-NOT: stablehlo.all_reduce
// CHECK: sdy.return
// CHECK: sdy.manual_computation(%arg2, %[[R]]#0, %arg1, %[[R]]#1
// CHECK: stablehlo.reduce_scatter

// RES: // saved residuals of @main: 2 values, 512 bytes
// RES-NEXT: f32[8,8] from the argument arg0
// RES-NEXT: f32[8,8] from the argument arg1
// RES-NEXT: // remark: @main: no op carries JAX's name stack{{.*}}
// RES-NOT: {{.}}

// DOTS-LABEL: func.func public @main
// DOTS: %[[F:.*]]:3 = sdy.manual_computation(%arg0, %arg1) {{.*}} out_shardings=[<@mesh, []>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>]
// DOTS: %[[D1:.*]] = stablehlo.dot_general
// DOTS: %[[D2:.*]] = stablehlo.dot_general
// DOTS: sdy.return %{{[0-9]+}}, %[[D1]], %[[D2]]
// DOTS-NEXT: } : (tensor<8x8xf32>, tensor<8x8xf32>) -> (tensor<f32>, tensor<8x8xf32>, tensor<8x8xf32>)
// DOTS: %[[B:.*]]:4 = stablehlo.optimization_barrier %arg0, %[[F]]#1, %[[F]]#2, %arg2
// DOTS: sdy.manual_computation(%[[B]]#0, %[[B]]#1, %[[B]]#2)
// DOTS-NOT: stablehlo.dot_general
// DOTS: sdy.return

// DOTS-RES: // saved residuals of @main: 4 values, 1024 bytes
// DOTS-RES-NEXT: f32[8,8] from the argument arg0
// DOTS-RES-NEXT: f32[8,8] from the argument arg1
// DOTS-RES-NEXT: f32[8,8] output of manual_computation from line {{[0-9]+}}
// DOTS-RES-NEXT: f32[8,8] output of manual_computation from line {{[0-9]+}}
// DOTS-RES-NEXT: // remark: @main: no op carries JAX's name stack{{.*}}
// DOTS-RES-NOT: {{.}}

// AUTO0-RES: // saved residuals of @main: 2 values, 512 bytes
// AUTO0-RES-NEXT: f32[8,8] from the argument arg0
// AUTO0-RES-NEXT: f32[8,8] from the argument arg1
// AUTO0-RES-NEXT: // remark: auto(budget=0): budget 0 B of activations (minimum 0 B, no remat 3072 B); plan keeps 0 B of activations
// AUTO0-RES-NEXT: // remark: auto recomputes f32[2,8] output of dot_general from line {{[0-9]+}} in the body of the shard_map at line {{[0-9]+}}

// AUTO-LABEL: func.func public @main
// AUTO: %[[F:.*]]:3 = sdy.manual_computation(%arg0, %arg1) {{.*}} out_shardings=[<@mesh, []>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>]
// AUTO: %[[D1:.*]] = stablehlo.dot_general
// AUTO: %[[D2:.*]] = stablehlo.dot_general
// AUTO: %[[T:.*]] = stablehlo.tanh %[[D2]]
// AUTO: sdy.return %{{[0-9]+}}, %[[D1]], %[[T]]
// AUTO: sdy.manual_computation(%[[B:.*]]#0, %[[B]]#1, %[[B]]#2)
// AUTO-NOT: stablehlo.dot_general
// AUTO-NOT: stablehlo.tanh
// AUTO: sdy.return

// AUTO-RES: // saved residuals of @main: 4 values, 1024 bytes
// AUTO-RES-NEXT: f32[8,8] from the argument arg0
// AUTO-RES-NEXT: f32[8,8] from the argument arg1
// AUTO-RES-NEXT: f32[8,8] output of manual_computation from line {{[0-9]+}}
// AUTO-RES-NEXT: f32[8,8] output of manual_computation from line {{[0-9]+}}
// AUTO-RES-NEXT: // remark: auto(budget=512): budget 512 B of activations (minimum 0 B, no remat 3072 B); plan keeps 512 B

module @jit_loss attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["data"=4, "model"=2]> {stablehlo.mesh = {axes = [{name = "data", size = 4 : i64}, {name = "model", size = 2 : i64}]}}
  sdy.mesh @empty_mesh = <[]> {stablehlo.mesh = {axes = []}}
  func.func public @main(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %arg1: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}, %arg2: tensor<f32> {remat.cotangent, sdy.sharding = #sdy.sharding<@empty_mesh, []>}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<8x8xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<8x8xf32> {jax.result_info = "result[1][1]", remat.gradient}) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0:7 = sdy.manual_computation(%arg0, %arg1) in_shardings=[<@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>] out_shardings=[<@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, []>] manual_axes={"data", "model"} (%arg3: tensor<2x8xf32>, %arg4: tensor<2x8xf32>) {
      %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
      %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
      %3 = "stablehlo.all_gather"(%arg3) <{all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x8xf32>) -> tensor<8x8xf32>
      %4 = stablehlo.dot_general %arg4, %3, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
      %5 = stablehlo.sine %4 : tensor<2x8xf32>
      %6 = stablehlo.cosine %4 : tensor<2x8xf32>
      %7 = stablehlo.transpose %3, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %8 = stablehlo.dot_general %5, %7, contracting_dims = [1] x [0] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
      %9 = stablehlo.tanh %8 : tensor<2x8xf32>
      %10 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
      %11 = stablehlo.subtract %10, %9 : tensor<2x8xf32>
      %12 = stablehlo.reduce(%9 init: %cst_0) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x8xf32>, tensor<f32>) -> tensor<f32>
      %13 = "stablehlo.all_reduce"(%12) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
      ^bb0(%arg5: tensor<f32>, %arg6: tensor<f32>):
        %14 = stablehlo.add %arg5, %arg6 : tensor<f32>
        stablehlo.return %14 : tensor<f32>
      }) : (tensor<f32>) -> tensor<f32>
      sdy.return %3, %6, %7, %5, %9, %11, %13 : tensor<8x8xf32>, tensor<2x8xf32>, tensor<8x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<f32>
    } : (tensor<8x8xf32>, tensor<8x8xf32>) -> (tensor<32x8xf32>, tensor<8x8xf32>, tensor<32x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<f32>)
    %1 = stablehlo.reduce(%0#6 init: %cst) applies stablehlo.add across dimensions = [] : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %2:2 = sdy.manual_computation(%arg2, %0#0, %arg1, %0#1, %0#2, %0#3, %0#4, %0#5) in_shardings=[<@mesh, []>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>] out_shardings=[<@mesh, [{"data"}, {}]>, <@mesh, [{"data"}, {}]>] manual_axes={"data", "model"} (%arg3: tensor<f32>, %arg4: tensor<8x8xf32>, %arg5: tensor<2x8xf32>, %arg6: tensor<2x8xf32>, %arg7: tensor<8x8xf32>, %arg8: tensor<2x8xf32>, %arg9: tensor<2x8xf32>, %arg10: tensor<2x8xf32>) {
      %3 = stablehlo.broadcast_in_dim %arg3, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
      %4 = stablehlo.multiply %3, %arg10 : tensor<2x8xf32>
      %5 = stablehlo.multiply %4, %arg9 : tensor<2x8xf32>
      %6 = stablehlo.add %4, %5 : tensor<2x8xf32>
      %7 = stablehlo.dot_general %6, %arg8, contracting_dims = [0] x [0] : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<8x8xf32>
      %8 = stablehlo.transpose %7, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %9 = stablehlo.dot_general %6, %arg7, contracting_dims = [1] x [1] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
      %10 = stablehlo.transpose %8, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %11 = stablehlo.multiply %9, %arg6 : tensor<2x8xf32>
      %12 = stablehlo.dot_general %11, %arg5, contracting_dims = [0] x [0] : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<8x8xf32>
      %13 = stablehlo.transpose %12, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %14 = stablehlo.add %10, %13 : tensor<8x8xf32>
      %15 = stablehlo.dot_general %11, %arg4, contracting_dims = [1] x [1] : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
      %16 = "stablehlo.reduce_scatter"(%14) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, scatter_dimension = 0 : i64, use_global_device_ids}> ({
      ^bb0(%arg11: tensor<f32>, %arg12: tensor<f32>):
        %17 = stablehlo.add %arg11, %arg12 : tensor<f32>
        stablehlo.return %17 : tensor<f32>
      }) : (tensor<8x8xf32>) -> tensor<2x8xf32>
      sdy.return %16, %15 : tensor<2x8xf32>, tensor<2x8xf32>
    } : (tensor<f32>, tensor<32x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<32x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>) -> (tensor<8x8xf32>, tensor<8x8xf32>)
    return %1, %2#0, %2#1 : tensor<f32>, tensor<8x8xf32>, tensor<8x8xf32>
  }
}

