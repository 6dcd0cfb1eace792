// The remat pass (--remat='policy=... mode=joint|split prevent-cse=true|false'):
// remat-partial-eval, insert-reduce-precision, place-optimization-barriers
// (when prevent-cse), annotate-host-offload and strip-checkpoint-names in one
// flag. Every RUN line rewrites the same joint function @main of a tanh layer
// whose output is named 'a'; each prefix checks one option set.
//
// RUN: remat-opt %s --remat | filecheck %s --check-prefix=EVERY
// RUN: remat-opt %s --remat='policy=dots_saveable' | filecheck %s --check-prefix=CSE
// RUN: remat-opt %s --remat='policy=dots_saveable prevent-cse=true' | filecheck %s --check-prefix=CSE
// RUN: remat-opt %s --remat='policy=dots_saveable prevent-cse=false' | filecheck %s --check-prefix=NOCSE
// RUN: remat-opt %s --remat='policy=dots_saveable mode=split' | filecheck %s --check-prefix=SPLIT
// RUN: remat-opt %s --remat='policy=save_only_these_names(a)' | filecheck %s --check-prefix=NAMES
// RUN: remat-opt %s --remat='policy=nothing_saveable' | filecheck %s --check-prefix=CLEAN
// RUN: remat-opt %s --remat='policy=offload_dot_with_no_batch_dims(device,pinned_host) mode=split' | filecheck %s --check-prefix=OFFSPLIT
// RUN: remat-opt %s --remat='policy=offload_dot_with_no_batch_dims(device,pinned_host)' | filecheck %s --check-prefix=OFFLOAD

// No policy: everything is saved, as JAX without jax.checkpoint. Nothing is
// recomputed, so there is no barrier and no rounding (insert-reduce-precision
// is skipped: forward and backward read the same values). The marker is gone.
// EVERY-LABEL: module @layer
// EVERY-NOT: remat.name
// EVERY: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0]
// EVERY-NEXT: %[[T:.*]] = stablehlo.tanh %[[D]]
// EVERY-NEXT: %[[S:.*]] = stablehlo.sine %[[T]]
// EVERY-NEXT: %[[C:.*]] = stablehlo.cosine %[[T]]
// EVERY-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[C]]
// EVERY-NEXT: stablehlo.multiply %[[T]], %[[T]]
// EVERY-NOT: reduce_precision
// EVERY-NOT: optimization_barrier
// EVERY: return %[[S]]

// dots_saveable, prevent-cse (the default, and given explicitly): the dot is
// saved (rounded), tanh and cosine are recomputed from it behind a barrier that
// also carries the cotangent, and the second group (1 - t^2 from the recomputed
// tanh) is behind a barrier that carries the first backward result. No
// bookkeeping attribute survives.
// CSE-LABEL: module @layer
// CSE-NOT: remat.name
// CSE: %[[D:.*]] = stablehlo.dot_general
// CSE-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[D]], format = e8m23
// CSE-NEXT: %[[T:.*]] = stablehlo.tanh %[[R]]
// CSE-NEXT: %[[S:.*]] = stablehlo.sine %[[T]]
// CSE-NEXT: %[[B1:.*]]:2 = stablehlo.optimization_barrier %[[R]], %arg2 :
// CSE-NEXT: %[[T2:.*]] = stablehlo.tanh %[[B1]]#0 :
// CSE-NEXT: %[[C:.*]] = stablehlo.cosine %[[T2]] :
// CSE-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[C]]
// CSE-NEXT: %[[B2:.*]]:2 = stablehlo.optimization_barrier %[[T2]], %[[G1]] :
// CSE-NEXT: %[[ONE:.*]] = stablehlo.constant dense<1.000000e+00>
// CSE-NEXT: %[[SQ:.*]] = stablehlo.multiply %[[B2]]#0, %[[B2]]#0 :
// CSE-NEXT: %[[DT:.*]] = stablehlo.subtract %[[ONE]], %[[SQ]] :
// CSE-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[DT]]
// CSE-NOT: remat.
// CSE: return %[[S]]

// prevent-cse=false: the same recomputation, without barriers; the clones read
// the saved (rounded) dot and each other directly.
// NOCSE-LABEL: module @layer
// NOCSE-NOT: optimization_barrier
// NOCSE: %[[D:.*]] = stablehlo.dot_general
// NOCSE-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[D]], format = e8m23
// NOCSE-NEXT: %[[T:.*]] = stablehlo.tanh %[[R]]
// NOCSE-NEXT: %[[S:.*]] = stablehlo.sine %[[T]]
// NOCSE-NEXT: %[[T2:.*]] = stablehlo.tanh %[[R]] :
// NOCSE-NEXT: %[[C:.*]] = stablehlo.cosine %[[T2]] :
// NOCSE-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[C]]
// NOCSE-NEXT: stablehlo.constant
// NOCSE-NEXT: stablehlo.multiply %[[T2]], %[[T2]] :
// NOCSE-NOT: optimization_barrier
// NOCSE-NOT: remat.
// NOCSE: return %[[S]]

// mode=split: @main_fwd returns the output and the residuals (both arguments,
// not rounded, and the rounded dot); @main_bwd recomputes tanh behind barriers that carry
// its cotangent argument. The forward has no barrier.
// SPLIT-LABEL: module @layer
// SPLIT: func.func @main_fwd(%arg0: tensor<4x4xf32>, %arg1: tensor<4xf32>) -> (tensor<4xf32>, tensor<4x4xf32> {remat.residual = {{.*}}}, tensor<4xf32> {remat.residual = {{.*}}}, tensor<4xf32> {remat.residual = {{.*}}})
// SPLIT: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// SPLIT-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[D]], format = e8m23
// SPLIT-NEXT: %[[T:.*]] = stablehlo.tanh %[[R]]
// SPLIT-NEXT: %[[S:.*]] = stablehlo.sine %[[T]]
// SPLIT-NEXT: return %[[S]], %arg0, %arg1, %[[R]]
// SPLIT: func.func @main_bwd(%arg0: tensor<4x4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>, %arg3: tensor<4xf32> {remat.cotangent}) -> (tensor<4x4xf32>, tensor<4xf32>)
// SPLIT-NEXT: %[[B1:.*]]:2 = stablehlo.optimization_barrier %arg2, %arg3 :
// SPLIT-NEXT: %[[T2:.*]] = stablehlo.tanh %[[B1]]#0 :
// SPLIT-NEXT: %[[C:.*]] = stablehlo.cosine %[[T2]] :
// SPLIT-NEXT: %[[G1:.*]] = stablehlo.multiply %arg3, %[[C]]
// SPLIT-NEXT: %[[B2:.*]]:2 = stablehlo.optimization_barrier %[[T2]], %[[G1]] :
// SPLIT-NOT: remat.recompute
// SPLIT: return

// save_only_these_names(a): only the named tanh output is saved (rounded;
// the marker is gone), so the dot and tanh are not recomputed: the backward's
// clones read the barrier results of the saved value.
// NAMES-LABEL: module @layer
// NAMES: %[[D:.*]] = stablehlo.dot_general
// NAMES-NEXT: %[[T:.*]] = stablehlo.tanh %[[D]]
// NAMES-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[T]], format = e8m23
// NAMES-NEXT: %[[S:.*]] = stablehlo.sine %[[R]]
// NAMES-NEXT: %[[B1:.*]]:2 = stablehlo.optimization_barrier %[[R]], %arg2 :
// NAMES-NEXT: %[[C:.*]] = stablehlo.cosine %[[B1]]#0 :
// NAMES-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[C]]
// NAMES-NEXT: %[[B2:.*]]:2 = stablehlo.optimization_barrier %[[R]], %[[G1]] :
// NAMES-NOT: stablehlo.tanh
// NAMES-NOT: remat.name
// NAMES: return %[[S]]

// nothing_saveable: only the arguments are kept; the dot itself is recomputed.
// No bookkeeping (recompute groups, barrier marks, markers) is left.
// CLEAN-LABEL: module @layer
// CLEAN-NOT: remat.recompute
// CLEAN-NOT: remat.barrier
// CLEAN-NOT: remat.name
// CLEAN: stablehlo.optimization_barrier
// CLEAN-NEXT: stablehlo.dot_general
// CLEAN-NOT: remat.recompute
// CLEAN-NOT: remat.barrier
// CLEAN-NOT: remat.name
// CLEAN: return

// offload_dot_with_no_batch_dims, joint: the dot goes to pinned_host right after
// it is made, the forward reads it on device, and the backward reads a device copy
// made right before its first use (the barrier). An offloaded residual is not
// rounded (as in JAX: the forward does not read the host copy).
// OFFLOAD-LABEL: module @layer
// OFFLOAD-NOT: reduce_precision
// OFFLOAD: %[[D:.*]] = stablehlo.dot_general
// OFFLOAD-NEXT: %[[H:.*]] = stablehlo.custom_call @annotate_device_placement(%[[D]]) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "pinned_host"}} : (tensor<4xf32>) -> tensor<4xf32>
// OFFLOAD-NEXT: %[[T:.*]] = stablehlo.tanh %[[D]]
// OFFLOAD-NEXT: %[[S:.*]] = stablehlo.sine %[[T]]
// OFFLOAD-NEXT: %[[B1:.*]]:2 = stablehlo.optimization_barrier %[[H]], %arg2 :
// OFFLOAD-NEXT: %[[V:.*]] = stablehlo.custom_call @annotate_device_placement(%[[B1]]#0) {has_side_effect = true, mhlo.frontend_attributes = {_xla_buffer_placement = "device"}} : (tensor<4xf32>) -> tensor<4xf32>
// OFFLOAD-NOT: remat.offload
// OFFLOAD: return %[[S]]

// offload_dot_with_no_batch_dims, split: the dot is returned as a pinned_host
// residual (not rounded) and annotated back to device in @main_bwd.
// OFFSPLIT-LABEL: module @layer
// OFFSPLIT-NOT: reduce_precision
// OFFSPLIT: func.func @main_fwd({{.*}}tensor<4xf32> {mhlo.memory_kind = "pinned_host", {{.*}}remat.residual = {{.*}}})
// OFFSPLIT: %[[D:.*]] = stablehlo.dot_general
// OFFSPLIT-NEXT: %[[H:.*]] = stablehlo.custom_call @annotate_device_placement(%[[D]]) {{.*}}_xla_buffer_placement = "pinned_host"
// OFFSPLIT: return {{.*}}, %[[H]] :
// OFFSPLIT: func.func @main_bwd({{.*}}%arg2: tensor<4xf32> {mhlo.memory_kind = "pinned_host"
// OFFSPLIT-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %arg2, %arg3 :
// OFFSPLIT-NEXT: stablehlo.custom_call @annotate_device_placement(%[[B]]#0) {{.*}}_xla_buffer_placement = "device"
module @layer {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4x4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %t = stablehlo.tanh %d : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%t) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %a : tensor<4xf32>
    %c = stablehlo.cosine %a : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %c : tensor<4xf32>
    %t2 = stablehlo.multiply %a, %a : tensor<4xf32>
    %one = stablehlo.constant dense<1.0> : tensor<4xf32>
    %dt = stablehlo.subtract %one, %t2 : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %dt : tensor<4xf32>
    %gw = stablehlo.dot_general %g2, %x, contracting_dims = [] x [] : (tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
    %gx = stablehlo.dot_general %w, %g2, contracting_dims = [0] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %s, %gw, %gx : tensor<4xf32>, tensor<4x4xf32>, tensor<4xf32>
  }
}
