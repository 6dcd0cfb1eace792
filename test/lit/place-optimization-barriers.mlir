// RUN: remat-opt %s --place-optimization-barriers --split-input-file | filecheck %s

// The input is what remat-partial-eval leaves: recomputed ops carry
// remat.recompute = <group>, one group per backward op that needed them,
// placed right before it. Each group with inputs from outside gets one
// stablehlo.optimization_barrier right before it whose operands are those
// inputs followed by the incoming cotangent of the group's consumer; the group
// reads the barrier's results. Each module is named after its case.

// One group of two clones: the sine clone reads %x, the cosine clone reads
// the sine clone. The barrier carries %x and the backward value %g0 the
// consumer reads; only the outside input is replaced by a barrier result.
// CHECK-LABEL: module @one_group
// CHECK: %[[G0:.*]] = stablehlo.multiply %arg1, %{{.*}} : tensor<4xf32>
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %[[G0]] : tensor<4xf32>, tensor<4xf32>
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[B]]#0 {remat.recompute = 2 : i64}
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[S]] {remat.recompute = 2 : i64}
// CHECK-NEXT: %[[G1:.*]] = stablehlo.multiply %[[G0]], %[[C]]
// CHECK-NEXT: return
module @one_group {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %e = stablehlo.exponential %s : tensor<4xf32>
    %g0 = stablehlo.multiply %ct, %e : tensor<4xf32>
    %s2 = stablehlo.sine %x {remat.recompute = 2 : i64} : tensor<4xf32>
    %c2 = stablehlo.cosine %s2 {remat.recompute = 2 : i64} : tensor<4xf32>
    %g1 = stablehlo.multiply %g0, %c2 : tensor<4xf32>
    return %e, %g1 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// The consumer reads the cotangent argument itself: that is the barrier's
// last operand. The forward is untouched.
// CHECK-LABEL: module @cotangent_argument
// CHECK: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[D]] : tensor<4xf32>
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%[[D]], %arg2 : tensor<4xf32>, tensor<4xf32>
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[B]]#0 {remat.recompute = 1 : i64}
// CHECK-NEXT: stablehlo.multiply %arg2, %[[C]]
// CHECK-NEXT: return
module @cotangent_argument {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %c = stablehlo.cosine %d {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    return %s, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// Two groups: one barrier each, right before its own group. The second
// barrier carries the first consumer's result (the backward value the second
// consumer reads), so it cannot run before the first backward op; the second
// group reads a value of the first group, which goes through its barrier too.
// CHECK-LABEL: module @two_groups
// CHECK: %[[B1:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %arg1 :
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[B1]]#0 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[S]]
// CHECK-NEXT: %[[B2:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%[[S]], %[[G1]] :
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[B2]]#0 {remat.recompute = 2 : i64}
// CHECK-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[C]]
// CHECK-NEXT: return
module @two_groups {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %c = stablehlo.cosine %s : tensor<4xf32>
    %s2 = stablehlo.sine %x {remat.recompute = 1 : i64} : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %s2 : tensor<4xf32>
    %c2 = stablehlo.cosine %s2 {remat.recompute = 2 : i64} : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %c2 : tensor<4xf32>
    return %c, %g2 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// A group with several inputs: each appears once among the barrier's
// operands (in the order the group first reads them), then the cotangent;
// every read of an input in the group is replaced.
// CHECK-LABEL: module @several_inputs
// CHECK: %[[A:.*]] = stablehlo.sine %arg0
// CHECK-NEXT: %[[BB:.*]] = stablehlo.cosine %arg0
// CHECK-NEXT: %[[B:.*]]:3 = stablehlo.optimization_barrier {{[^%]*}}%[[A]], %[[BB]], %arg1 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
// CHECK-NEXT: %[[M:.*]] = stablehlo.multiply %[[B]]#0, %[[B]]#0 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[S:.*]] = stablehlo.add %[[M]], %[[B]]#1 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[T:.*]] = stablehlo.subtract %[[B]]#0, %[[B]]#1 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[U:.*]] = stablehlo.multiply %[[S]], %[[T]] {remat.recompute = 1 : i64}
// CHECK-NEXT: stablehlo.multiply %arg1, %[[U]]
// CHECK-NEXT: return
module @several_inputs {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %a = stablehlo.sine %x : tensor<4xf32>
    %b = stablehlo.cosine %x : tensor<4xf32>
    %m = stablehlo.multiply %a, %a {remat.recompute = 1 : i64} : tensor<4xf32>
    %s = stablehlo.add %m, %b {remat.recompute = 1 : i64} : tensor<4xf32>
    %t = stablehlo.subtract %a, %b {remat.recompute = 1 : i64} : tensor<4xf32>
    %u = stablehlo.multiply %s, %t {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %u : tensor<4xf32>
    return %a, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// No recomputed ops (everything saved): no barrier.
// CHECK-LABEL: module @no_clones
// CHECK-NOT: optimization_barrier
// CHECK: return
module @no_clones {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %c = stablehlo.cosine %x : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    return %s, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// A group of constants only reads nothing from outside: nothing to hide from
// CSE, no barrier.
// CHECK-LABEL: module @constants_only
// CHECK-NOT: optimization_barrier
// CHECK: %[[C:.*]] = stablehlo.constant {remat.recompute = 1 : i64} dense<2.000000e+00>
// CHECK-NEXT: %[[I:.*]] = stablehlo.iota dim = 0 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: stablehlo.add %[[G]], %[[I]]
// CHECK-NOT: optimization_barrier
// CHECK: return
module @constants_only {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %c = stablehlo.constant {remat.recompute = 1 : i64} dense<2.0> : tensor<4xf32>
    %i = stablehlo.iota dim = 0 {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    %g2 = stablehlo.add %g, %i : tensor<4xf32>
    return %s, %g2 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// A constant inside a group with other clones is not a barrier operand: the
// clone keeps reading it directly; only %x goes through the barrier.
// CHECK-LABEL: module @constant_in_group
// CHECK: %[[B:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %arg1 : tensor<4xf32>, tensor<4xf32>
// CHECK-NEXT: %[[C:.*]] = stablehlo.constant {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[M:.*]] = stablehlo.multiply %[[B]]#0, %[[C]] {remat.recompute = 1 : i64}
// CHECK-NEXT: stablehlo.multiply %arg1, %[[M]]
// CHECK-NEXT: return
module @constant_in_group {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %c = stablehlo.constant {remat.recompute = 1 : i64} dense<2.0> : tensor<4xf32>
    %m = stablehlo.multiply %x, %c {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %m : tensor<4xf32>
    return %s, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// The consumer reads a saved forward value before its backward operand: the
// barrier's extra operand is the backward value %g, not the forward one.
// CHECK-LABEL: module @consumer_reads_forward_first
// CHECK: %[[S:.*]] = stablehlo.sine %arg0
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[S]]
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %[[G]] :
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[B]]#0 {remat.recompute = 2 : i64}
// CHECK-NEXT: stablehlo.clamp %[[S]], %[[C]], %[[G]]
// CHECK-NEXT: return
module @consumer_reads_forward_first {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %g = stablehlo.multiply %ct, %s : tensor<4xf32>
    %c = stablehlo.cosine %x {remat.recompute = 2 : i64} : tensor<4xf32>
    %h = stablehlo.clamp %s, %c, %g : tensor<4xf32>
    return %s, %h : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// No remat.cotangent argument: the backward is found from JAX name stacks (as
// for a plain jax.value_and_grad export); the barrier carries the backward
// value the consumer reads (the broadcast seed under transpose(...)).
// CHECK-LABEL: module @name_stacks
// CHECK: %[[SEED:.*]] = stablehlo.broadcast_in_dim
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %[[SEED]] :
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[B]]#0 {remat.recompute = 1 : i64}
// CHECK-NEXT: stablehlo.multiply %[[SEED]], %[[C]]
// CHECK-NEXT: return
module @name_stacks {
  func.func @main(%x: tensor<4xf32>) -> (tensor<f32>, tensor<4xf32>) {
    %z = stablehlo.constant dense<0.0> : tensor<f32> loc("jit(f)/jvp()/reduce_sum")
    %s = stablehlo.sine %x : tensor<4xf32> loc("jit(f)/jvp()/sin")
    %r = stablehlo.reduce(%s init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32> loc("jit(f)/jvp()/reduce_sum")
    %one = stablehlo.constant dense<1.0> : tensor<f32> loc("jit(f)")
    %b = stablehlo.broadcast_in_dim %one, dims = [] : (tensor<f32>) -> tensor<4xf32> loc("jit(f)/transpose(jvp())/broadcast_in_dim")
    %c = stablehlo.cosine %x {remat.recompute = 1 : i64} : tensor<4xf32> loc("jit(f)/jvp()/sin")
    %g = stablehlo.multiply %b, %c : tensor<4xf32> loc("jit(f)/transpose(jvp())/mul")
    return %r, %g : tensor<f32>, tensor<4xf32>
  }
}

// -----

// Split form: the pass works on @main_bwd (residuals are its leading
// arguments, the cotangent its last); @main_fwd gets no barrier.
// CHECK-LABEL: module @split
// CHECK: func.func @main_fwd
// CHECK-NOT: optimization_barrier
// CHECK: func.func @main_bwd
// CHECK-NEXT: %[[B1:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %arg2 : tensor<4xf32>, tensor<4xf32>
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[B1]]#0 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg2, %[[C]]
// CHECK-NEXT: %[[B2:.*]]:3 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %arg1, %[[G]] :
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[B2]]#0 {remat.recompute = 2 : i64}
// CHECK-NEXT: %[[M:.*]] = stablehlo.multiply %[[S]], %[[B2]]#1 {remat.recompute = 2 : i64}
// CHECK-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G]], %[[M]]
// CHECK-NEXT: return %[[G2]]
module @split {
  func.func @main_fwd(%x: tensor<4xf32>, %w: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32> {remat.residual = "f32[4] output of mul"},
                                                                 tensor<4xf32> {remat.residual = "f32[4] from the argument w"}) {
    %d = stablehlo.multiply %x, %w : tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    return %s, %d, %w : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
  }
  func.func @main_bwd(%d: tensor<4xf32>, %w: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> tensor<4xf32> {
    %c = stablehlo.cosine %d {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    %s = stablehlo.sine %d {remat.recompute = 2 : i64} : tensor<4xf32>
    %m = stablehlo.multiply %s, %w {remat.recompute = 2 : i64} : tensor<4xf32>
    %g2 = stablehlo.multiply %g, %m : tensor<4xf32>
    return %g2 : tensor<4xf32>
  }
}
