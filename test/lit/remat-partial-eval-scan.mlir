// Per-iteration remat through lax.scan forward/backward while pairs
// (remat_passes/scan.py). Inputs are hand-trimmed exports of
// export_vjp(lambda x, Ws: jax.lax.scan(layer, x, Ws)[0], x, Ws) with x f32[2,4]
// and Ws f32[3,4,4] (private calls inlined; @invariant_threaded's backward has
// no bias gradient). Every RUN line processes every case;
// each check prefix only has checks in the cases it is about.
//
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=NOTHING
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=save_only_these_names(h)' | filecheck %s --check-prefix=NAMES
// RUN: remat-opt %s --split-input-file --remat-partial-eval='policy=everything_saveable' | filecheck %s --check-prefix=EVERY
// RUN: remat-opt %s --split-input-file --remat-partial-eval | filecheck %s --check-prefix=EVERY
// RUN: remat-opt %s --split-input-file --print-saved-residuals | filecheck %s --check-prefix=RES
// RUN: remat-opt %s --split-input-file --print-saved-residuals --remat-partial-eval='policy=save_only_these_names(h)' | filecheck %s --check-prefix=RESNAMES
// RUN: remat-opt %s --split-input-file --print-saved-residuals --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=RESNOTHING

// Case 5, --print-saved-residuals: a stacked buffer is described by the per-iteration
// value it holds. Without a policy all four buffers of @scan are kept; the
// not-a-scan loop is saved whole and gets the remark.
// RES: // saved residuals of @main: 5 values, 576 bytes
// RES-NEXT: f32[3,4,4] from the argument arg1
// RES-NEXT: f32[3,2,4] the carry-in of each iteration, stacked by the scan loop from model.py:7:4 (f)
// RES-NEXT: f32[3,2,4] output of cosine from line {{[0-9]+}} of each iteration, stacked by the scan loop from model.py:7:4 (f)
// RES-NEXT: f32[3,2,4] output of sine from line {{[0-9]+}} of each iteration, stacked by the scan loop from model.py:7:4 (f)
// RES-NEXT: f32[3,2,4] output of cosine from line {{[0-9]+}} of each iteration, stacked by the scan loop from model.py:7:4 (f)
// RES-NEXT: // -----
// RES-NEXT: // saved residuals of @main: 3 values, 384 bytes
// RES-NEXT: f32[3,4,4] from the argument arg1
// RES-NEXT: f32[3,2,4] the carry-in of each iteration, stacked by the scan loop from line {{[0-9]+}}
// RES-NEXT: f32[3,2,4] output of cosine from line {{[0-9]+}} of each iteration, stacked by the scan loop from line {{[0-9]+}}
// RES-NEXT: // -----
// RES-NEXT: // saved residuals of @main: 3 values, 384 bytes
// RES-NEXT: f32[3,4,4] from the argument arg1
// RES-NEXT: f32[3,2,4] the carry-in of each iteration, stacked by the scan loop from line {{[0-9]+}}
// RES-NEXT: f32[3,2,4] output of cosine from line {{[0-9]+}} of each iteration, stacked by the scan loop from line {{[0-9]+}}
// RES-NEXT: // -----
// RES-NEXT: // saved residuals of @main: 1 value, 16 bytes
// RES-NEXT: f32[4] output of while from line {{[0-9]+}}
// RES-NEXT: // remark: @main: 1 forward stablehlo.while loop(s) are not scan loops with a matching backward loop; each is treated as one atomic op: saved or recomputed whole
// RES-NOT: {{.}}

// save_only_these_names(h): the carry-in and the new buffer of the named value.
// RESNAMES: // saved residuals of @main: 3 values, 384 bytes
// RESNAMES-NEXT: f32[3,4,4] from the argument arg1
// RESNAMES-NEXT: f32[3,2,4] the carry-in of each iteration, stacked by the scan loop from model.py:7:4 (f)
// RESNAMES-NEXT: f32[3,2,4] named 'h' from model.py:3:8 (layer) of each iteration, stacked by the scan loop from model.py:7:4 (f)
// RESNAMES-NEXT: // -----

// nothing_saveable: only the carry-ins stay stacked (plus the arguments); the
// scan loops get no remark, the other loop does.
// RESNOTHING: // saved residuals of @main: 2 values, 288 bytes
// RESNOTHING-NEXT: f32[3,4,4] from the argument arg1
// RESNOTHING-NEXT: f32[3,2,4] the carry-in of each iteration, stacked by the scan loop from model.py:7:4 (f)
// RESNOTHING-NEXT: // -----
// RESNOTHING-NEXT: // saved residuals of @main: 2 values, 288 bytes
// RESNOTHING-NEXT: f32[3,4,4] from the argument arg1
// RESNOTHING-NEXT: f32[3,2,4] the carry-in of each iteration, stacked by the scan loop from line {{[0-9]+}}
// RESNOTHING-NEXT: // -----
// RESNOTHING-NEXT: // saved residuals of @main: 3 values, 304 bytes
// RESNOTHING-NEXT: f32[3,4,4] from the argument arg1
// RESNOTHING-NEXT: f32[4] from the argument arg2
// RESNOTHING-NEXT: f32[3,2,4] the carry-in of each iteration, stacked by the scan loop from line {{[0-9]+}}
// RESNOTHING-NEXT: // -----
// RESNOTHING-NEXT: // saved residuals of @main: 1 value, 16 bytes
// RESNOTHING-NEXT: f32[4] from the argument arg0
// RESNOTHING-NEXT: // remark: @main: 1 forward stablehlo.while loop(s) are not scan loops with a matching backward loop; each is treated as one atomic op: saved or recomputed whole
// RESNOTHING-NOT: {{.}}

// Case 1, nothing_saveable: the forward loop keeps only the counter, the
// invariant xs (Ws), the carry and the stack of carry-ins; the backward loop
// reads the carry-in at its slot index N-1-j and recomputes the layer from it
// (Ws sliced at the same index), each value just before its first use.
// NOTHING-LABEL: module @scan
// NOTHING: %[[FW:.*]]:4 = stablehlo.while(%[[FWS:[^ ]+]] = %arg1, %[[I:[^ ]+]] = %{{[^ ]+}}, %[[X:[^ ]+]] = %arg0, %[[S0:[^ ]+]] = %{{[^ ]+}}) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>{{$}}
// NOTHING: %[[U0:.*]] = stablehlo.broadcast_in_dim %[[X]], dims = [1, 2]
// NOTHING-NEXT: %[[N0:.*]] = stablehlo.dynamic_update_slice %[[S0]], %[[U0]], %[[I]],
// NOTHING-NOT: dynamic_update_slice
// NOTHING: stablehlo.return %[[FWS]], %{{[^ ]+}}, %{{[^ ]+}}, %[[N0]] : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>{{$}}
// NOTHING: %[[BW:.*]]:5 = stablehlo.while(%[[BWS:[^ ]+]] = %arg1, %[[B0:[^ ]+]] = %[[FW]]#3, %[[J:[^ ]+]] = %{{[^ ]+}}, %[[G:[^ ]+]] = %arg2, %{{[^ ]+}} = %{{[^ ]+}}) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>{{$}}
// NOTHING: %[[T:.*]] = stablehlo.subtract %{{[^ ]+}}, %[[J]]
// NOTHING-NEXT: %[[K:.*]] = stablehlo.subtract %[[T]], %{{[^ ]+}}
// NOTHING: %[[R0:.*]] = stablehlo.dynamic_slice %[[B0]], %[[K]], %{{[^ ]+}}, %{{[^ ]+}}, sizes = [1, 2, 4]
// NOTHING-NEXT: %[[XK:.*]] = stablehlo.reshape %[[R0]]
// NOTHING-NEXT: %[[RW:.*]] = stablehlo.dynamic_slice %[[BWS]], %[[K]], {{.*}} {remat.recompute
// NOTHING-NEXT: %[[W:.*]] = stablehlo.reshape %[[RW]] {remat.recompute
// NOTHING-NEXT: %[[D:.*]] = stablehlo.dot_general %[[XK]], %[[W]], contracting_dims = [1] x [0] {remat.recompute
// NOTHING-NEXT: %[[S:.*]] = stablehlo.sine %[[D]] {remat.recompute
// NOTHING-NEXT: %[[H:.*]] = stablehlo.custom_call @remat.name(%[[S]]) {backend_config = "h", remat.recompute
// NOTHING-NEXT: %[[CH:.*]] = stablehlo.cosine %[[H]] {remat.recompute
// NOTHING-NEXT: stablehlo.multiply %[[CH]], %[[G]]
// NOTHING-NEXT: stablehlo.multiply %[[G]], %[[XK]]
// NOTHING-NEXT: %[[GN:.*]] = stablehlo.negate
// NOTHING-NEXT: %[[SH:.*]] = stablehlo.sine %[[H]] {remat.recompute
// NOTHING-NEXT: %[[GS:.*]] = stablehlo.multiply %[[GN]], %[[SH]]
// NOTHING-NEXT: %[[CD:.*]] = stablehlo.cosine %[[D]] {remat.recompute
// NOTHING-NEXT: stablehlo.multiply %[[GS]], %[[CD]]
// NOTHING-NOT: dynamic_slice
// NOTHING: stablehlo.return %[[BWS]], %[[B0]], %{{[^ ]+}}, %{{[^ ]+}}, %{{[^ ]+}} : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>{{$}}
// NOTHING: return %[[FW]]#2, %[[BW]]#3, %[[BW]]#4

// Case 2, save_only_these_names(h): the three stacks of unnamed values go, a
// new stack holds 'h' (reshaped to [1, 2, 4] and written at the counter); the
// backward reads it at N-1-j and recomputes only what comes from it (cosine
// and sine of h), and, for the cosine of the dot, the dot from the carry-in.
// The named value itself is not recomputed.
// NAMES-LABEL: module @scan
// NAMES: %[[FW:.*]]:5 = stablehlo.while(%{{[^ ]+}} = %arg1, %[[I:[^ ]+]] = %{{[^ ]+}}, %[[X:[^ ]+]] = %arg0, %{{[^ ]+}} = %{{[^ ]+}}, %[[SH:[^ ]+]] = %{{[^ ]+}}) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>{{$}}
// NAMES: %[[H:.*]] = stablehlo.custom_call @remat.name(%{{[^ ]+}}) {backend_config = "h"}
// NAMES: stablehlo.broadcast_in_dim %[[X]], dims = [1, 2]
// NAMES-NEXT: stablehlo.dynamic_update_slice
// NAMES-NOT: dynamic_update_slice
// NAMES: %[[UH:.*]] = stablehlo.reshape %[[H]] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
// NAMES-NOT: stablehlo.return
// NAMES: %[[NH:.*]] = stablehlo.dynamic_update_slice %[[SH]], %[[UH]], %[[I]],
// NAMES-NEXT: stablehlo.return {{.*}}, %[[NH]] :
// NAMES: %[[BW:.*]]:6 = stablehlo.while(%[[BWS:[^ ]+]] = %arg1, %[[B0:[^ ]+]] = %[[FW]]#3, %{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %arg2, %{{[^ ]+}} = %{{[^ ]+}}, %[[BH:[^ ]+]] = %[[FW]]#4) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>, tensor<3x2x4xf32>{{$}}
// NAMES: %[[T:.*]] = stablehlo.subtract
// NAMES-NEXT: %[[K:.*]] = stablehlo.subtract %[[T]],
// NAMES: %[[R0:.*]] = stablehlo.dynamic_slice %[[B0]], %[[K]],
// NAMES-NEXT: %[[XK:.*]] = stablehlo.reshape %[[R0]]
// NAMES: %[[RH:.*]] = stablehlo.dynamic_slice %[[BH]], %[[K]], %{{[^ ]+}}, %{{[^ ]+}}, sizes = [1, 2, 4]
// NAMES-NEXT: %[[HK:.*]] = stablehlo.reshape %[[RH]] : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
// NAMES-NEXT: stablehlo.cosine %[[HK]] {remat.recompute
// NAMES-NOT: custom_call
// NAMES: stablehlo.sine %[[HK]] {remat.recompute
// NAMES-NOT: custom_call
// NAMES: %[[RW:.*]] = stablehlo.dynamic_slice %[[BWS]], %[[K]], {{.*}} {remat.recompute
// NAMES-NEXT: %[[W:.*]] = stablehlo.reshape %[[RW]] {remat.recompute
// NAMES-NEXT: %[[D:.*]] = stablehlo.dot_general %[[XK]], %[[W]], contracting_dims = [1] x [0] {remat.recompute
// NAMES-NEXT: stablehlo.cosine %[[D]] {remat.recompute
// NAMES-NOT: custom_call
// NAMES-NOT: remat.recompute
// NAMES: stablehlo.return %[[BWS]], %[[B0]], {{.*}}, %[[BH]] :

// Case 4, everything_saveable (and no policy): the pair is left as it was,
// four stacked buffers carried from one loop into the other, and nothing in
// the backward body is recomputed.
// EVERY-LABEL: module @scan
// EVERY: %[[FW:.*]]:7 = stablehlo.while({{.*}}) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>{{$}}
// EVERY-COUNT-4: stablehlo.dynamic_update_slice
// EVERY: stablehlo.while(%{{[^ ]+}} = %arg1, %{{[^ ]+}} = %[[FW]]#3, %{{[^ ]+}} = %[[FW]]#4, %{{[^ ]+}} = %[[FW]]#5, %{{[^ ]+}} = %[[FW]]#6, {{.*}}) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>{{$}}
// EVERY-NOT: remat.recompute
// EVERY: stablehlo.negate
// EVERY-NOT: remat.recompute
// EVERY: return
module @scan {
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

// Case 3, reverse=True, nothing_saveable: the forward writes slot N-1-i, the
// backward reads slot j (its counter); the recomputation slices Ws at j too.
// NOTHING-LABEL: module @reverse_scan
// NOTHING: %[[FW:.*]]:4 = stablehlo.while(%{{[^ ]+}} = %arg1, %[[I:[^ ]+]] = %{{[^ ]+}}, %[[X:[^ ]+]] = %arg0, %[[S0:[^ ]+]] = %{{[^ ]+}}) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>{{$}}
// NOTHING: %[[T:.*]] = stablehlo.subtract %{{[^ ]+}}, %[[I]]
// NOTHING-NEXT: %[[K:.*]] = stablehlo.subtract %[[T]], %{{[^ ]+}}
// NOTHING: %[[U0:.*]] = stablehlo.broadcast_in_dim %[[X]], dims = [1, 2]
// NOTHING-NEXT: stablehlo.dynamic_update_slice %[[S0]], %[[U0]], %[[K]],
// NOTHING-NOT: dynamic_update_slice
// NOTHING: stablehlo.while(%[[BWS:[^ ]+]] = %arg1, %[[B0:[^ ]+]] = %[[FW]]#3, %[[J:[^ ]+]] = %{{[^ ]+}}, %[[G:[^ ]+]] = %arg2, %{{[^ ]+}} = %{{[^ ]+}}) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>{{$}}
// NOTHING-NOT: subtract
// NOTHING: %[[R0:.*]] = stablehlo.dynamic_slice %[[B0]], %[[J]],
// NOTHING-NEXT: %[[XK:.*]] = stablehlo.reshape %[[R0]]
// NOTHING-NEXT: %[[RW:.*]] = stablehlo.dynamic_slice %[[BWS]], %[[J]], {{.*}} {remat.recompute
// NOTHING-NEXT: %[[W:.*]] = stablehlo.reshape %[[RW]] {remat.recompute
// NOTHING-NEXT: %[[D:.*]] = stablehlo.dot_general %[[XK]], %[[W]], contracting_dims = [1] x [0] {remat.recompute
// NOTHING-NEXT: %[[CD:.*]] = stablehlo.cosine %[[D]] {remat.recompute
// NOTHING-NEXT: stablehlo.multiply %[[G]], %[[CD]]
// NOTHING-NOT: subtract
// NOTHING: stablehlo.return %[[BWS]], %[[B0]],

// everything_saveable: both buffers stay, read at the backward counter.
// EVERY-LABEL: module @reverse_scan
// EVERY: %[[FW:.*]]:5 = stablehlo.while({{.*}}) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>{{$}}
// EVERY: stablehlo.while(%{{[^ ]+}} = %arg1, %{{[^ ]+}} = %[[FW]]#3, %{{[^ ]+}} = %[[FW]]#4, {{.*}}) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>{{$}}
// EVERY-NOT: remat.recompute
// EVERY: return
module @reverse_scan {
  func.func @main(%x: tensor<2x4xf32>, %ws: tensor<3x4x4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x4x4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %zs = stablehlo.constant dense<0.000000e+00> : tensor<3x2x4xf32>
    %zw = stablehlo.constant dense<0.000000e+00> : tensor<3x4x4xf32>
    %fw:5 = stablehlo.while(%fws = %ws, %i = %c0, %xi = %x, %s0 = %zs, %s1 = %zs) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    cond {
      %p = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %t = stablehlo.subtract %c3, %i : tensor<i32>
      %k = stablehlo.subtract %t, %c1 : tensor<i32>
      %w1 = stablehlo.dynamic_slice %fws, %k, %c0, %c0, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %w = stablehlo.reshape %w1 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %d = stablehlo.dot_general %xi, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %s = stablehlo.sine %d : tensor<2x4xf32>
      %cd = stablehlo.cosine %d : tensor<2x4xf32>
      %u0 = stablehlo.broadcast_in_dim %xi, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n0 = stablehlo.dynamic_update_slice %s0, %u0, %k, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u1 = stablehlo.broadcast_in_dim %cd, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n1 = stablehlo.dynamic_update_slice %s1, %u1, %k, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %i1 = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %fws, %i1, %s, %n0, %n1 : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    }
    %bw:6 = stablehlo.while(%bws = %ws, %b0 = %fw#3, %b1 = %fw#4, %j = %c0, %g = %ct, %gws = %zw) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>
    cond {
      %p = stablehlo.compare LT, %j, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %w1 = stablehlo.dynamic_slice %bws, %j, %c0, %c0, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %w = stablehlo.reshape %w1 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %r0 = stablehlo.dynamic_slice %b0, %j, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %xk = stablehlo.reshape %r0 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %r1 = stablehlo.dynamic_slice %b1, %j, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %cdk = stablehlo.reshape %r1 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %gd = stablehlo.multiply %g, %cdk : tensor<2x4xf32>
      %gw0 = stablehlo.dot_general %gd, %xk, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %gw = stablehlo.transpose %gw0, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %gx = stablehlo.dot_general %gd, %w, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %uw = stablehlo.broadcast_in_dim %gw, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
      %ngws = stablehlo.dynamic_update_slice %gws, %uw, %j, %c0, %c0 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32>
      %j1 = stablehlo.add %j, %c1 : tensor<i32>
      stablehlo.return %bws, %b0, %b1, %j1, %gx, %ngws : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>
    }
    return %fw#2, %bw#4, %bw#5 : tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x4x4xf32>
  }
}


// -----

// Case 7, nothing_saveable: a loop invariant the backward loop does not read (the bias, needed only to
// recompute the cosine) is threaded into it as a new pass-through carry, last.
// NOTHING-LABEL: module @invariant_threaded
// NOTHING: %[[B1:.*]] = stablehlo.broadcast_in_dim %arg2, dims = [1]
// NOTHING: %[[FW:.*]]:5 = stablehlo.while(%{{[^ ]+}} = %arg1, %{{[^ ]+}} = %[[B1]], {{.*}}) : tensor<3x4x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>{{$}}
// NOTHING: %[[B2:.*]] = stablehlo.broadcast_in_dim %arg2, dims = [1]
// NOTHING: stablehlo.while(%[[BWS:[^ ]+]] = %arg1, %[[B0:[^ ]+]] = %[[FW]]#4, {{.*}}, %[[BB:[^ ]+]] = %[[B2]]) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>, tensor<1x4xf32>{{$}}
// NOTHING: %[[D:.*]] = stablehlo.dot_general {{.*}} {remat.recompute
// NOTHING-NEXT: %[[BD:.*]] = stablehlo.broadcast_in_dim %[[BB]], dims = [0, 1] {remat.recompute
// NOTHING-NEXT: %[[Z:.*]] = stablehlo.add %[[D]], %[[BD]] {remat.recompute
// NOTHING-NEXT: stablehlo.cosine %[[Z]] {remat.recompute
// NOTHING: stablehlo.return %[[BWS]], %[[B0]], {{.*}}, %[[BB]] :
module @invariant_threaded {
  func.func @main(%x: tensor<2x4xf32>, %ws: tensor<3x4x4xf32>, %b: tensor<4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x4x4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %zs = stablehlo.constant dense<0.000000e+00> : tensor<3x2x4xf32>
    %zw = stablehlo.constant dense<0.000000e+00> : tensor<3x4x4xf32>
    %b1 = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
    %fw:6 = stablehlo.while(%fws = %ws, %fb = %b1, %i = %c0, %xi = %x, %s0 = %zs, %s1 = %zs) : tensor<3x4x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    cond {
      %p = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %w1 = stablehlo.dynamic_slice %fws, %i, %c0, %c0, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %w = stablehlo.reshape %w1 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %d = stablehlo.dot_general %xi, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %bb = stablehlo.broadcast_in_dim %fb, dims = [0, 1] : (tensor<1x4xf32>) -> tensor<2x4xf32>
      %z = stablehlo.add %d, %bb : tensor<2x4xf32>
      %s = stablehlo.sine %z : tensor<2x4xf32>
      %cz = stablehlo.cosine %z : tensor<2x4xf32>
      %u0 = stablehlo.broadcast_in_dim %xi, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n0 = stablehlo.dynamic_update_slice %s0, %u0, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u1 = stablehlo.broadcast_in_dim %cz, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n1 = stablehlo.dynamic_update_slice %s1, %u1, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %i1 = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %fws, %fb, %i1, %s, %n0, %n1 : tensor<3x4x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    }
    %bw:6 = stablehlo.while(%bws = %ws, %b0 = %fw#4, %bz = %fw#5, %j = %c0, %g = %ct, %gws = %zw) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>
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
      %r1 = stablehlo.dynamic_slice %bz, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %czk = stablehlo.reshape %r1 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %gz = stablehlo.multiply %g, %czk : tensor<2x4xf32>
      %gw0 = stablehlo.dot_general %gz, %xk, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %gw = stablehlo.transpose %gw0, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %gx = stablehlo.dot_general %gz, %w, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %uw = stablehlo.broadcast_in_dim %gw, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
      %ngws = stablehlo.dynamic_update_slice %gws, %uw, %k, %c0, %c0 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32>
      %j1 = stablehlo.add %j, %c1 : tensor<i32>
      stablehlo.return %bws, %b0, %bz, %j1, %gx, %ngws : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>
    }
    return %fw#3, %bw#4, %bw#5 : tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x4x4xf32>
  }
}

// -----

// Case 6: a fori-style loop that stacks nothing is no scan loop, even though a
// backward loop reads its result: it stays an atomic op (see the remark in the
// RES and RESNOTHING reports), saved whole by default ...
// EVERY-LABEL: module @not_a_scan_pair
// EVERY: %[[FW:.*]]:2 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %arg0) : tensor<i32>, tensor<4xf32>{{$}}
// EVERY: stablehlo.sine
// EVERY-NOT: attributes {remat.recompute
// EVERY: stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %arg1, %{{[^ ]+}} = %[[FW]]#1) : tensor<i32>, tensor<4xf32>, tensor<4xf32>{{$}}
// EVERY-NOT: remat.recompute
// EVERY: return %[[FW]]#1,

// ... and recomputed whole (cloned, its carries untouched) by nothing_saveable.
// NOTHING-LABEL: module @not_a_scan_pair
// NOTHING: %[[FW:.*]]:2 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %arg0) : tensor<i32>, tensor<4xf32>{{$}}
// NOTHING: %[[RW:.*]]:2 = stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %arg0) : tensor<i32>, tensor<4xf32> attributes {remat.recompute
// NOTHING: stablehlo.sine
// NOTHING: stablehlo.while(%{{[^ ]+}} = %{{[^ ]+}}, %{{[^ ]+}} = %arg1, %{{[^ ]+}} = %[[RW]]#1) : tensor<i32>, tensor<4xf32>, tensor<4xf32>{{$}}
// NOTHING-NOT: dynamic_slice
// NOTHING: return %[[FW]]#1,
module @not_a_scan_pair {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %fw:2 = stablehlo.while(%i = %c0, %v = %x) : tensor<i32>, tensor<4xf32>
    cond {
      %p = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %s = stablehlo.sine %v : tensor<4xf32>
      %i1 = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %i1, %s : tensor<i32>, tensor<4xf32>
    }
    %bw:3 = stablehlo.while(%j = %c0, %g = %ct, %v = %fw#1) : tensor<i32>, tensor<4xf32>, tensor<4xf32>
    cond {
      %p = stablehlo.compare LT, %j, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %c = stablehlo.cosine %v : tensor<4xf32>
      %g1 = stablehlo.multiply %g, %c : tensor<4xf32>
      %j1 = stablehlo.add %j, %c1 : tensor<i32>
      stablehlo.return %j1, %g1, %v : tensor<i32>, tensor<4xf32>, tensor<4xf32>
    }
    return %fw#1, %bw#1 : tensor<4xf32>, tensor<4xf32>
  }
}
