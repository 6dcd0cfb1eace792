// RUN: remat-opt %s --outline-loop-backwards | filecheck %s
// RUN: remat-opt %s --remat='policy=nothing_saveable' 2>&1 | filecheck --check-prefix=REMAT %s
// RUN: not remat-opt %s --remat='policy=nothing_saveable mode=split' 2>&1 | filecheck --check-prefix=SPLIT %s

// A conditional step: jax.grad inside a branch of lax.cond. The backward (ops under a
// transpose( frame) runs inside that branch of the case, the function's own top level has
// none. The branch becomes a private function whose arguments are the values it reads from
// outside (a branch has no block arguments); the branch calls it. The other branch, with no
// backward, stays as it is.
// CHECK-LABEL: func.func @main
// CHECK: "stablehlo.case"
// CHECK-NEXT: %[[R:.*]] = func.call @main_cond0(%arg1, %arg0)
// CHECK-NEXT: stablehlo.return %[[R]]
// CHECK: }, {
// CHECK-NEXT: stablehlo.return %arg0
// CHECK: func.func private @main_cond0(%[[X:.*]]: tensor<4xf32>, %[[W:.*]]: tensor<4xf32>)
// CHECK: stablehlo.constant dense<1.000000e+00>
// CHECK: stablehlo.tanh
// CHECK: return

// The remat pipeline runs on the branch and inlines it back: under nothing_saveable the
// backward recomputes tanh behind an optimization barrier, inside the branch.
// REMAT: remark: @main runs its backward pass inside a cond branch: the policy applies to the branch's forward and backward
// REMAT-LABEL: func.func @main
// REMAT: "stablehlo.case"
// REMAT: stablehlo.optimization_barrier
// REMAT: stablehlo.tanh
// REMAT: stablehlo.return
// REMAT-NOT: func.call
// REMAT-NOT: main_cond0

// SPLIT: error: @main runs its backward pass inside a cond branch (jax.grad inside lax.cond or lax.switch): it cannot be split into a forward and a backward program; use mode='joint'
func.func @main(%w: tensor<4xf32>, %x: tensor<4xf32>, %which: tensor<i32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %r = "stablehlo.case"(%which) ({
    %a = stablehlo.multiply %x, %w : tensor<4xf32> loc("jit(f)/cond/branch_1_fun/jvp(loss)/mul")
    %t = stablehlo.tanh %a : tensor<4xf32> loc("jit(f)/cond/branch_1_fun/jvp(loss)/tanh")
    %t2 = stablehlo.multiply %t, %t : tensor<4xf32> loc("jit(f)/cond/branch_1_fun/transpose(jvp(loss))/mul")
    %d = stablehlo.subtract %one, %t2 : tensor<4xf32> loc("jit(f)/cond/branch_1_fun/transpose(jvp(loss))/sub")
    %g = stablehlo.multiply %d, %x : tensor<4xf32> loc("jit(f)/cond/branch_1_fun/transpose(jvp(loss))/mul")
    %w2 = stablehlo.subtract %w, %g : tensor<4xf32> loc("jit(f)/cond/branch_1_fun/sub")
    stablehlo.return %w2 : tensor<4xf32>
  }, {
    stablehlo.return %w : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %r : tensor<4xf32>
}
