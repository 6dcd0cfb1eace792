// RUN: remat-opt %s --outline-loop-backwards | filecheck %s
// RUN: remat-opt %s --remat='policy=nothing_saveable' 2>&1 | filecheck --check-prefix=REMAT %s
// RUN: not remat-opt %s --remat='policy=nothing_saveable mode=split' 2>&1 | filecheck --check-prefix=SPLIT %s

// Gradient accumulation: the backward (ops under a transpose( frame) runs inside the loop
// body, the function's own top level has none. The body becomes a private function whose
// arguments are the carries, then the values it reads from outside the loop (the constant
// is copied in); the body calls it.
// CHECK-LABEL: func.func @main
// CHECK: stablehlo.while
// CHECK: do {
// CHECK-NEXT: %[[R:.*]]:3 = func.call @main_loop0(%{{.*}}, %{{.*}}, %{{.*}}, %arg1)
// CHECK-NEXT: stablehlo.return %[[R]]#0, %[[R]]#1, %[[R]]#2
// CHECK: func.func private @main_loop0(%[[I:.*]]: tensor<i32>, %[[ACC:.*]]: tensor<4xf32>, %[[W:.*]]: tensor<4xf32>, %[[XS:.*]]: tensor<3x4xf32>)
// CHECK: stablehlo.constant dense<1.000000e+00>
// CHECK: stablehlo.dynamic_slice %[[XS]], %[[I]]
// CHECK: stablehlo.tanh
// CHECK: return

// The remat pipeline runs on the body and inlines it back: under nothing_saveable the
// backward recomputes tanh behind an optimization barrier, inside the loop.
// REMAT: remark: @main runs its backward pass inside a loop body (gradient accumulation)
// REMAT-LABEL: func.func @main
// REMAT: stablehlo.while
// REMAT: do {
// REMAT: stablehlo.optimization_barrier
// REMAT: stablehlo.tanh
// REMAT: stablehlo.return
// REMAT-NOT: func.call
// REMAT-NOT: main_loop0

// SPLIT: error: @main runs its backward pass inside a loop body (gradient accumulation: jax.grad inside lax.scan or fori_loop): it cannot be split into a forward and a backward program; use mode='joint'
func.func @main(%w: tensor<4xf32>, %xs: tensor<3x4xf32>) -> tensor<4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c3 = stablehlo.constant dense<3> : tensor<i32>
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<4xf32>
  %r:3 = stablehlo.while(%i = %c0, %acc = %zero, %wc = %w) : tensor<i32>, tensor<4xf32>, tensor<4xf32>
    cond {
      %lt = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %ds = stablehlo.dynamic_slice %xs, %i, %c0, sizes = [1, 4] : (tensor<3x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %x = stablehlo.reshape %ds : (tensor<1x4xf32>) -> tensor<4xf32>
      %a = stablehlo.multiply %x, %wc : tensor<4xf32> loc("jit(f)/while/body/jvp(loss)/mul")
      %t = stablehlo.tanh %a : tensor<4xf32> loc("jit(f)/while/body/jvp(loss)/tanh")
      %t2 = stablehlo.multiply %t, %t : tensor<4xf32> loc("jit(f)/while/body/transpose(jvp(loss))/mul")
      %d = stablehlo.subtract %one, %t2 : tensor<4xf32> loc("jit(f)/while/body/transpose(jvp(loss))/sub")
      %g = stablehlo.multiply %d, %x : tensor<4xf32> loc("jit(f)/while/body/transpose(jvp(loss))/mul")
      %acc2 = stablehlo.add %acc, %g : tensor<4xf32> loc("jit(f)/while/body/add")
      %i2 = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %i2, %acc2, %wc : tensor<i32>, tensor<4xf32>, tensor<4xf32>
    }
  return %r#1 : tensor<4xf32>
}
