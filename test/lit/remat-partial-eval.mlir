// Every RUN line processes every case below; each check prefix only has checks
// in the cases it is about. Cases are modules named after what they test
// (remat-partial-eval rewrites @main, so the module name is the label).
//
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=everything_saveable' | filecheck %s --check-prefix=EVERY
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=NOTHING
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=dots_saveable' | filecheck %s --check-prefix=DOTS
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=dots_with_no_batch_dims_saveable' | filecheck %s --check-prefix=NOBATCH
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=save_only_these_names(a)' | filecheck %s --check-prefix=ONLY
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=save_any_names_but_these(a)' | filecheck %s --check-prefix=ANYBUT
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=save_anything_except_these_names(a)' | filecheck %s --check-prefix=EXCEPT
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=save_from_both_policies(dots_saveable, save_only_these_names(a))' | filecheck %s --check-prefix=BOTH
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=offload_dot_with_no_batch_dims(device,pinned_host)' | filecheck %s --check-prefix=OFFLOAD
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=save_and_offload_only_these_names(names_which_can_be_saved=[a],names_which_can_be_offloaded=[b],offload_src=device,offload_dst=pinned_host)' | filecheck %s --check-prefix=SAVEOFF
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=dots_saveable mode=split' | filecheck %s --check-prefix=SPLIT

// everything_saveable: nothing is cloned, whatever it is (a dot, named or
// unnamed values); the backward reads the forward values.
// EVERY-LABEL: module @everything_saveable
// EVERY: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// EVERY-NEXT: %[[S:.*]] = stablehlo.sine %[[D]] :
// EVERY-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "a"} :
// EVERY-NEXT: %[[C:.*]] = stablehlo.cosine %[[D]] :
// EVERY-NEXT: %[[B:.*]] = stablehlo.custom_call @remat.name(%[[C]]) {backend_config = "b"} :
// EVERY-NEXT: %[[E:.*]] = stablehlo.exponential %[[A]] :
// EVERY-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[B]]
// EVERY-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[A]]
// EVERY-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %[[E]]
// EVERY-NEXT: return %[[A]], %[[G3]]
module @everything_saveable {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%s) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %c = stablehlo.cosine %d : tensor<4xf32>
    %b = stablehlo.custom_call @remat.name(%c) {backend_config = "b"} : (tensor<4xf32>) -> tensor<4xf32>
    %e = stablehlo.exponential %a : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %b : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %a : tensor<4xf32>
    %g3 = stablehlo.multiply %g2, %e : tensor<4xf32>
    return %a, %g3 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// nothing_saveable: only the arguments are kept. The dot, both named values
// and the exponential are recomputed from them (the recomputed dot is shared),
// and the forward copies the forward pass does not need are gone.
// NOTHING-LABEL: module @nothing_saveable
// NOTHING: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] :
// NOTHING-NEXT: %[[S:.*]] = stablehlo.sine %[[D]] :
// NOTHING-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "a"} :
// NOTHING-NEXT: %[[D2:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] {remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[C2:.*]] = stablehlo.cosine %[[D2]] {remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[B2:.*]] = stablehlo.custom_call @remat.name(%[[C2]]) {backend_config = "b", remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[B2]]
// NOTHING-NEXT: %[[S2:.*]] = stablehlo.sine %[[D2]] {remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[A2:.*]] = stablehlo.custom_call @remat.name(%[[S2]]) {backend_config = "a", remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[A2]]
// NOTHING-NEXT: %[[E2:.*]] = stablehlo.exponential %[[A2]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %[[E2]]
// NOTHING-NEXT: return %[[A]], %[[G3]]
module @nothing_saveable {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%s) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %c = stablehlo.cosine %d : tensor<4xf32>
    %b = stablehlo.custom_call @remat.name(%c) {backend_config = "b"} : (tensor<4xf32>) -> tensor<4xf32>
    %e = stablehlo.exponential %a : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %b : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %a : tensor<4xf32>
    %g3 = stablehlo.multiply %g2, %e : tensor<4xf32>
    return %a, %g3 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// dots_saveable: both dot_generals (with and without batching dims) are saved
// and never cloned; tanh, the 'a' marker and the cosines are recomputed from
// them, in dependency order.
// DOTS-LABEL: module @dots_saveable
// DOTS: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] :
// DOTS: %[[BD:.*]] = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [1] :
// DOTS-NOT: stablehlo.dot_general
// DOTS: %[[T:.*]] = stablehlo.tanh %[[D]] {remat.recompute = {{[0-9]+}} : i64}
// DOTS-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[T]]) {backend_config = "a", remat.recompute = {{[0-9]+}} : i64}
// DOTS-NEXT: %[[C:.*]] = stablehlo.cosine %[[A]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// DOTS-NEXT: stablehlo.multiply %arg4, %[[C]]
// DOTS-NEXT: %[[BC:.*]] = stablehlo.cosine %[[BD]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// DOTS-NEXT: stablehlo.multiply %arg5, %[[BC]]
// DOTS-NEXT: return
module @dots_saveable {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %bw: tensor<2x3x4xf32>, %bx: tensor<2x4x5xf32>,
                  %ct: tensor<4xf32> {remat.cotangent}, %bct: tensor<2x3x5xf32> {remat.cotangent})
      -> (tensor<4xf32>, tensor<2x3x5xf32>, tensor<4xf32>, tensor<2x3x5xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %t = stablehlo.tanh %d : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%t) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %a : tensor<4xf32>
    %c = stablehlo.cosine %a : tensor<4xf32>
    %bd = stablehlo.dot_general %bw, %bx, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
    %bs = stablehlo.sine %bd : tensor<2x3x5xf32>
    %bc = stablehlo.cosine %bd : tensor<2x3x5xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    %bg = stablehlo.multiply %bct, %bc : tensor<2x3x5xf32>
    return %s, %bs, %g, %bg : tensor<4xf32>, tensor<2x3x5xf32>, tensor<4xf32>, tensor<2x3x5xf32>
  }
}

// -----

// dots_with_no_batch_dims_saveable: the dot_general without batching dims is
// saved, the batched one is recomputed from the arguments.
// NOBATCH-LABEL: module @dots_with_no_batch_dims_saveable
// NOBATCH: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] :
// NOBATCH: %[[BD:.*]] = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [1] :
// NOBATCH: %[[C:.*]] = stablehlo.cosine %[[D]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOBATCH-NEXT: %[[G:.*]] = stablehlo.multiply %arg4, %[[C]]
// NOBATCH-NEXT: %[[BD2:.*]] = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [1] {remat.recompute = {{[0-9]+}} : i64}
// NOBATCH-NEXT: %[[BC:.*]] = stablehlo.cosine %[[BD2]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOBATCH-NEXT: %[[BG:.*]] = stablehlo.multiply %arg5, %[[BC]]
// NOBATCH-NEXT: return
module @dots_with_no_batch_dims_saveable {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %bw: tensor<2x3x4xf32>, %bx: tensor<2x4x5xf32>,
                  %ct: tensor<4xf32> {remat.cotangent}, %bct: tensor<2x3x5xf32> {remat.cotangent})
      -> (tensor<4xf32>, tensor<2x3x5xf32>, tensor<4xf32>, tensor<2x3x5xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %c = stablehlo.cosine %d : tensor<4xf32>
    %bd = stablehlo.dot_general %bw, %bx, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
    %bs = stablehlo.sine %bd : tensor<2x3x5xf32>
    %bc = stablehlo.cosine %bd : tensor<2x3x5xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    %bg = stablehlo.multiply %bct, %bc : tensor<2x3x5xf32>
    return %s, %bs, %g, %bg : tensor<4xf32>, tensor<2x3x5xf32>, tensor<4xf32>, tensor<2x3x5xf32>
  }
}

// -----

// save_only_these_names(a): the value named 'a' is read directly by the
// backward; 'b' and what depends on it are recomputed from 'a'.
// ONLY-LABEL: module @save_only_these_names
// ONLY: %[[S:.*]] = stablehlo.sine %arg0
// ONLY-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "a"} :
// ONLY-NEXT: %[[C:.*]] = stablehlo.cosine %[[A]] :
// ONLY-NEXT: %[[B:.*]] = stablehlo.custom_call @remat.name(%[[C]]) {backend_config = "b"} :
// ONLY-NEXT: %[[E:.*]] = stablehlo.exponential %[[B]] :
// ONLY-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[A]]
// ONLY-NEXT: %[[C2:.*]] = stablehlo.cosine %[[A]] {remat.recompute = {{[0-9]+}} : i64}
// ONLY-NEXT: %[[B2:.*]] = stablehlo.custom_call @remat.name(%[[C2]]) {backend_config = "b", remat.recompute = {{[0-9]+}} : i64}
// ONLY-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[B2]]
// ONLY-NEXT: %[[E2:.*]] = stablehlo.exponential %[[B2]] {remat.recompute = {{[0-9]+}} : i64}
// ONLY-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %[[E2]]
// ONLY-NEXT: return %[[E]], %[[G3]]
module @save_only_these_names {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%s) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %c = stablehlo.cosine %a : tensor<4xf32>
    %b = stablehlo.custom_call @remat.name(%c) {backend_config = "b"} : (tensor<4xf32>) -> tensor<4xf32>
    %e = stablehlo.exponential %b : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %a : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %b : tensor<4xf32>
    %g3 = stablehlo.multiply %g2, %e : tensor<4xf32>
    return %e, %g3 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// save_any_names_but_these(a): named values other than 'a' are saved ('b');
// 'a' is recomputed from the argument, and the unnamed exponential from 'b'.
// ANYBUT-LABEL: module @save_any_names_but_these
// ANYBUT: %[[S:.*]] = stablehlo.sine %arg0 :
// ANYBUT-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "a"} :
// ANYBUT-NEXT: %[[C:.*]] = stablehlo.cosine %[[A]] :
// ANYBUT-NEXT: %[[B:.*]] = stablehlo.custom_call @remat.name(%[[C]]) {backend_config = "b"} :
// ANYBUT-NEXT: %[[E:.*]] = stablehlo.exponential %[[B]] :
// ANYBUT-NEXT: %[[S2:.*]] = stablehlo.sine %arg0 {remat.recompute = {{[0-9]+}} : i64}
// ANYBUT-NEXT: %[[A2:.*]] = stablehlo.custom_call @remat.name(%[[S2]]) {backend_config = "a", remat.recompute = {{[0-9]+}} : i64}
// ANYBUT-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[A2]]
// ANYBUT-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[B]]
// ANYBUT-NEXT: %[[E2:.*]] = stablehlo.exponential %[[B]] {remat.recompute = {{[0-9]+}} : i64}
// ANYBUT-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %[[E2]]
// ANYBUT-NEXT: return %[[E]], %[[G3]]
module @save_any_names_but_these {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%s) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %c = stablehlo.cosine %a : tensor<4xf32>
    %b = stablehlo.custom_call @remat.name(%c) {backend_config = "b"} : (tensor<4xf32>) -> tensor<4xf32>
    %e = stablehlo.exponential %b : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %a : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %b : tensor<4xf32>
    %g3 = stablehlo.multiply %g2, %e : tensor<4xf32>
    return %e, %g3 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// save_anything_except_these_names(a): everything but 'a' is saved; only the
// 'a' marker is re-applied (to the saved sine), 'b' and the exponential are
// read directly.
// EXCEPT-LABEL: module @save_anything_except_these_names
// EXCEPT: %[[S:.*]] = stablehlo.sine %arg0 :
// EXCEPT-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "a"} :
// EXCEPT-NEXT: %[[C:.*]] = stablehlo.cosine %[[A]] :
// EXCEPT-NEXT: %[[B:.*]] = stablehlo.custom_call @remat.name(%[[C]]) {backend_config = "b"} :
// EXCEPT-NEXT: %[[E:.*]] = stablehlo.exponential %[[B]] :
// EXCEPT-NEXT: %[[A2:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "a", remat.recompute = {{[0-9]+}} : i64}
// EXCEPT-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[A2]]
// EXCEPT-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[B]]
// EXCEPT-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %[[E]]
// EXCEPT-NEXT: return %[[E]], %[[G3]]
module @save_anything_except_these_names {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%s) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %c = stablehlo.cosine %a : tensor<4xf32>
    %b = stablehlo.custom_call @remat.name(%c) {backend_config = "b"} : (tensor<4xf32>) -> tensor<4xf32>
    %e = stablehlo.exponential %b : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %a : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %b : tensor<4xf32>
    %g3 = stablehlo.multiply %g2, %e : tensor<4xf32>
    return %e, %g3 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// save_from_both_policies(dots_saveable, save_only_these_names(a)): the dot
// (first policy) and 'a' (second policy) are saved; tanh and cosine, saved by
// neither, are recomputed from them.
// BOTH-LABEL: module @save_from_both_policies
// BOTH: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1
// BOTH-NEXT: %[[T:.*]] = stablehlo.tanh %[[D]] :
// BOTH-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[T]]) {backend_config = "a"} :
// BOTH-NEXT: %[[S:.*]] = stablehlo.sine %[[A]] :
// BOTH-NOT: stablehlo.dot_general
// BOTH-NOT: @remat.name
// BOTH: %[[C:.*]] = stablehlo.cosine %[[A]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// BOTH-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[C]]
// BOTH-NEXT: %[[T2:.*]] = stablehlo.tanh %[[D]] {remat.recompute = {{[0-9]+}} : i64}
// BOTH-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[T2]]
// BOTH-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %[[D]]
// BOTH-NEXT: return %[[S]], %[[G3]]
module @save_from_both_policies {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %t = stablehlo.tanh %d : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%t) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %a : tensor<4xf32>
    %c = stablehlo.cosine %a : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %c : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %t : tensor<4xf32>
    %g3 = stablehlo.multiply %g2, %d : tensor<4xf32>
    return %s, %g3 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// offload_dot_with_no_batch_dims(device,pinned_host): the unbatched dot is
// kept and marked for offloading; the batched one is recomputed, unmarked.
// OFFLOAD-LABEL: module @offload_dot_with_no_batch_dims
// OFFLOAD: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] {remat.offload = "device:pinned_host"} :
// OFFLOAD: %[[BD:.*]] = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [1] :
// OFFLOAD: %[[C:.*]] = stablehlo.cosine %[[D]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// OFFLOAD-NEXT: stablehlo.multiply %arg4, %[[C]]
// OFFLOAD-NEXT: %[[BD2:.*]] = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [1] {remat.recompute = {{[0-9]+}} : i64}
// OFFLOAD-NEXT: %[[BC:.*]] = stablehlo.cosine %[[BD2]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// OFFLOAD-NEXT: stablehlo.multiply %arg5, %[[BC]]
// OFFLOAD-NEXT: return
module @offload_dot_with_no_batch_dims {
  func.func @main(%w: tensor<4x4xf32>, %x: tensor<4xf32>, %bw: tensor<2x3x4xf32>, %bx: tensor<2x4x5xf32>,
                  %ct: tensor<4xf32> {remat.cotangent}, %bct: tensor<2x3x5xf32> {remat.cotangent})
      -> (tensor<4xf32>, tensor<2x3x5xf32>, tensor<4xf32>, tensor<2x3x5xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %d : tensor<4xf32>
    %c = stablehlo.cosine %d : tensor<4xf32>
    %bd = stablehlo.dot_general %bw, %bx, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
    %bs = stablehlo.sine %bd : tensor<2x3x5xf32>
    %bc = stablehlo.cosine %bd : tensor<2x3x5xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    %bg = stablehlo.multiply %bct, %bc : tensor<2x3x5xf32>
    return %s, %bs, %g, %bg : tensor<4xf32>, tensor<2x3x5xf32>, tensor<4xf32>, tensor<2x3x5xf32>
  }
}

// -----

// save_and_offload_only_these_names: 'a' is saved on device (no offload mark),
// 'b' is saved and marked for offloading, the exponential is recomputed from 'b'.
// SAVEOFF-LABEL: module @save_and_offload_only_these_names
// SAVEOFF: %[[S:.*]] = stablehlo.sine %arg0 :
// SAVEOFF-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "a"} :
// SAVEOFF-NEXT: %[[C:.*]] = stablehlo.cosine %[[A]] :
// SAVEOFF-NEXT: %[[B:.*]] = stablehlo.custom_call @remat.name(%[[C]]) {backend_config = "b", remat.offload = "device:pinned_host"} :
// SAVEOFF-NEXT: %[[E:.*]] = stablehlo.exponential %[[B]] :
// SAVEOFF-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[A]]
// SAVEOFF-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[B]]
// SAVEOFF-NEXT: %[[E2:.*]] = stablehlo.exponential %[[B]] {remat.recompute = {{[0-9]+}} : i64}
// SAVEOFF-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %[[E2]]
// SAVEOFF-NEXT: return %[[E]], %[[G3]]
module @save_and_offload_only_these_names {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %a = stablehlo.custom_call @remat.name(%s) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32>
    %c = stablehlo.cosine %a : tensor<4xf32>
    %b = stablehlo.custom_call @remat.name(%c) {backend_config = "b"} : (tensor<4xf32>) -> tensor<4xf32>
    %e = stablehlo.exponential %b : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %a : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %b : tensor<4xf32>
    %g3 = stablehlo.multiply %g2, %e : tensor<4xf32>
    return %e, %g3 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// Just-in-time placement: each recomputation sits right before the first
// backward op that needs it, after the backward ops before that one; none is
// hoisted to the start of the backward pass. Only the backward read the cosine
// and the exponential: their forward copies go, and their clones are marked as
// moved (no extra cost), while the sine, a primal output, stays in the forward.
// NOTHING-LABEL: module @just_in_time
// NOTHING: %[[S:.*]] = stablehlo.sine %arg0 :
// NOTHING-NOT: stablehlo.cosine
// NOTHING-NOT: stablehlo.exponential
// NOTHING: %[[G1:.*]] = stablehlo.multiply %arg1, %arg1
// NOTHING-NEXT: %[[C:.*]] = stablehlo.cosine %arg0 {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[C]]
// NOTHING-NEXT: %[[G3:.*]] = stablehlo.add %[[G2]], %[[G1]]
// NOTHING-NEXT: %[[E:.*]] = stablehlo.exponential %arg0 {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[G4:.*]] = stablehlo.multiply %[[G3]], %[[E]]
// NOTHING-NEXT: return %[[S]], %[[G4]]
module @just_in_time {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32>
    %c = stablehlo.cosine %x : tensor<4xf32>
    %e = stablehlo.exponential %x : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %ct : tensor<4xf32>
    %g2 = stablehlo.multiply %g1, %c : tensor<4xf32>
    %g3 = stablehlo.add %g2, %g1 : tensor<4xf32>
    %g4 = stablehlo.multiply %g3, %e : tensor<4xf32>
    return %s, %g4 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// Constants and iota never become residuals: even when everything may be
// saved, the backward gets its own copies, placed just in time.
// EVERY-LABEL: module @constants
// EVERY: %[[K:.*]] = stablehlo.constant dense<2.000000e+00>
// EVERY-NEXT: %[[M:.*]] = stablehlo.multiply %arg0, %[[K]]
// EVERY-NEXT: %[[K2:.*]] = stablehlo.constant {remat.recompute = {{[0-9]+}} : i64} dense<2.000000e+00>
// EVERY-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[K2]]
// EVERY-NEXT: %[[I:.*]] = stablehlo.iota dim = 0 {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// EVERY-NEXT: %[[G2:.*]] = stablehlo.add %[[G1]], %[[I]]
// EVERY-NEXT: return %[[M]], %[[G2]]
module @constants {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %k = stablehlo.constant dense<2.0> : tensor<4xf32>
    %i = stablehlo.iota dim = 0 : tensor<4xf32>
    %m = stablehlo.multiply %x, %k : tensor<4xf32>
    %g1 = stablehlo.multiply %ct, %k : tensor<4xf32>
    %g2 = stablehlo.add %g1, %i : tensor<4xf32>
    return %m, %g2 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// A side-effecting custom_call is never duplicated, even under
// nothing_saveable: its result is saved and the pure ops after it are
// recomputed from that result.
// NOTHING-LABEL: module @side_effect
// NOTHING-COUNT-1: %[[R:.*]] = stablehlo.custom_call @effect(%arg0) {has_side_effect = true}
// NOTHING-NOT: @effect
// NOTHING: %[[S:.*]] = stablehlo.sine %[[R]] {remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[C:.*]] = stablehlo.cosine %[[S]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: stablehlo.multiply %arg1, %[[C]]
// NOTHING-NOT: @effect
module @side_effect {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %r = stablehlo.custom_call @effect(%x) {has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
    %s = stablehlo.sine %r : tensor<4xf32>
    %c = stablehlo.cosine %s : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    return %s, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// A remat region (a remat[1] name-stack frame, policy recorded in the module):
// the region input (the first exponential) and the value after the region are
// saved under the module-level everything_saveable; inside the region,
// nothing_saveable recomputes both cosines (and the sine one needs) from the
// saved input.
// EVERY-LABEL: module @region
// EVERY: %[[Y:.*]] = stablehlo.exponential %arg0 :
// EVERY-NEXT: %[[A:.*]] = stablehlo.sine %[[Y]] :
// EVERY-NEXT: %[[B:.*]] = stablehlo.sine %[[A]] :
// EVERY-NEXT: %[[E:.*]] = stablehlo.exponential %[[B]] :
// EVERY-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[E]]
// EVERY-NEXT: %[[A2:.*]] = stablehlo.sine %[[Y]] {remat.recompute = {{[0-9]+}} : i64}
// EVERY-NEXT: %[[CA:.*]] = stablehlo.cosine %[[A2]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// EVERY-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[CA]]
// EVERY-NEXT: %[[CY:.*]] = stablehlo.cosine %[[Y]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// EVERY-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %[[CY]]
// EVERY-NEXT: %[[G4:.*]] = stablehlo.multiply %[[G3]], %[[Y]]
// EVERY-NEXT: return %[[E]], %[[G4]]

// Region inputs are saved whatever the module-level policy: under
// nothing_saveable the region input is still read, not recomputed, while the
// exponential after the region is recomputed (through the region) from it.
// NOTHING-LABEL: module @region
// NOTHING: %[[Y:.*]] = stablehlo.exponential %arg0 :
// NOTHING-NOT: stablehlo.exponential %arg0
// NOTHING: %[[A2:.*]] = stablehlo.sine %[[Y]] {remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[B2:.*]] = stablehlo.sine %[[A2]] {remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[E2:.*]] = stablehlo.exponential %[[B2]] {remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: stablehlo.multiply %arg1, %[[E2]]
// NOTHING-NOT: stablehlo.exponential %arg0
// NOTHING: stablehlo.cosine %[[Y]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NOT: stablehlo.exponential %arg0
// NOTHING: return
module @region attributes {remat.regions = {"remat[1]" = "nothing_saveable"}} {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %y = stablehlo.exponential %x : tensor<4xf32> loc("jit(f)/jvp()/exp"("f.py":2:4))
    %a = stablehlo.sine %y : tensor<4xf32> loc("jit(f)/jvp(remat[1])/sin"("f.py":3:4))
    %ca = stablehlo.cosine %y : tensor<4xf32> loc("jit(f)/jvp(remat[1])/cos"("f.py":3:4))
    %b = stablehlo.sine %a : tensor<4xf32> loc("jit(f)/jvp(remat[1])/sin"("f.py":4:4))
    %cb = stablehlo.cosine %a : tensor<4xf32> loc("jit(f)/jvp(remat[1])/cos"("f.py":4:4))
    %e = stablehlo.exponential %b : tensor<4xf32> loc("jit(f)/jvp()/exp"("f.py":5:4))
    %g1 = stablehlo.multiply %ct, %e : tensor<4xf32> loc("jit(f)/transpose(jvp())/mul"("f.py":5:4))
    %g2 = stablehlo.multiply %g1, %cb : tensor<4xf32> loc("jit(f)/transpose(jvp(remat[1]))/mul"("f.py":4:4))
    %g3 = stablehlo.multiply %g2, %ca : tensor<4xf32> loc("jit(f)/transpose(jvp(remat[1]))/mul"("f.py":3:4))
    %g4 = stablehlo.multiply %g3, %y : tensor<4xf32> loc("jit(f)/transpose(jvp())/mul"("f.py":2:4))
    return %e, %g4 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// The policy recorded for a region is the one applied inside it (here
// save_only_these_names('a'), not the nothing_saveable default of regions):
// 'a' is read by the backward, the tanh and cosine are recomputed from it.
// EVERY-LABEL: module @region_recorded_policy
// EVERY: %[[S:.*]] = stablehlo.sine %arg0 :
// EVERY-NEXT: %[[A:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "a"} :
// EVERY-NEXT: %[[T:.*]] = stablehlo.tanh %[[A]] :
// EVERY-NEXT: %[[T2:.*]] = stablehlo.tanh %[[A]] {remat.recompute = {{[0-9]+}} : i64}
// EVERY-NEXT: %[[G1:.*]] = stablehlo.multiply %arg1, %[[T2]]
// EVERY-NEXT: %[[C:.*]] = stablehlo.cosine %[[A]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// EVERY-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G1]], %[[C]]
// EVERY-NEXT: return %[[T]], %[[G2]]
module @region_recorded_policy attributes {remat.regions = {"remat[2]" = "save_only_these_names('a')"}} {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %s = stablehlo.sine %x : tensor<4xf32> loc("jit(f)/jvp(remat[2])/sin"("f.py":3:4))
    %a = stablehlo.custom_call @remat.name(%s) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32> loc("jit(f)/jvp(remat[2])/name"("f.py":3:4))
    %t = stablehlo.tanh %a : tensor<4xf32> loc("jit(f)/jvp(remat[2])/tanh"("f.py":4:4))
    %c = stablehlo.cosine %a : tensor<4xf32> loc("jit(f)/jvp(remat[2])/cos"("f.py":4:4))
    %g1 = stablehlo.multiply %ct, %t : tensor<4xf32> loc("jit(f)/transpose(jvp(remat[2]))/mul"("f.py":4:4))
    %g2 = stablehlo.multiply %g1, %c : tensor<4xf32> loc("jit(f)/transpose(jvp(remat[2]))/mul"("f.py":4:4))
    return %t, %g2 : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// No remat.cotangent argument: the backward is found from `transpose(` frames
// in the name stacks, plus everything depending on them (the parameter update
// `sub` has no transpose frame). Its operand `w*w`, outside the differentiated
// function (no `jvp(` frame) and made of the arguments alone, is backward too
// (a step's optimizer term of its own state): computed where it is, as jax.jit
// does, neither a residual nor a recomputation.
// NOTHING-LABEL: module @transpose_name_stacks
// NOTHING: %[[M:.*]] = stablehlo.multiply %arg0, %arg1 :
// NOTHING-NEXT: %[[S:.*]] = stablehlo.sine %[[M]] :
// NOTHING-NEXT: %[[SQ:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xf32>
// NOTHING-NEXT: %[[ONE:.*]] = stablehlo.constant dense<1.000000e+00>
// NOTHING-NEXT: %[[M2:.*]] = stablehlo.multiply %arg0, %arg1 {remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[C:.*]] = stablehlo.cosine %[[M2]] {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// NOTHING-NEXT: %[[G1:.*]] = stablehlo.multiply %[[ONE]], %[[C]]
// NOTHING-NEXT: %[[GW:.*]] = stablehlo.multiply %[[G1]], %arg1
// NOTHING-NEXT: %[[NEW:.*]] = stablehlo.subtract %[[GW]], %[[SQ]]
// NOTHING-NEXT: return %[[S]], %[[NEW]]
module @transpose_name_stacks {
  func.func @main(%w: tensor<4xf32>, %x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
    %m = stablehlo.multiply %w, %x : tensor<4xf32> loc("jit(step)/jvp()/mul"("f.py":2:4))
    %s = stablehlo.sine %m : tensor<4xf32> loc("jit(step)/jvp()/sin"("f.py":3:4))
    %c = stablehlo.cosine %m : tensor<4xf32> loc("jit(step)/jvp()/cos"("f.py":3:4))
    %sq = stablehlo.multiply %w, %w : tensor<4xf32> loc("jit(step)/mul"("f.py":9:4))
    %one = stablehlo.constant dense<1.0> : tensor<4xf32> loc("jit(step)/transpose(jvp())/broadcast_in_dim"("f.py":3:4))
    %g1 = stablehlo.multiply %one, %c : tensor<4xf32> loc("jit(step)/transpose(jvp())/mul"("f.py":3:4))
    %gw = stablehlo.multiply %g1, %x : tensor<4xf32> loc("jit(step)/transpose(jvp())/mul"("f.py":2:4))
    %new = stablehlo.subtract %gw, %sq : tensor<4xf32> loc("jit(step)/sub"("f.py":9:4))
    return %s, %new : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// mode=split: @main_fwd returns the outputs then the residuals (arguments
// first, then values in program order), each described in a remat.residual
// result attribute; @main_bwd takes the residuals then the cotangents.
// SPLIT-LABEL: module @split
// SPLIT-NOT: func.func @main(
// SPLIT: func.func @main_fwd(%arg0: tensor<4x4xf32>, %arg1: tensor<4xf32>)
// SPLIT-SAME: -> (tensor<4xf32>, tensor<4xf32> {remat.residual = "f32[4] from the argument x"}, tensor<4xf32> {remat.residual = "f32[4] output of dot_general from f.py:2:8 (f)"})
// SPLIT-NEXT: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] :
// SPLIT-NEXT: %[[S:.*]] = stablehlo.sine %[[D]] :
// SPLIT-NEXT: return %[[S]], %arg1, %[[D]] :
// SPLIT: func.func @main_bwd(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32> {remat.cotangent}) -> tensor<4x4xf32>
// SPLIT-NEXT: %[[C:.*]] = stablehlo.cosine %arg1 {remat.moved, remat.recompute = {{[0-9]+}} : i64}
// SPLIT-NEXT: %[[GC:.*]] = stablehlo.multiply %arg2, %[[C]]
// SPLIT-NEXT: %[[GW:.*]] = stablehlo.dot_general %[[GC]], %arg0, contracting_dims = [] x [] :
// SPLIT-NEXT: return %[[GW]] :
// SPLIT-NOT: func.func @main(
module @split {
  func.func @main(%w: tensor<4x4xf32> loc("w"), %x: tensor<4xf32> loc("x"), %ct: tensor<4xf32> {remat.cotangent} loc("ct")) -> (tensor<4xf32>, tensor<4x4xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32> loc("jit(f)/jvp()/dot_general"("f"("f.py":2:8)))
    %s = stablehlo.sine %d : tensor<4xf32> loc("jit(f)/jvp()/sin"("f"("f.py":3:8)))
    %c = stablehlo.cosine %d : tensor<4xf32> loc("jit(f)/jvp()/cos"("f"("f.py":3:8)))
    %gc = stablehlo.multiply %ct, %c : tensor<4xf32> loc("jit(f)/transpose(jvp())/mul"("f"("f.py":3:8)))
    %gw = stablehlo.dot_general %gc, %x, contracting_dims = [] x [] : (tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32> loc("jit(f)/transpose(jvp())/dot_general"("f"("f.py":2:8)))
    return %s, %gw : tensor<4xf32>, tensor<4x4xf32>
  }
}

// -----

// A clone smaller than the clone it is computed from, read later than that one
// (a ReLU mask), is made where its input is made, in that group: the 256-byte
// pre-activation then dies there instead of living until the select.
// NOTHING-LABEL: module @narrowing_made_early
// NOTHING: %[[D:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] {remat.recompute = [[G:[0-9]+]] : i64}
// NOTHING-NEXT: %[[Z:.*]] = stablehlo.constant {remat.recompute = [[G]] : i64}
// NOTHING-NEXT: %[[R:.*]] = stablehlo.maximum %[[D]], %[[Z]] {remat.recompute = [[G]] : i64}
// NOTHING-NEXT: %[[M:.*]] = stablehlo.compare GT, %[[D]], %[[Z]] {remat.moved, remat.recompute = [[G]] : i64}
// NOTHING-NEXT: %[[G1:.*]] = stablehlo.multiply %arg2, %[[R]]
// NOTHING-NEXT: stablehlo.select %[[M]], %[[G1]], %[[Z]]
module @narrowing_made_early {
  func.func @main(%w: tensor<64x64xf32>, %x: tensor<64xf32>, %ct: tensor<64xf32> {remat.cotangent}) -> (tensor<64xf32>, tensor<64xf32>) {
    %d = stablehlo.dot_general %w, %x, contracting_dims = [1] x [0] : (tensor<64x64xf32>, tensor<64xf32>) -> tensor<64xf32>
    %z = stablehlo.constant dense<0.0> : tensor<64xf32>
    %r = stablehlo.maximum %d, %z : tensor<64xf32>
    %m = stablehlo.compare GT, %d, %z : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xi1>
    %g1 = stablehlo.multiply %ct, %r : tensor<64xf32>
    %g2 = stablehlo.select %m, %g1, %z : tensor<64xi1>, tensor<64xf32>
    return %r, %g2 : tensor<64xf32>, tensor<64xf32>
  }
}
