// RUN: remat-opt %s --place-optimization-barriers --split-input-file | filecheck %s
// The scan loop pair, through remat-partial-eval first (its input is the raw export),
// with and without in-loops:
// RUN: sed -n '/^module @scan_pair/,/^}/p' %s | remat-opt --remat-partial-eval='policy=nothing_saveable' --place-optimization-barriers=in-loops=true | filecheck %s --check-prefix=LOOPS
// RUN: sed -n '/^module @scan_pair/,/^}/p' %s | remat-opt --remat-partial-eval='policy=nothing_saveable' --place-optimization-barriers | filecheck %s --check-prefix=NOLOOPS
// tie-to-cotangent (for XLA:CPU), on the @tie module:
// RUN: sed -n '/^module @tie/,/^}/p' %s | remat-opt --place-optimization-barriers=tie-to-cotangent=true | filecheck %s --check-prefix=TIE
// RUN: sed -n '/^module @tie/,/^}/p' %s | remat-opt --place-optimization-barriers=tie-to-cotangent=true --place-optimization-barriers=tie-to-cotangent=true | filecheck %s --check-prefix=TWICE
// RUN: sed -n '/^module @tie/,/^}/p' %s | remat-opt --place-optimization-barriers | filecheck %s --check-prefix=NOTIE
// RUN: sed -n '/^module @tie/,/^}/p' %s | remat-opt --place-optimization-barriers='groups=per-region function-region=true tie-to-cotangent=true' | filecheck %s --check-prefix=REGIONTIE
// RUN: sed -n '/^module @e8m0_tie/,/^}/p' %s | remat-opt --place-optimization-barriers=tie-to-cotangent=true | filecheck %s --check-prefix=E8M0
// RUN: sed -n '/^module @no_activation/,/^}/p' %s | remat-opt --place-optimization-barriers=tie-to-cotangent=true | filecheck %s --check-prefix=NOACT
// RUN: sed -n '/^module @no_activation/,/^}/p' %s | remat-opt --place-optimization-barriers='groups=per-region function-region=true tie-to-cotangent=true' | filecheck %s --check-prefix=NOACTREGION
// A clone of arguments alone that makes more than its smaller argument (an embedding) gets
// that argument tied, on @embedding:
// RUN: sed -n '/^module @embedding/,/^}/p' %s | remat-opt --place-optimization-barriers=tie-to-cotangent=true | filecheck %s --check-prefix=EMBED
// With tie-to-cotangent=true a clone that reads a hidden value reads the arguments beside it
// directly, on @weight_read (per use, twice, per region):
// RUN: sed -n '/^module @weight_read/,/^}/p' %s | remat-opt --place-optimization-barriers=tie-to-cotangent=true | filecheck %s --check-prefix=WARG
// RUN: sed -n '/^module @weight_read/,/^}/p' %s | remat-opt --place-optimization-barriers=tie-to-cotangent=true --place-optimization-barriers=tie-to-cotangent=true | filecheck %s --check-prefix=WARG
// RUN: sed -n '/^module @weight_read/,/^}/p' %s | remat-opt --place-optimization-barriers | filecheck %s --check-prefix=WARGNOTIE
// RUN: sed -n '/^module @weight_read/,/^}/p' %s | remat-opt --place-optimization-barriers='groups=per-region function-region=true tie-to-cotangent=true' | filecheck %s --check-prefix=WARGREGION
// Two levels of recomputation (remat.levels = 2, set by remat-partial-eval): the groups are
// tied although the forward keeps no activation, and a group reading arguments alone gets
// its smallest argument tied: the second sine must not merge with the first.
// RUN: sed -n '/^module @two_levels/,/^}/p' %s | remat-opt --place-optimization-barriers=tie-to-cotangent=true | filecheck %s --check-prefix=TWOLV
// groups=per-region (one barrier per checkpoint region, as jax.checkpoint), on @two_groups
// and @late_input:
// RUN: sed -n '/^module @two_groups/,/^}/p' %s | remat-opt --place-optimization-barriers=groups=per-region | filecheck %s --check-prefix=REGION
// RUN: sed -n '/^module @two_groups/,/^}/p' %s | remat-opt --place-optimization-barriers=groups=per-region --place-optimization-barriers=groups=per-region | filecheck %s --check-prefix=REGION
// RUN: sed -n '/^module @late_input/,/^}/p' %s | remat-opt --place-optimization-barriers=groups=per-region | filecheck %s --check-prefix=LATE
// fence-chains=true on @duplicated_chain: the backward's %g1 gets a barrier of its own.
// RUN: sed -n '/^module @duplicated_chain/,/^}/p' %s | remat-opt --place-optimization-barriers=fence-chains=true | filecheck %s --check-prefix=CHAIN
// RUN: sed -n '/^module @duplicated_chain/,/^}/p' %s | remat-opt --place-optimization-barriers=fence-chains=true --place-optimization-barriers=fence-chains=true | filecheck %s --check-prefix=CHAIN
// fence-producers=false on @fused_producer: only the group's barrier.
// RUN: sed -n '/^module @fused_producer/,/^}/p' %s | remat-opt --place-optimization-barriers=fence-producers=false | filecheck %s --check-prefix=NOFENCE
// A clone its own group does not read (remat-partial-eval made it early) gets a fence:
// RUN: sed -n '/^module @made_early/,/^}/p' %s | remat-opt --place-optimization-barriers --place-optimization-barriers | filecheck %s --check-prefix=EARLY
// function-region=true (a module policy) on @saved_all, which recomputes nothing; without it
// (and per-use) no barrier:
// RUN: sed -n '/^module @saved_all/,/^}/p' %s | remat-opt --place-optimization-barriers='groups=per-region function-region=true' | filecheck %s --check-prefix=ALL
// RUN: sed -n '/^module @saved_all/,/^}/p' %s | remat-opt --place-optimization-barriers='groups=per-region function-region=true' --place-optimization-barriers='groups=per-region function-region=true' | filecheck %s --check-prefix=ALL
// RUN: sed -n '/^module @saved_all/,/^}/p' %s | remat-opt --place-optimization-barriers='groups=per-region' --place-optimization-barriers='function-region=true' | filecheck %s --check-prefix=NOBARRIER

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
// With groups=per-region both groups are one region (no rp.checkpoint scopes: the
// function's own policy): one barrier before the first, and the cosine clone reads the
// sine clone directly. Run twice, it stays one.
// REGION-LABEL: module @two_groups
// REGION: %[[B:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %arg1 :
// REGION-NEXT: %[[S:.*]] = stablehlo.sine %[[B]]#0 {remat.recompute = 1 : i64}
// REGION-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[S]]
// REGION-NEXT: %[[C:.*]] = stablehlo.cosine %[[S]] {remat.recompute = 2 : i64}
// REGION-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[C]]
// REGION-NEXT: return
// REGION-NOT: optimization_barrier
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

// -----

// tie-to-cotangent=true: after the barrier, the group's computed inputs are
// read through a multiplication by 1 computed from the cotangent's first
// element (XLA:CPU deletes barriers before it schedules; this dependency it
// keeps), the square root of 1 + 0 * is_finite(c): XLA counts the square root as
// expensive, so it computes the 1 once rather than in every fusion reading it. The tanh clone reads the computed %h: it is tied. The transpose clone
// reads only the argument %w and makes no more than %w: it is not tied (the tie
// would copy the weight for nothing; compare @embedding). The dot
// reads a tied value already. Without the option, nothing but the barrier.
// CHECK-LABEL: module @tie
// TIE-LABEL: module @tie
// TIE: %[[G0:.*]] = stablehlo.multiply %arg2, %{{.*}} : tensor<2x4xf32>
// TIE-NEXT: %[[B:.*]]:3 = stablehlo.optimization_barrier {{[^%]*}}%[[H:[^,]*]], %arg0, %[[G0]]
// TIE-NEXT: %[[FIRST:.*]] = stablehlo.slice %[[B]]#2 [0:1, 0:1]
// TIE-NEXT: %[[C:.*]] = stablehlo.reshape %[[FIRST]] : (tensor<1x1xf32>) -> tensor<f32>
// TIE-NEXT: %[[FIN:.*]] = stablehlo.is_finite %[[C]]
// TIE: %[[FLAG:.*]] = stablehlo.convert %[[FIN]] : (tensor<i1>) -> tensor<f32>
// TIE-NEXT: %[[Z:.*]] = stablehlo.multiply %[[FLAG]], %{{.*}} : tensor<f32>
// TIE-NEXT: %[[ONE0:.*]] = stablehlo.add %[[Z]], %{{.*}} : tensor<f32>
// TIE-NEXT: %[[ONE:.*]] = stablehlo.sqrt %[[ONE0]] : tensor<f32>
// TIE-NEXT: %[[F1:.*]] = stablehlo.broadcast_in_dim %[[ONE]], dims = [] : (tensor<f32>) -> tensor<2x4xf32>
// TIE-NEXT: %[[H1:.*]] = stablehlo.multiply %[[B]]#0, %[[F1]] {remat.barrier} : tensor<2x4xf32>
// TIE-NEXT: %[[T:.*]] = stablehlo.tanh %[[H1]] {remat.recompute = 3 : i64}
// TIE-NEXT: %[[WT:.*]] = stablehlo.transpose %[[B]]#1
// TIE-NEXT: stablehlo.dot_general %[[T]], %[[WT]]
// Run twice, the pass changes nothing the second time:
// TWICE-COUNT-1: stablehlo.optimization_barrier
// TWICE-COUNT-1: stablehlo.is_finite
// TWICE-NOT: stablehlo.optimization_barrier
// TWICE-NOT: stablehlo.is_finite
// NOTIE-LABEL: module @tie
// NOTIE-NOT: is_finite
// groups=per-region under a module policy: JAX's one barrier over what the backward reads
// from the forward, with the cotangent, and the group's computed input tied after it.
// REGIONTIE-LABEL: module @tie
// REGIONTIE: %[[B:.*]]:4 = stablehlo.optimization_barrier {{[^%]*}}%{{[^,]*}}, %[[H:[^,]*]], %arg0, %arg2
// REGIONTIE-NEXT: stablehlo.multiply %arg2, %[[B]]#0
// REGIONTIE-NEXT: %{{.*}} = stablehlo.slice %[[B]]#3 [0:1, 0:1]
// REGIONTIE: %[[H1:.*]] = stablehlo.multiply %[[B]]#1, %{{.*}} {remat.barrier}
// REGIONTIE-NEXT: stablehlo.tanh %[[H1]] {remat.recompute = 3 : i64}
// REGIONTIE-NEXT: stablehlo.transpose %[[B]]#2
// REGIONTIE-NOT: stablehlo.optimization_barrier
// REGIONTIE-NOT: stablehlo.is_finite
module @tie {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<2x4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %h = stablehlo.sine %x : tensor<2x4xf32>
    %y = stablehlo.dot_general %h, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %e = stablehlo.exponential %y : tensor<2x4xf32>
    %g0 = stablehlo.multiply %ct, %e : tensor<2x4xf32>
    %t = stablehlo.tanh %h {remat.recompute = 3 : i64} : tensor<2x4xf32>
    %wt = stablehlo.transpose %w, dims = [1, 0] {remat.recompute = 3 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %d = stablehlo.dot_general %t, %wt, contracting_dims = [1] x [0] {remat.recompute = 3 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %g1 = stablehlo.multiply %g0, %d : tensor<2x4xf32>
    return %e, %g1 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// tie-to-cotangent=true: the group's first op reads a computed f8E8M0FNU scale, the
// smaller of its computed inputs, but that type has no 0 (the tie's 1 + 0 * flag would be
// NaN in it, and so would the scale): the op after it, reading the computed f32 %h, gets
// %h tied instead.
// CHECK-LABEL: module @e8m0_tie
// E8M0-LABEL: module @e8m0_tie
// E8M0: %[[B:.*]]:3 = stablehlo.optimization_barrier {{[^%]*}}%{{[^,]*}}, %{{[^,]*}}, %{{[^ ]*}} : tensor<2x4xf8E8M0FNU>, tensor<2x4xf32>, tensor<2x4xf32>
// E8M0-NOT: f8E8M0FNU
// E8M0: %[[H1:.*]] = stablehlo.multiply %[[B]]#1, %{{.*}} {remat.barrier} : tensor<2x4xf32>
// E8M0-NEXT: %[[SC:.*]] = stablehlo.convert %[[B]]#0 {remat.recompute = 1 : i64}
// E8M0-NEXT: stablehlo.multiply %[[SC]], %[[H1]] {remat.recompute = 1 : i64}
module @e8m0_tie {
  func.func @main(%x: tensor<2x4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %h = stablehlo.sine %x : tensor<2x4xf32>
    %s = stablehlo.convert %h : (tensor<2x4xf32>) -> tensor<2x4xf8E8M0FNU>
    %e = stablehlo.exponential %h : tensor<2x4xf32>
    %g0 = stablehlo.multiply %ct, %e : tensor<2x4xf32>
    %sc = stablehlo.convert %s {remat.recompute = 1 : i64} : (tensor<2x4xf8E8M0FNU>) -> tensor<2x4xf32>
    %m = stablehlo.multiply %sc, %h {remat.recompute = 1 : i64} : tensor<2x4xf32>
    %g1 = stablehlo.multiply %g0, %m : tensor<2x4xf32>
    return %e, %g1 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// tie-to-cotangent=true, but the backward reads nothing of the forward but the
// argument %x (the second group reads the first group's clone): the whole
// forward is recomputed at once from the arguments, which saves nothing in any
// form, so no tie is placed (XLA:CPU undoing it costs no memory). Per use, in joint
// form, where the installed jaxlib's XLA:CPU keeps barriers through CSE (>= 0.11),
// no barrier either (test_remat_structure checks which); per region the barrier stays,
// as jax.checkpoint places it.
// CHECK-LABEL: module @no_activation
// NOACT-LABEL: module @no_activation
// NOACT-NOT: is_finite
// NOACTREGION-LABEL: module @no_activation
// NOACTREGION-COUNT-1: stablehlo.optimization_barrier
// NOACTREGION-NOT: is_finite

// TWOLV-LABEL: module @two_levels
// TWOLV: %[[B1:.*]]:2 = stablehlo.optimization_barrier {remat.barrier} %arg0, %arg1
// TWOLV: stablehlo.is_finite
// TWOLV: %[[X1:.*]] = stablehlo.multiply %[[B1]]#0, %{{.*}} {remat.barrier}
// TWOLV-NEXT: stablehlo.sine %[[X1]] {remat.recompute = 1 : i64}
// TWOLV: %[[B2:.*]]:2 = stablehlo.optimization_barrier {remat.barrier} %arg0, %{{.*}}
// TWOLV: stablehlo.is_finite
// TWOLV: %[[X2:.*]] = stablehlo.multiply %[[B2]]#0, %{{.*}} {remat.barrier}
// TWOLV-NEXT: stablehlo.sine %[[X2]] {remat.recompute = 2 : i64}
module @no_activation {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %s2 = stablehlo.sine %x {remat.recompute = 1 : i64} : tensor<4xf32>
    %c2 = stablehlo.cosine %s2 {remat.recompute = 1 : i64} : tensor<4xf32>
    %g0 = stablehlo.multiply %ct, %c2 : tensor<4xf32>
    %t = stablehlo.tanh %s2 {remat.recompute = 2 : i64} : tensor<4xf32>
    %g1 = stablehlo.multiply %g0, %t : tensor<4xf32>
    return %s, %g1 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// tie-to-cotangent=true: the clone %e2 = %x @ %w reads arguments alone and makes
// 512 B from a 64 B %x: %x is tied (untied, XLA:CPU of jaxlib >= 0.11 runs such a
// clone, and the cosine reading it, in the forward: the barrier's cotangent result
// is read by nothing, and XLA drops it). The forward keeps the computed %s, so
// ties are placed. Of the arguments the clone reads alone only the smaller, %x, goes
// through the barrier: that is enough to keep it apart from the forward's %e, and %w read
// as it is gives XLA one weight, not two (see @weight_read).
// CHECK-LABEL: module @embedding
// EMBED-LABEL: module @embedding
// EMBED: %[[B:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg1, %{{[^ ]*}} :
// EMBED: stablehlo.is_finite
// EMBED: %[[X1:.*]] = stablehlo.multiply %[[B]]#0, %{{.*}} {remat.barrier} : tensor<8x2xf32>
// EMBED-NEXT: %[[E2:.*]] = stablehlo.dot_general %[[X1]], %arg0, {{.*}}remat.recompute = 1
// EMBED-NEXT: stablehlo.cosine %[[E2]] {remat.recompute = 1 : i64}
// EMBED-NOT: stablehlo.is_finite
module @embedding {
  func.func @main(%w: tensor<2x16xf32>, %x: tensor<8x2xf32>, %ct: tensor<8x16xf32> {remat.cotangent}) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
    %e = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x2xf32>, tensor<2x16xf32>) -> tensor<8x16xf32>
    %s = stablehlo.sine %e : tensor<8x16xf32>
    %g0 = stablehlo.multiply %ct, %s : tensor<8x16xf32>
    %e2 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] {remat.recompute = 1 : i64} : (tensor<8x2xf32>, tensor<2x16xf32>) -> tensor<8x16xf32>
    %c = stablehlo.cosine %e2 {remat.recompute = 1 : i64} : tensor<8x16xf32>
    %g1 = stablehlo.multiply %g0, %c : tensor<8x16xf32>
    return %s, %g1 : tensor<8x16xf32>, tensor<8x16xf32>
  }
}

// -----

// tie-to-cotangent=true (XLA:CPU): the clone `%t @ %w` reads the recomputed %t, which
// makes it a clone of its own, so it reads the weight %w as it is, not through the
// barrier: read through it, %w is another value to XLA, and what XLA makes of it for the
// dot (XLA:CPU's f32 copy of a bf16 weight, a transposed copy) is made a second time, at
// the start of the program (XLA:CPU drops the barrier's unread cotangent). The transpose
// of %v reads an argument alone, so %v stays behind the barrier (read directly, XLA would
// merge the clone with a forward twin). Without the tie every input is hidden.
// CHECK-LABEL: module @weight_read
// WARG-LABEL: module @weight_read
// WARG: %[[B:.*]]:3 = stablehlo.optimization_barrier {{[^%]*}}%{{[^,]*}}, %arg1, %{{[^ ]*}} : tensor<2x4xf32>, tensor<4x4xf32>, tensor<2x4xf32>
// WARG: stablehlo.is_finite
// WARG: %[[H1:.*]] = stablehlo.multiply %[[B]]#0, %{{.*}} {remat.barrier}
// WARG-NEXT: %[[T:.*]] = stablehlo.tanh %[[H1]] {remat.recompute = 1 : i64}
// WARG-NEXT: %[[D:.*]] = stablehlo.dot_general %[[T]], %arg0, {{.*}}remat.recompute = 1
// WARG-NEXT: %[[VT:.*]] = stablehlo.transpose %[[B]]#1, {{.*}}remat.recompute = 1
// WARG-NEXT: stablehlo.dot_general %[[D]], %[[VT]], {{.*}}remat.recompute = 1
// WARG-NOT: stablehlo.optimization_barrier
// WARG-NOT: stablehlo.is_finite
// WARGNOTIE-LABEL: module @weight_read
// WARGNOTIE: %[[B:.*]]:4 = stablehlo.optimization_barrier {{[^%]*}}%{{[^,]*}}, %arg0, %arg1, %{{[^ ]*}} :
// WARGNOTIE: stablehlo.dot_general %{{.*}}, %[[B]]#1, {{.*}}remat.recompute = 1
// The one barrier of the region takes what the backward reads from the forward (%e) and
// the arguments the group must hide (%v), not %w, which the backward's last dot reads too:
// WARGREGION-LABEL: module @weight_read
// WARGREGION: %[[B:.*]]:4 = stablehlo.optimization_barrier {{[^%]*}}%{{[^,]*}}, %{{[^,]*}}, %arg1, %arg3 :
// WARGREGION: %[[T:.*]] = stablehlo.tanh %{{.*}} {remat.recompute = 1 : i64}
// WARGREGION-NEXT: stablehlo.dot_general %[[T]], %arg0, {{.*}}remat.recompute = 1
// WARGREGION-NEXT: stablehlo.transpose %[[B]]#2, {{.*}}remat.recompute = 1
// WARGREGION-NOT: stablehlo.optimization_barrier
// WARGREGION: stablehlo.dot_general %{{.*}}, %arg0, contracting_dims = [1] x [1] :
module @weight_read {
  func.func @main(%w: tensor<4x4xf32>, %v: tensor<4x4xf32>, %x: tensor<2x4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %h = stablehlo.sine %x : tensor<2x4xf32>
    %y = stablehlo.dot_general %h, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %e = stablehlo.exponential %y : tensor<2x4xf32>
    %g0 = stablehlo.multiply %ct, %e : tensor<2x4xf32>
    %t = stablehlo.tanh %h {remat.recompute = 1 : i64} : tensor<2x4xf32>
    %d = stablehlo.dot_general %t, %w, contracting_dims = [1] x [0] {remat.recompute = 1 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %vt = stablehlo.transpose %v, dims = [1, 0] {remat.recompute = 1 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %d2 = stablehlo.dot_general %d, %vt, contracting_dims = [1] x [0] {remat.recompute = 1 : i64} : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %g1 = stablehlo.multiply %g0, %d2 : tensor<2x4xf32>
    %g2 = stablehlo.dot_general %g1, %w, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    return %e, %g2 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// Scan loop pair (the @scan input of remat-partial-eval-scan.mlir) after
// nothing_saveable: the backward while body recomputes the layer from the
// stacked carry-in in three groups (the cosine of h, the sine of h, the
// cosine of the dot). With in-loops=true each group gets its barrier right
// before it, inside the body; the group reads the barrier's results. The
// first barrier carries the body's carried cotangent %G (a float carry the
// body changes: it returns %GX in its place); the later ones carry the
// backward value their consumer reads. Constants (the zero slice indices) are
// read directly, not through a barrier. The forward body and the constants
// cloned before the backward loop (a constants-only group) get none.
// LOOPS-LABEL: module @scan_pair
// LOOPS: %[[FW:.*]]:4 = stablehlo.while(
// LOOPS-NOT: optimization_barrier
// LOOPS: stablehlo.while(%[[BWS:[^ ]+]] = %arg1, %[[B0:[^ ]+]] = %[[FW]]#3, %[[J:[^ ]+]] = %{{[^ ]+}}, %[[G:[^ ]+]] = %arg2, %{{[^ ]+}} = %{{[^ ]+}}) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>{{$}}
// LOOPS-NOT: optimization_barrier
// LOOPS: %[[T:.*]] = stablehlo.subtract %{{[^ ]+}}, %[[J]]
// LOOPS-NEXT: %[[K:.*]] = stablehlo.subtract %[[T]], %{{[^ ]+}}
// LOOPS-NOT: optimization_barrier
// LOOPS: %[[R0:.*]] = stablehlo.dynamic_slice %[[B0]], %[[K]],
// LOOPS-NEXT: %[[XK:.*]] = stablehlo.reshape %[[R0]]
// LOOPS-NEXT: %[[B1:.*]]:4 = stablehlo.optimization_barrier {{[^%]*}}%[[BWS]], %[[K]], %[[XK]], %[[G]] : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<2x4xf32>{{$}}
// LOOPS-NEXT: %[[RW:.*]] = stablehlo.dynamic_slice %[[B1]]#0, %[[B1]]#1, {{.*}} {remat.recompute = 1 : i64}
// LOOPS-NEXT: %[[W:.*]] = stablehlo.reshape %[[RW]] {remat.recompute = 1 : i64}
// LOOPS-NEXT: %[[D:.*]] = stablehlo.dot_general %[[B1]]#2, %[[W]], {{.*}} {remat.recompute = 1 : i64}
// LOOPS-NEXT: %[[S:.*]] = stablehlo.sine %[[D]] {remat.recompute = 1 : i64}
// LOOPS-NEXT: %[[H:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {{.*}}remat.recompute = 1 : i64
// LOOPS-NEXT: %[[CH:.*]] = stablehlo.cosine %[[H]] {remat.recompute = 1 : i64}
// LOOPS-NEXT: %[[GX0:.*]] = stablehlo.multiply %[[CH]], %[[G]]
// LOOPS-NEXT: stablehlo.multiply %[[G]], %[[XK]]
// LOOPS-NEXT: %[[GN:.*]] = stablehlo.negate
// LOOPS-NEXT: %[[B2:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%[[H]], %[[GN]] : tensor<2x4xf32>, tensor<2x4xf32>{{$}}
// LOOPS-NEXT: %[[SH:.*]] = stablehlo.sine %[[B2]]#0 {remat.recompute = 2 : i64}
// LOOPS-NEXT: %[[GS:.*]] = stablehlo.multiply %[[GN]], %[[SH]]
// LOOPS-NEXT: %[[B3:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%[[D]], %[[GS]] : tensor<2x4xf32>, tensor<2x4xf32>{{$}}
// LOOPS-NEXT: %[[CD:.*]] = stablehlo.cosine %[[B3]]#0 {remat.recompute = 3 : i64}
// LOOPS-NEXT: stablehlo.multiply %[[GS]], %[[CD]]
// LOOPS-NOT: optimization_barrier
// LOOPS: %[[GX:.*]] = stablehlo.add %[[GX0]], %{{[^ ]+}} : tensor<2x4xf32>
// LOOPS-NOT: optimization_barrier
// LOOPS: stablehlo.return %[[BWS]], %[[B0]], %{{[^ ]+}}, %[[GX]], %{{[^ ]+}} :
// LOOPS-NOT: optimization_barrier
// LOOPS: return

// By default (in-loops=false) the same recomputation gets no barrier, neither
// inside the while bodies nor outside them.
// NOLOOPS-LABEL: module @scan_pair
// NOLOOPS-NOT: optimization_barrier
// NOLOOPS: stablehlo.while(%{{[^ ]+}} = %arg1, %{{[^ ]+}} = %{{[^ ]+}}#3, {{.*}}) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>{{$}}
// NOLOOPS-NOT: optimization_barrier
// NOLOOPS: stablehlo.dot_general %{{[^ ]+}}, %{{[^ ]+}}, contracting_dims = [1] x [0] {remat.recompute = 1 : i64}
// NOLOOPS-NOT: optimization_barrier
// NOLOOPS: stablehlo.sine %{{[^ ]+}} {remat.recompute = 2 : i64}
// NOLOOPS-NOT: optimization_barrier
// NOLOOPS: stablehlo.cosine %{{[^ ]+}} {remat.recompute = 3 : i64}
// NOLOOPS-NOT: optimization_barrier
// NOLOOPS: stablehlo.return
// NOLOOPS-NOT: optimization_barrier
// NOLOOPS: return
module @scan_pair {
  func.func @main(%x: tensor<2x4xf32>, %ws: tensor<3x4x4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x4x4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %zs = stablehlo.constant dense<0.000000e+00> : tensor<3x2x4xf32>
    %zw = stablehlo.constant dense<0.000000e+00> : tensor<3x4x4xf32>
    %fw:7 = stablehlo.while(%fws = %ws, %i = %c0, %xi = %x, %s0 = %zs, %s1 = %zs, %s2 = %zs, %s3 = %zs) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    cond {
      %p = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %w1 = stablehlo.dynamic_slice %fws, %i, %c0, %c0, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %w = stablehlo.reshape %w1 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %d = stablehlo.dot_general %xi, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %s = stablehlo.sine %d : tensor<2x4xf32>
      %cd = stablehlo.cosine %d : tensor<2x4xf32>
      %h = stablehlo.custom_call @remat.name(%s) {backend_config = "h"} : (tensor<2x4xf32>) -> tensor<2x4xf32> loc("jit(f)/while/body/name"("layer"("model.py":3:8)))
      %ch = stablehlo.cosine %h : tensor<2x4xf32>
      %sh = stablehlo.sine %h : tensor<2x4xf32>
      %y = stablehlo.multiply %ch, %xi : tensor<2x4xf32>
      %u0 = stablehlo.broadcast_in_dim %xi, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n0 = stablehlo.dynamic_update_slice %s0, %u0, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u1 = stablehlo.broadcast_in_dim %cd, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n1 = stablehlo.dynamic_update_slice %s1, %u1, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u2 = stablehlo.broadcast_in_dim %sh, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n2 = stablehlo.dynamic_update_slice %s2, %u2, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u3 = stablehlo.broadcast_in_dim %ch, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n3 = stablehlo.dynamic_update_slice %s3, %u3, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %i1 = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %fws, %i1, %y, %n0, %n1, %n2, %n3 : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    } loc("jit(f)/while"("f"("model.py":7:4)))
    %bw:8 = stablehlo.while(%bws = %ws, %b0 = %fw#3, %b1 = %fw#4, %b2 = %fw#5, %b3 = %fw#6, %j = %c0, %g = %ct, %gws = %zw) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>
    cond {
      %p = stablehlo.compare LT, %j, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %t = stablehlo.subtract %c3, %j : tensor<i32>
      %k = stablehlo.subtract %t, %c1 : tensor<i32>
      %w1 = stablehlo.dynamic_slice %bws, %k, %c0, %c0, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %w = stablehlo.reshape %w1 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %r0 = stablehlo.dynamic_slice %b0, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %xk = stablehlo.reshape %r0 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %r1 = stablehlo.dynamic_slice %b1, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %cdk = stablehlo.reshape %r1 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %r2 = stablehlo.dynamic_slice %b2, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %shk = stablehlo.reshape %r2 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %r3 = stablehlo.dynamic_slice %b3, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %chk = stablehlo.reshape %r3 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %gx0 = stablehlo.multiply %chk, %g : tensor<2x4xf32>
      %gc = stablehlo.multiply %g, %xk : tensor<2x4xf32>
      %gn = stablehlo.negate %gc : tensor<2x4xf32>
      %gs = stablehlo.multiply %gn, %shk : tensor<2x4xf32>
      %gd = stablehlo.multiply %gs, %cdk : tensor<2x4xf32>
      %gw0 = stablehlo.dot_general %gd, %xk, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %gw = stablehlo.transpose %gw0, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %gx1 = stablehlo.dot_general %gd, %w, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %gx = stablehlo.add %gx0, %gx1 : tensor<2x4xf32>
      %uw = stablehlo.broadcast_in_dim %gw, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
      %ngws = stablehlo.dynamic_update_slice %gws, %uw, %k, %c0, %c0 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32>
      %j1 = stablehlo.add %j, %c1 : tensor<i32>
      stablehlo.return %bws, %b0, %b1, %b2, %b3, %j1, %gx, %ngws : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>
    }
    return %fw#2, %bw#6, %bw#7 : tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x4x4xf32>
  }
}

// -----

// groups=per-region, but the second group reads %t, a forward value made after the first
// group's recomputation: one barrier before the first group cannot take it, so the second
// group gets its own.
// LATE-LABEL: module @late_input
// LATE: %[[B1:.*]]:2 = stablehlo.optimization_barrier {{[^%]*}}%arg0, %arg1 :
// LATE-NEXT: %[[S:.*]] = stablehlo.sine %[[B1]]#0 {remat.recompute = 1 : i64}
// LATE-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[S]]
// LATE-NEXT: %[[T:.*]] = stablehlo.tanh %arg0
// LATE-NEXT: %[[B2:.*]]:3 = stablehlo.optimization_barrier {{[^%]*}}%[[S]], %[[T]], %[[G1]] :
// LATE-NEXT: stablehlo.add %[[B2]]#0, %[[B2]]#1 {remat.recompute = 2 : i64}
module @late_input {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %c = stablehlo.cosine %s : tensor<4xf32>
    %s2 = stablehlo.sine %x {remat.recompute = 1 : i64} : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %s2 : tensor<4xf32>
    %t = stablehlo.tanh %x : tensor<4xf32>
    %a2 = stablehlo.add %s2, %t {remat.recompute = 2 : i64} : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %a2 : tensor<4xf32>
    %o = stablehlo.add %c, %t : tensor<4xf32>
    return %o, %g2 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// groups=per-region under a module policy (function-region=true) that recomputes nothing:
// as jax.checkpoint(f, everything_saveable) lowers it, the backward reads the forward
// through one barrier with the cotangent, placed before the first backward op that reads
// the forward: the relu mask (i1), the argument and the constant-free values. Backward ops
// that read only the cotangent come before it; %late, made after that op, is read as it is.
// ALL-LABEL: module @saved_all
// ALL: %[[M:.*]] = stablehlo.compare GT, %arg0, %{{.*}}
// ALL: %[[G0:.*]] = stablehlo.negate %arg1
// ALL-NEXT: %[[B:.*]]:3 = stablehlo.optimization_barrier {{[^%]*}}%[[M]], %arg0, %arg1 : tensor<4xi1>, tensor<4xf32>, tensor<4xf32>
// ALL-NEXT: %[[S:.*]] = stablehlo.select %[[B]]#0, %[[G0]], %{{.*}}
// ALL-NEXT: %[[G1:.*]] = stablehlo.multiply %[[S]], %[[B]]#1
// ALL-NEXT: %[[L:.*]] = stablehlo.tanh %arg0
// ALL-NEXT: stablehlo.add %[[G1]], %[[L]]
// ALL-NOT: optimization_barrier
// NOBARRIER-LABEL: module @saved_all
// NOBARRIER-NOT: optimization_barrier
module @saved_all {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %z = stablehlo.constant dense<0.000000e+00> : tensor<4xf32>
    %m = stablehlo.compare GT, %x, %z : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
    %r = stablehlo.select %m, %x, %z : tensor<4xi1>, tensor<4xf32>
    %g0 = stablehlo.negate %ct : tensor<4xf32>
    %s = stablehlo.select %m, %g0, %z : tensor<4xi1>, tensor<4xf32>
    %g1 = stablehlo.multiply %s, %x : tensor<4xf32>
    %late = stablehlo.tanh %x : tensor<4xf32>
    %g2 = stablehlo.add %g1, %late : tensor<4xf32>
    return %r, %g2 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// A saved value XLA stores anyway (the group's barrier reads it) whose producer is a cheap
// elementwise op on a value the backward does not read (%h = %d + bias, %d a dot): the
// backward reads %h through one more barrier, at its first reader, so XLA cannot compute
// %h again inside the backward's fusions from %d and keep %d live beside %h.
// CHECK-LABEL: module @fused_producer
// CHECK: %[[H:.*]] = stablehlo.add %{{.*}}, %{{.*}} : tensor<2x4xf32>
// CHECK: %[[F:.*]] = stablehlo.optimization_barrier {remat.barrier} %[[H]] : tensor<2x4xf32>
// CHECK-NEXT: %[[G0:.*]] = stablehlo.multiply %arg3, %[[F]]
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier {remat.barrier} %[[H]], %[[G0]]
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[B]]#0 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G1:.*]] = stablehlo.multiply %[[G0]], %[[T]]
// CHECK-NEXT: %[[G2:.*]] = stablehlo.add %[[G1]], %[[F]]
// CHECK-NEXT: return
// NOFENCE-LABEL: module @fused_producer
// NOFENCE-COUNT-1: stablehlo.optimization_barrier
// NOFENCE-NOT: stablehlo.optimization_barrier
module @fused_producer {
  func.func @main(%x: tensor<2x4xf32>, %w: tensor<4x4xf32>, %b: tensor<4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
    %h = stablehlo.add %d, %bb : tensor<2x4xf32>
    %y = stablehlo.tanh %h : tensor<2x4xf32>
    %g0 = stablehlo.multiply %ct, %h : tensor<2x4xf32>
    %t = stablehlo.tanh %h {remat.recompute = 1 : i64} : tensor<2x4xf32>
    %g1 = stablehlo.multiply %g0, %t : tensor<2x4xf32>
    %g2 = stablehlo.add %g1, %h : tensor<2x4xf32>
    return %y, %g2 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// The same with the saved sum named (`checkpoint_name`, still marked when the pass runs): the
// marker is an identity, looked through, so the named value gets the same fence (none before).
// CHECK-LABEL: module @named_producer
// CHECK: %[[S:.*]] = stablehlo.add %{{.*}}, %{{.*}} : tensor<2x4xf32>
// CHECK: %[[H:.*]] = stablehlo.custom_call @remat.name(%[[S]])
// CHECK: %[[F:.*]] = stablehlo.optimization_barrier {remat.barrier} %[[H]] : tensor<2x4xf32>
// CHECK-NEXT: %[[G0:.*]] = stablehlo.multiply %arg3, %[[F]]
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier {remat.barrier} %[[H]], %[[G0]]
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[B]]#0 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G1:.*]] = stablehlo.multiply %[[G0]], %[[T]]
// CHECK-NEXT: %[[G2:.*]] = stablehlo.add %[[G1]], %[[F]]
// CHECK-NEXT: return
module @named_producer {
  func.func @main(%x: tensor<2x4xf32>, %w: tensor<4x4xf32>, %b: tensor<4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
    %s = stablehlo.add %d, %bb : tensor<2x4xf32>
    %h = stablehlo.custom_call @remat.name(%s) {backend_config = "h"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
    %y = stablehlo.tanh %h : tensor<2x4xf32>
    %g0 = stablehlo.multiply %ct, %h : tensor<2x4xf32>
    %t = stablehlo.tanh %h {remat.recompute = 1 : i64} : tensor<2x4xf32>
    %g1 = stablehlo.multiply %g0, %t : tensor<2x4xf32>
    %g2 = stablehlo.add %g1, %h : tensor<2x4xf32>
    return %y, %g2 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// The same value with no reader that stores it (the recomputation starts from %x): XLA may
// compute %h inside its readers and never store it, so no barrier but the group's.
// CHECK-LABEL: module @producer_not_stored
// CHECK: %[[H:.*]] = stablehlo.add
// CHECK-NEXT: stablehlo.tanh %[[H]]
// CHECK-NEXT: %[[G0:.*]] = stablehlo.multiply %arg3, %[[H]]
// CHECK-NEXT: stablehlo.optimization_barrier {remat.barrier} %arg0, %[[G0]]
// CHECK-NEXT: stablehlo.sine
// CHECK-NEXT: stablehlo.multiply %[[G0]]
// CHECK-NEXT: return
module @producer_not_stored {
  func.func @main(%x: tensor<2x4xf32>, %w: tensor<4x4xf32>, %b: tensor<4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
    %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<2x4xf32>
    %h = stablehlo.add %d, %bb : tensor<2x4xf32>
    %y = stablehlo.tanh %h : tensor<2x4xf32>
    %g0 = stablehlo.multiply %ct, %h : tensor<2x4xf32>
    %s = stablehlo.sine %x {remat.recompute = 1 : i64} : tensor<2x4xf32>
    %g1 = stablehlo.multiply %g0, %s : tensor<2x4xf32>
    return %y, %g1 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

module @two_levels {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) attributes {remat.levels = 2 : i64} {
    %s = stablehlo.sine %x : tensor<4xf32>
    %s2 = stablehlo.sine %x {remat.recompute = 1 : i64} : tensor<4xf32>
    %c2 = stablehlo.cosine %s2 {remat.recompute = 1 : i64} : tensor<4xf32>
    %g0 = stablehlo.multiply %ct, %c2 : tensor<4xf32>
    %s3 = stablehlo.sine %x {remat.recompute = 2 : i64} : tensor<4xf32>
    %t = stablehlo.tanh %s3 {remat.recompute = 2 : i64} : tensor<4xf32>
    %g1 = stablehlo.multiply %g0, %t : tensor<4xf32>
    return %s, %g1 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// A cheap backward chain (%g1 = %g0 * %ct, 4 KiB, reading 8 KiB through its chain) that a
// dot stores and a reduce would compute again: by default only the group's barrier; with
// fence-chains=true one barrier right after %g1, which the dot and the reduce read (and a
// second run adds none). %g0 has one reader: XLA computes it inside %g1's fusion, no fence.
// CHECK-LABEL: module @duplicated_chain
// CHECK: %[[G1:.*]] = stablehlo.multiply %{{.*}}, %arg2 : tensor<32x32xf32>
// CHECK-NOT: stablehlo.optimization_barrier
// CHECK: stablehlo.dot_general %[[G1]], %arg1
// CHECK: stablehlo.reduce(%[[G1]] init:
// CHAIN-LABEL: module @duplicated_chain
// CHAIN: %[[B:.*]]:2 = stablehlo.optimization_barrier {remat.barrier} %arg0, %{{.*}}
// CHAIN: %[[G1:.*]] = stablehlo.multiply %{{.*}}, %arg2 : tensor<32x32xf32>
// CHAIN-NEXT: %[[F:.*]] = stablehlo.optimization_barrier {remat.barrier} %[[G1]] : tensor<32x32xf32>
// CHAIN-NEXT: stablehlo.dot_general %[[F]], %arg1
// CHAIN: stablehlo.reduce(%[[F]] init:
// CHAIN-NOT: stablehlo.optimization_barrier
// CHAIN: return
module @duplicated_chain {
  func.func @main(%x: tensor<32x32xf32>, %w: tensor<32x32xf32>, %ct: tensor<32x32xf32> {remat.cotangent}) -> (tensor<32x32xf32>, tensor<32x32xf32>, tensor<32xf32>) {
    %y = stablehlo.sine %x : tensor<32x32xf32>
    %s2 = stablehlo.sine %x {remat.recompute = 1 : i64} : tensor<32x32xf32>
    %c2 = stablehlo.cosine %s2 {remat.recompute = 1 : i64} : tensor<32x32xf32>
    %g0 = stablehlo.multiply %ct, %c2 : tensor<32x32xf32>
    %g1 = stablehlo.multiply %g0, %ct : tensor<32x32xf32>
    %d = stablehlo.dot_general %g1, %w, contracting_dims = [1] x [0] : (tensor<32x32xf32>, tensor<32x32xf32>) -> tensor<32x32xf32>
    %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %r = stablehlo.reduce(%g1 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<32x32xf32>, tensor<f32>) -> tensor<32xf32>
    return %y, %d, %r : tensor<32x32xf32>, tensor<32x32xf32>, tensor<32xf32>
  }
}

// -----

// The mask (%m) is a clone of group 1 that nothing in group 1 reads: remat-partial-eval
// made it where the pre-activation it is computed from is made, for the select after
// the group's consumer. It gets a barrier of its own right after it (once, also when
// the pass runs twice), so XLA stores the mask instead of computing it inside the
// select from the pre-activation, kept alive until there. The constant beside it, read
// by the select too, is left alone.
// EARLY-LABEL: module @made_early
// EARLY: %[[B:.*]]:3 = stablehlo.optimization_barrier {remat.barrier} %arg0, %arg1, %arg2
// EARLY-NEXT: %[[D:.*]] = stablehlo.dot_general %[[B]]#0, %[[B]]#1
// EARLY-NEXT: %[[Z:.*]] = stablehlo.constant {remat.recompute = 1 : i64}
// EARLY-NEXT: %[[R:.*]] = stablehlo.maximum %[[D]], %[[Z]]
// EARLY-NEXT: %[[M:.*]] = stablehlo.compare GT, %[[D]], %[[Z]]
// EARLY-NEXT: %[[F:.*]] = stablehlo.optimization_barrier {remat.barrier} %[[M]] : tensor<64xi1>
// EARLY-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[R]]
// EARLY-NEXT: stablehlo.select %[[F]], %[[G1]], %[[Z]]
// EARLY-NOT: optimization_barrier
// EARLY: return
module @made_early {
  func.func @main(%w: tensor<64x64xf32>, %x: tensor<64xf32>, %ct: tensor<64xf32> {remat.cotangent}) -> (tensor<64xf32>, tensor<64xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %z = stablehlo.constant dense<0.0> : tensor<64xf32>
    %r = stablehlo.maximum %d, %z : tensor<64xf32>
    %d2 = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] {remat.recompute = 1 : i64} : (tensor<64x64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %z2 = stablehlo.constant {remat.recompute = 1 : i64} dense<0.0> : tensor<64xf32>
    %r2 = stablehlo.maximum %d2, %z2 {remat.recompute = 1 : i64} : tensor<64xf32>
    %m2 = stablehlo.compare GT, %d2, %z2 {remat.recompute = 1 : i64} : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xi1>
    %g1 = stablehlo.multiply %ct, %r2 : tensor<64xf32>
    %g2 = stablehlo.select %m2, %g1, %z2 : tensor<64xi1>, tensor<64xf32>
    return %r, %g2 : tensor<64xf32>, tensor<64xf32>
  }
}
