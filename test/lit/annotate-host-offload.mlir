// RUN: remat-opt %s --annotate-host-offload --split-input-file | filecheck %s

// The input is what remat-partial-eval (and the passes between) leave: the
// producer of an Offloadable residual carries remat.offload = "src:dst"
// (joint form), or the @main_fwd result and @main_bwd argument carrying it do
// (split form). The pass emits what JAX emits for offload policies on GPU/TPU:
// annotate_device_placement to <dst> after the producer, back to <src> before
// the first backward use. Each module is named after its case.

// Joint: the dot is offloaded. Right after it, an annotation to pinned_host;
// the forward sine keeps reading the dot itself; right before the first
// backward use, an annotation of the host copy back to device, and every
// backward use (the recomputed cosine and the multiply) reads it.
// CHECK-LABEL: module @joint
// CHECK: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: %[[H:.*]] = stablehlo.custom_call @annotate_device_placement(%[[D]]) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}} : (tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[D]] : tensor<4xf32>
// CHECK-NEXT: %[[E:.*]] = stablehlo.exponential %[[S]]
// CHECK-NEXT: %[[G0:.*]] = stablehlo.multiply %arg2, %[[E]]
// CHECK-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%[[H]]) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[V]] {remat.recompute = 2 : i64}
// CHECK-NEXT: %[[G1:.*]] = stablehlo.multiply %[[G0]], %[[C]]
// CHECK-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[V]]
// CHECK-NEXT: return %[[E]], %[[G2]]
module @joint {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] {remat.offload = "device:pinned_host"} : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %e = stablehlo.exponential %s : tensor<4xf32>
    %g0 = stablehlo.multiply %ct, %e : tensor<4xf32>
    %c = stablehlo.cosine %d {remat.recompute = 2 : i64} : tensor<4xf32>
    %g1 = stablehlo.multiply %g0, %c : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %d : tensor<4xf32>
    return %e, %g2 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// Residuals without remat.offload are not annotated.
// CHECK-LABEL: module @not_offloaded
// CHECK-NOT: annotate_device_placement
// CHECK: return
module @not_offloaded {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %g = stablehlo.multiply %ct, %d : tensor<4xf32>
    return %s, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// An offload mark on a value the backward never reads: nothing to move.
// CHECK-LABEL: module @no_backward_use
// CHECK-NOT: annotate_device_placement
// CHECK: return
module @no_backward_use {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] {remat.offload = "device:pinned_host"} : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %g = stablehlo.multiply %ct, %x : tensor<4xf32>
    return %s, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// Two offloaded residuals, with the placements the mark names (here
// unpinned_host for one): each gets its own pair of annotations, the device
// copy right before its own first backward use.
// CHECK-LABEL: module @two_residuals
// CHECK: %[[D1:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: %[[H1:.*]] = stablehlo.custom_call @annotate_device_placement(%[[D1]]) {{.*}}_xla_buffer_placement = "pinned_host"
// CHECK-NEXT: %[[D2:.*]] = stablehlo.dot_general %arg0, %[[D1]]
// CHECK-NEXT: %[[H2:.*]] = stablehlo.custom_call @annotate_device_placement(%[[D2]]) {{.*}}_xla_buffer_placement = "unpinned_host"
// CHECK-NEXT: %[[V2:.*]] = stablehlo.custom_call @annotate_device_placement(%[[H2]]) {{.*}}_xla_buffer_placement = "device"
// CHECK-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[V2]]
// CHECK-NEXT: %[[V1:.*]] = stablehlo.custom_call @annotate_device_placement(%[[H1]]) {{.*}}_xla_buffer_placement = "device"
// CHECK-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[V1]]
// CHECK-NEXT: return %[[D2]], %[[G2]]
module @two_residuals {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d1 = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] {remat.offload = "device:pinned_host"} : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %d2 = stablehlo.dot_general %w, %d1, contracting_dims = [1] x [0] {remat.offload = "device:unpinned_host"} : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %d2 : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %d1 : tensor<4xf32>
    return %d2, %g2 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// The backward reads the residual through an optimization barrier (as after
// place-optimization-barriers): the barrier is the first backward use, so the
// device copy comes right before it and the barrier reads it.
// CHECK-LABEL: module @through_barrier
// CHECK: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: %[[H:.*]] = stablehlo.custom_call @annotate_device_placement(%[[D]]) {{.*}}_xla_buffer_placement = "pinned_host"
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[D]]
// CHECK-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%[[H]]) {{.*}}_xla_buffer_placement = "device"
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[V]], %arg2
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[B]]#0
// CHECK-NEXT: stablehlo.multiply %arg2, %[[C]]
// CHECK-NEXT: return
module @through_barrier {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] {remat.offload = "device:pinned_host"} : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %b:2 = stablehlo.optimization_barrier %d, %ct : tensor<4xf32>, tensor<4xf32>
    %c = stablehlo.cosine %b#0 {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    return %s, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// As after insert-reduce-precision (which runs first in the pipeline): the
// offloaded dot is rounded right after it and both passes read the rounded
// value. The rounded value is the residual that moves: the host copy is made
// of it, the forward keeps reading it, the backward reads the device copy.
// CHECK-LABEL: module @rounded_residual
// CHECK: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[D]], format = e8m7
// CHECK-NEXT: %[[H:.*]] = stablehlo.custom_call @annotate_device_placement(%[[R]]) {{.*}}_xla_buffer_placement = "pinned_host"
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[R]]
// CHECK-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%[[H]]) {{.*}}_xla_buffer_placement = "device"
// CHECK-NEXT: stablehlo.multiply %arg2, %[[V]]
// CHECK-NEXT: return
module @rounded_residual {
  func.func @main(%w: tensor<4x4xbf16>, %x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] {remat.offload = "device:pinned_host"} : (tensor<4x4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
    %r = stablehlo.reduce_precision %d, format = e8m7 : tensor<4xbf16>
    %s = stablehlo.sine %r : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %r : tensor<4xbf16>
    return %s, %g : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// Split: the offloaded residual result of @main_fwd is annotated to
// pinned_host before the return, which returns the host copy, and the result
// gets mhlo.memory_kind = "pinned_host"; the matching @main_bwd argument gets
// the same memory kind and is annotated back to device before its first use,
// which every use reads. The other residual (no remat.offload) is untouched.
// CHECK-LABEL: module @split
// CHECK: func.func @main_fwd(%arg0: tensor<4x4xf32>, %arg1: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32> {mhlo.memory_kind = "pinned_host", remat.offload = "device:pinned_host", remat.residual = {{.*}}}, tensor<4x4xf32> {remat.residual = {{.*}}})
// CHECK-NEXT: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: %[[H:.*]] = stablehlo.custom_call @annotate_device_placement(%[[D]]) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}}
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[D]]
// CHECK-NEXT: return %[[S]], %[[H]], %arg0
// CHECK: func.func @main_bwd(%arg0: tensor<4xf32> {mhlo.memory_kind = "pinned_host", remat.offload = "device:pinned_host"}, %arg1: tensor<4x4xf32>, %arg2: tensor<4xf32> {remat.cotangent})
// CHECK-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%arg0) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}}
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[V]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg2, %[[C]]
// CHECK-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G]], %[[V]]
// CHECK-NEXT: %[[T:.*]] = stablehlo.dot_general %arg1, %[[G2]]
// CHECK-NEXT: return %[[T]]
module @split {
  func.func @main_fwd(%w: tensor<4x4xf32>, %x: tensor<4xf32>)
      -> (tensor<4xf32>, tensor<4xf32> {remat.offload = "device:pinned_host", remat.residual = "f32[4] output of dot_general"},
          tensor<4x4xf32> {remat.residual = "f32[4,4] from the argument w"}) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] {remat.offload = "device:pinned_host"} : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    return %s, %d, %w : tensor<4xf32>, tensor<4xf32>, tensor<4x4xf32>
  }
  func.func @main_bwd(%d: tensor<4xf32> {remat.offload = "device:pinned_host"}, %w: tensor<4x4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> tensor<4xf32> {
    %c = stablehlo.cosine %d {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    %g2 = stablehlo.multiply %g, %d : tensor<4xf32>
    %t = stablehlo.dot_general %w, %g2, contracting_dims = [0] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %t : tensor<4xf32>
  }
}

// -----

// Split, after insert-reduce-precision: @main_fwd returns the rounded residual,
// and that is what is annotated to the host.
// CHECK-LABEL: module @split_rounded
// CHECK: func.func @main_fwd
// CHECK: %[[R:.*]] = stablehlo.reduce_precision
// CHECK-NEXT: %[[H:.*]] = stablehlo.custom_call @annotate_device_placement(%[[R]]) {{.*}}_xla_buffer_placement = "pinned_host"
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[R]]
// CHECK-NEXT: return %[[S]], %[[H]]
// CHECK: func.func @main_bwd(%arg0: tensor<4xbf16> {mhlo.memory_kind = "pinned_host"
// CHECK-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%arg0) {{.*}}_xla_buffer_placement = "device"
// CHECK-NEXT: stablehlo.multiply %arg1, %[[V]]
module @split_rounded {
  func.func @main_fwd(%w: tensor<4x4xbf16>, %x: tensor<4xbf16>)
      -> (tensor<4xbf16>, tensor<4xbf16> {remat.offload = "device:pinned_host", remat.residual = "bf16[4] output of dot_general"}) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] {remat.offload = "device:pinned_host"} : (tensor<4x4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
    %r = stablehlo.reduce_precision %d, format = e8m7 : tensor<4xbf16>
    %s = stablehlo.sine %r : tensor<4xbf16>
    return %s, %r : tensor<4xbf16>, tensor<4xbf16>
  }
  func.func @main_bwd(%d: tensor<4xbf16> {remat.offload = "device:pinned_host"}, %ct: tensor<4xbf16> {remat.cotangent}) -> tensor<4xbf16> {
    %g = stablehlo.multiply %ct, %d : tensor<4xbf16>
    return %g : tensor<4xbf16>
  }
}
