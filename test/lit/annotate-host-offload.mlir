// RUN: remat-opt %s --annotate-host-offload --split-input-file | filecheck %s
// The scan loop pair, through remat-partial-eval first (its input is the raw export):
// RUN: sed -n '/^module @scan_pair/,/^}/p' %s | remat-opt --remat-partial-eval='policy=save_and_offload_only_these_names(names_which_can_be_saved=[], names_which_can_be_offloaded=[h], offload_src=device, offload_dst=pinned_host)' --annotate-host-offload | filecheck %s --check-prefix=SCAN
// The same loop pair in split form:
// RUN: sed -n '/^module @scan_pair/,/^}/p' %s | remat-opt --remat-partial-eval='policy=save_and_offload_only_these_names(names_which_can_be_saved=[], names_which_can_be_offloaded=[h], offload_src=device, offload_dst=pinned_host) mode=split' --annotate-host-offload | filecheck %s --check-prefix=SPLIT

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
// place-optimization-barriers): the barrier is the first backward use, so it holds
// the host value and the device copy is made from its result, right after it (as in
// JAX's split of jax.checkpoint: XLA cannot start the copy before the barrier).
// CHECK-LABEL: module @through_barrier
// CHECK: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: %[[H:.*]] = stablehlo.custom_call @annotate_device_placement(%[[D]]) {{.*}}_xla_buffer_placement = "pinned_host"
// CHECK-NEXT: %[[S:.*]] = stablehlo.sine %[[D]]
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[H]], %arg2
// CHECK-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%[[B]]#0) {{.*}}_xla_buffer_placement = "device"
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[V]]
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

// An offloaded dot that the input rounds right after it, both halves reading the
// rounded value (insert-reduce-precision does not round offloaded residuals, as
// JAX does not; a program may still have its own rounding there). The rounded
// value is the residual that moves: the host copy is made of it, the forward
// keeps reading it, the backward reads the device copy.
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

// Split, with the input's own rounding: @main_fwd returns the rounded residual,
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

// -----

// Scan loop pair (the @scan input of remat-partial-eval-scan.mlir) after an
// offload policy for 'h': per iteration, as JAX emits it for jax.checkpoint
// inside lax.scan. In the forward while body, h goes to pinned_host right
// before the reshape + dynamic_update_slice that stacks it (the forward cosine
// keeps reading h itself); in the backward while body, the slot read of h
// (dynamic_slice + reshape) comes back to the device right after it, and the
// recomputation reads that. The stacked carry-in (saved on the device) is not
// annotated.
// SCAN-LABEL: module @scan_pair
// SCAN: %[[FW:.*]]:5 = stablehlo.while(%{{[^ ]+}} = %arg1, %[[I:[^ ]+]] = %{{[^ ]+}}, %[[X:[^ ]+]] = %arg0, %[[S0:[^ ]+]] = %{{[^ ]+}}, %[[SH:[^ ]+]] = %{{[^ ]+}}) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>{{$}}
// SCAN-NOT: annotate_device_placement
// SCAN: %[[H:.*]] = stablehlo.custom_call @remat.name(%{{[^ ]+}}) {backend_config = "h", remat.offload = "device:pinned_host"}
// SCAN-NEXT: stablehlo.cosine %[[H]] : tensor<2x4xf32>
// SCAN-NEXT: stablehlo.multiply
// SCAN-NEXT: %[[U0:.*]] = stablehlo.broadcast_in_dim %[[X]], dims = [1, 2]
// SCAN-NEXT: stablehlo.dynamic_update_slice %[[S0]], %[[U0]], %[[I]],
// SCAN: %[[HH:.*]] = stablehlo.custom_call @annotate_device_placement(%[[H]]) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// SCAN-NEXT: %[[UH:.*]] = stablehlo.reshape %[[HH]] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
// SCAN-NOT: stablehlo.return
// SCAN: stablehlo.dynamic_update_slice %[[SH]], %[[UH]], %[[I]],
// SCAN-NEXT: stablehlo.return
// SCAN-NOT: annotate_device_placement
// SCAN: stablehlo.while(%{{[^ ]+}} = %arg1, %[[B0:[^ ]+]] = %[[FW]]#3, {{.*}}, %[[BH:[^ ]+]] = %[[FW]]#4) :
// SCAN-NOT: annotate_device_placement
// SCAN: %[[R0:.*]] = stablehlo.dynamic_slice %[[B0]],
// SCAN-NEXT: %[[XK:.*]] = stablehlo.reshape %[[R0]]
// SCAN-NOT: annotate_device_placement
// SCAN: %[[RH:.*]] = stablehlo.dynamic_slice %[[BH]], %{{[^ ]+}}, %{{[^ ]+}}, %{{[^ ]+}}, sizes = [1, 2, 4]
// SCAN-NEXT: %[[HK:.*]] = stablehlo.reshape %[[RH]] : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
// SCAN-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%[[HK]]) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<2x4xf32>) -> tensor<2x4xf32>
// SCAN-NEXT: stablehlo.cosine %[[V]] {remat.recompute
// SCAN-NOT: annotate_device_placement
// SCAN: stablehlo.sine %[[V]] {remat.recompute
// SCAN-NOT: annotate_device_placement
// SCAN: stablehlo.dot_general %[[XK]], %{{[^ ]+}}, contracting_dims = [1] x [0] {remat.recompute
// SCAN-NOT: annotate_device_placement
// SCAN: stablehlo.return
// SCAN-NOT: annotate_device_placement
// SCAN: return
//
// Split form: the stack of h crosses between the halves in host memory, and
// is moved slot by slot as JAX's split of an offloading scan does: the forward
// loop sends each slot to pinned_host as it writes it, so the stack is built in
// host memory and returned as it is (no annotation at the return); the backward
// loop brings back the one slot each iteration reads. Neither half moves, or
// holds on the device, the whole stack.
// SPLIT-LABEL: module @scan_pair
// SPLIT: func.func @main_fwd({{.*}}, tensor<3x2x4xf32> {mhlo.memory_kind = "pinned_host", remat.offload = "device:pinned_host", remat.residual = "f32[3,2,4] named 'h'
// SPLIT: %[[FW:.*]]:5 = stablehlo.while(
// SPLIT-NOT: annotate_device_placement
// SPLIT: %[[H:.*]] = stablehlo.custom_call @remat.name(
// SPLIT: %[[HH:.*]] = stablehlo.custom_call @annotate_device_placement(%[[H]]) {{.*}}_xla_buffer_placement = "pinned_host"
// SPLIT-NEXT: %[[UH:.*]] = stablehlo.reshape %[[HH]] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
// SPLIT-NOT: stablehlo.return
// SPLIT: stablehlo.dynamic_update_slice %{{[^ ]+}}, %[[UH]],
// SPLIT-NEXT: stablehlo.return
// SPLIT-NOT: annotate_device_placement
// SPLIT: return %[[FW]]#2, %arg1, %[[FW]]#3, %[[FW]]#4 :
// SPLIT: func.func @main_bwd({{.*}}, %arg2: tensor<3x2x4xf32> {mhlo.memory_kind = "pinned_host", remat.offload = "device:pinned_host"}
// SPLIT-NOT: annotate_device_placement
// SPLIT: stablehlo.while({{.*}}, %[[BH:[^ ]+]] = %arg2) :
// SPLIT-NOT: annotate_device_placement
// SPLIT: %[[RH:.*]] = stablehlo.dynamic_slice %[[BH]], %{{[^ ]+}}, %{{[^ ]+}}, %{{[^ ]+}}, sizes = [1, 2, 4]
// SPLIT-NEXT: %[[HK:.*]] = stablehlo.reshape %[[RH]] : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
// SPLIT-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%[[HK]]) {{.*}}_xla_buffer_placement = "device"
// SPLIT-NEXT: stablehlo.cosine %[[V]] {remat.recompute
// SPLIT-NOT: annotate_device_placement
// SPLIT: return
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
