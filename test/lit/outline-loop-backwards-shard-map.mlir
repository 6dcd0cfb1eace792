// RUN: remat-opt %s --outline-loop-backwards | filecheck %s
// RUN: remat-opt %s --remat='policy=nothing_saveable' 2>&1 | filecheck --check-prefix=REMAT %s
// RUN: not remat-opt %s --remat='policy=nothing_saveable mode=split' 2>&1 | filecheck --check-prefix=SPLIT %s

// Data parallelism: jax.grad inside jax.shard_map. Under Shardy the backward (ops under a
// transpose( frame) runs inside the body of the manual computation, on each device's
// shard; the function's own top level has none. The body becomes a private function whose
// arguments are the body's (the shards), then the values it reads from outside; the body
// calls it and returns what it returns with sdy.return.
// CHECK-LABEL: func.func @main
// CHECK: sdy.manual_computation(%arg0, %arg1)
// CHECK-NEXT: %[[R:.*]] = func.call @main_shard_map0(%{{.*}}, %{{.*}})
// CHECK-NEXT: sdy.return %[[R]]
// CHECK: func.func private @main_shard_map0(%[[W:.*]]: tensor<4xf32>, %[[X:.*]]: tensor<4xf32>)
// CHECK: stablehlo.tanh
// CHECK: stablehlo.all_reduce
// CHECK: return

// The remat pipeline runs on the body and inlines it back: under nothing_saveable the
// backward recomputes tanh behind an optimization barrier, inside the body.
// REMAT: remark: @main runs its backward pass inside a shard_map body (data parallelism): the policy applies to the body's forward and backward, on each device's shard
// REMAT-LABEL: func.func @main
// REMAT: sdy.manual_computation
// REMAT-NEXT: stablehlo.optimization_barrier
// REMAT: stablehlo.tanh
// REMAT: stablehlo.all_reduce
// REMAT: sdy.return
// REMAT-NOT: func.call
// REMAT-NOT: main_shard_map0

// SPLIT: error: @main runs its backward pass inside a shard_map body (data parallelism: jax.grad inside jax.shard_map): it cannot be split into a forward and a backward program; use mode='joint', which rematerializes inside the body, on each device
module @jit_step attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["d"=2]>
  func.func @main(%w: tensor<4xf32>, %xs: tensor<8xf32>) -> tensor<4xf32> {
    %r = sdy.manual_computation(%w, %xs) in_shardings=[<@mesh, [{}]>, <@mesh, [{"d"}]>] out_shardings=[<@mesh, [{}]>] manual_axes={"d"} (%wl: tensor<4xf32>, %x: tensor<4xf32>) {
      %one = stablehlo.constant dense<1.0> : tensor<4xf32>
      %a = stablehlo.multiply %x, %wl : tensor<4xf32> loc("jit(step)/shard_map/jvp(loss)/mul")
      %t = stablehlo.tanh %a : tensor<4xf32> loc("jit(step)/shard_map/jvp(loss)/tanh")
      %t2 = stablehlo.multiply %t, %t : tensor<4xf32> loc("jit(step)/shard_map/transpose(jvp(loss))/mul")
      %d = stablehlo.subtract %one, %t2 : tensor<4xf32> loc("jit(step)/shard_map/transpose(jvp(loss))/sub")
      %g = stablehlo.multiply %d, %x : tensor<4xf32> loc("jit(step)/shard_map/transpose(jvp(loss))/mul")
      %s = "stablehlo.all_reduce"(%g) ({
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %sum = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %sum : tensor<f32>
      }) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, use_global_device_ids} : (tensor<4xf32>) -> tensor<4xf32>
      sdy.return %s : tensor<4xf32>
    } : (tensor<4xf32>, tensor<8xf32>) -> tensor<4xf32>
    return %r : tensor<4xf32>
  }
}
