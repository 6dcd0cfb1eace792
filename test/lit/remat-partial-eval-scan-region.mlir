// A checkpoint region around a scan (remat_passes/scan_rewrite.py, `plan_whole`): as with
// `jax.checkpoint` around a function that contains a scan, the forward loop stacks only
// what the region's policy saves, and the backward re-runs the forward loop (a
// recompute clone right before the backward loop) that reads those stacks back and makes
// the stacks the backward loop reads. Input: a hand-trimmed export of
// export_vjp(rp.checkpoint(f, policy=...), Ws, x), f(Ws, x) = sum(scan(body, x, Ws)[0]),
// body(c, W) = (sin(checkpoint_name(W @ c, "a")), None), Ws f32[3,4,4], x f32[4],
// private calls inlined. The forward loop stacks the carry-in and cos(a) per iteration.
//
// RUN: remat-opt %s --split-input-file --remat-partial-eval | filecheck %s
// RUN: remat-opt %s --split-input-file --print-saved-residuals --remat-partial-eval | filecheck %s --check-prefix=RES

// save_only_these_names('a'): the forward loop stacks `a` instead of its two stacks; the
// re-run (no dot_general) computes the carry-ins (sin of the saved `a`) and cos(a) from it.
// CHECK-LABEL: module @scan_region_names
// CHECK: %[[FWD:.*]]:4 = stablehlo.while
// CHECK: %[[A:.*]] = stablehlo.custom_call @remat.name
// CHECK-NEXT: stablehlo.sine %[[A]]
// CHECK-NOT: stablehlo.cosine
// CHECK: stablehlo.reshape %[[A]]
// CHECK-NEXT: stablehlo.constant
// CHECK-NEXT: stablehlo.dynamic_update_slice
// CHECK: %[[RE:.*]]:5 = stablehlo.while({{.*}} = %[[FWD]]#3) {{.*}}attributes {remat.recompute = {{[0-9]+}} : i64}
// CHECK-NOT: stablehlo.dot_general
// CHECK: stablehlo.sine
// CHECK-NEXT: stablehlo.cosine
// CHECK: stablehlo.while(%{{.*}} = %[[RE]]#2, %{{.*}} = %arg0, %{{.*}} = %[[RE]]#3
// RES: // saved residuals of @main: 3 values, 256 bytes
// RES-NEXT: f32[3,4,4] from the argument Ws
// RES-NEXT: f32[4] from the argument x
// RES-NEXT: f32[3,4] named 'a' from f.py:7:19 (body) of each iteration, stacked by the scan loop from f.py:9:19 (f)
// RES-NEXT: // -----
module @scan_region_names attributes {remat.regions = {"remat[1]" = "save_only_these_names('a')"}} {
  func.func public @main(%arg0: tensor<3x4x4xf32> loc("Ws"), %arg1: tensor<4xf32> loc("x"), %arg2: tensor<f32> {remat.cotangent} loc("cotangent")) -> (tensor<f32>, tensor<3x4x4xf32>, tensor<4xf32>) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<3> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x4xf32>
    %2:5 = stablehlo.while(%iterArg = %arg0, %iterArg_2 = %c_1, %iterArg_3 = %arg1, %iterArg_4 = %0, %iterArg_5 = %0) : tensor<3x4x4xf32>, tensor<i32>, tensor<4xf32>, tensor<3x4xf32>, tensor<3x4xf32>
    cond {
      %7 = stablehlo.compare LT, %iterArg_2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %7 : tensor<i1>
    } do {
      %w0 = stablehlo.dynamic_slice %iterArg, %iterArg_2, %c_1, %c_1, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32> loc(#body)
      %w = stablehlo.reshape %w0 : (tensor<1x4x4xf32>) -> tensor<4x4xf32> loc(#body)
      %d = stablehlo.dot_general %w, %iterArg_3, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32> loc(#dot)
      %a = stablehlo.custom_call @remat.name(%d) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32> loc(#name)
      %s = stablehlo.sine %a : tensor<4xf32> loc(#sin)
      %co = stablehlo.cosine %a : tensor<4xf32> loc(#cos)
      %b1 = stablehlo.broadcast_in_dim %iterArg_3, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32> loc(#body)
      %u1 = stablehlo.dynamic_update_slice %iterArg_4, %b1, %iterArg_2, %c_1 : (tensor<3x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<3x4xf32> loc(#body)
      %b2 = stablehlo.broadcast_in_dim %co, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32> loc(#body)
      %u2 = stablehlo.dynamic_update_slice %iterArg_5, %b2, %iterArg_2, %c_1 : (tensor<3x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<3x4xf32> loc(#body)
      %11 = stablehlo.add %iterArg_2, %c : tensor<i32> loc(#body)
      stablehlo.return %iterArg, %11, %s, %u1, %u2 : tensor<3x4x4xf32>, tensor<i32>, tensor<4xf32>, tensor<3x4xf32>, tensor<3x4xf32>
    } loc(#fwd)
    %3 = stablehlo.reduce(%2#2 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32> loc(#sum)
    %4 = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<4xf32> loc(#tsum)
    %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x4x4xf32> loc(#tsum)
    %6:6 = stablehlo.while(%iterArg = %2#3, %iterArg_2 = %arg0, %iterArg_3 = %2#4, %iterArg_4 = %c_1, %iterArg_5 = %4, %iterArg_6 = %5) : tensor<3x4xf32>, tensor<3x4x4xf32>, tensor<3x4xf32>, tensor<i32>, tensor<4xf32>, tensor<3x4x4xf32>
    cond {
      %7 = stablehlo.compare LT, %iterArg_4, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %7 : tensor<i1>
    } do {
      %7 = stablehlo.subtract %c_0, %iterArg_4 : tensor<i32> loc(#tbody)
      %8 = stablehlo.subtract %7, %c : tensor<i32> loc(#tbody)
      %r0 = stablehlo.dynamic_slice %iterArg, %8, %c_1, sizes = [1, 4] : (tensor<3x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32> loc(#tbody)
      %r = stablehlo.reshape %r0 : (tensor<1x4xf32>) -> tensor<4xf32> loc(#tbody)
      %q0 = stablehlo.dynamic_slice %iterArg_2, %8, %c_1, %c_1, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32> loc(#tbody)
      %q = stablehlo.reshape %q0 : (tensor<1x4x4xf32>) -> tensor<4x4xf32> loc(#tbody)
      %p0 = stablehlo.dynamic_slice %iterArg_3, %8, %c_1, sizes = [1, 4] : (tensor<3x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32> loc(#tbody)
      %p = stablehlo.reshape %p0 : (tensor<1x4xf32>) -> tensor<4xf32> loc(#tbody)
      %m = stablehlo.multiply %iterArg_5, %p : tensor<4xf32> loc(#tbody)
      %g1 = stablehlo.dot_general %m, %q, contracting_dims = [0] x [0] : (tensor<4xf32>, tensor<4x4xf32>) -> tensor<4xf32> loc(#tbody)
      %g2 = stablehlo.dot_general %m, %r, contracting_dims = [] x [] : (tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32> loc(#tbody)
      %g3 = stablehlo.broadcast_in_dim %g2, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32> loc(#tbody)
      %13 = stablehlo.dynamic_update_slice %iterArg_6, %g3, %8, %c_1, %c_1 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32> loc(#tbody)
      %14 = stablehlo.add %iterArg_4, %c : tensor<i32> loc(#tbody)
      stablehlo.return %iterArg, %iterArg_2, %iterArg_3, %14, %g1, %13 : tensor<3x4xf32>, tensor<3x4x4xf32>, tensor<3x4xf32>, tensor<i32>, tensor<4xf32>, tensor<3x4x4xf32>
    } loc(#bwd)
    return %3, %6#5, %6#4 : tensor<f32>, tensor<3x4x4xf32>, tensor<4xf32>
  }
}
#f9 = loc("f"("f.py":9:19))
#b7 = loc("body"("f.py":7:19))
#fwd = loc("jit(f)/jvp(remat[1])/while"(#f9))
#body = loc("jit(f)/jvp(remat[1])/while/body/add"(#f9))
#dot = loc("jit(f)/jvp(remat[1])/while/body/dot_general"(#b7))
#name = loc("jit(f)/jvp(remat[1])/while/body/name"(#b7))
#sin = loc("jit(f)/jvp(remat[1])/while/body/sin"(#b7))
#cos = loc("jit(f)/jvp(remat[1])/while/body/cos"(#b7))
#sum = loc("jit(f)/jvp(remat[1])/reduce_sum"(#f9))
#tsum = loc("jit(f)/transpose(jvp(remat[1]))/broadcast_in_dim"(#f9))
#bwd = loc("jit(f)/transpose(jvp(remat[1]))/while"(#f9))
#tbody = loc("jit(f)/transpose(jvp(remat[1]))/while/body/mul"(#f9))

// -----

// nothing_saveable: the forward loop stacks nothing; the re-run starts from the region's
// inputs, the arguments (all that is saved), and computes every stack the backward reads.
// CHECK-LABEL: module @scan_region_nothing
// CHECK: %[[FWD:.*]]:3 = stablehlo.while(%{{.*}} = %arg0, %{{.*}} = %c{{.*}}, %{{.*}} = %arg1)
// CHECK-NOT: stablehlo.dynamic_update_slice
// CHECK: %[[RE:.*]]:5 = stablehlo.while({{.*}} = %arg0, {{.*}} = %arg1, {{.*}}attributes {remat.recompute = {{[0-9]+}} : i64}
// CHECK: stablehlo.dot_general
// CHECK: stablehlo.while(%{{.*}} = %[[RE]]#
// RES: // saved residuals of @main: 2 values, 208 bytes
// RES-NEXT: f32[3,4,4] from the argument Ws
// RES-NEXT: f32[4] from the argument x
// RES-NOT: {{.}}
module @scan_region_nothing attributes {remat.regions = {"remat[1]" = "nothing_saveable"}} {
  func.func public @main(%arg0: tensor<3x4x4xf32> loc("Ws"), %arg1: tensor<4xf32> loc("x"), %arg2: tensor<f32> {remat.cotangent} loc("cotangent")) -> (tensor<f32>, tensor<3x4x4xf32>, tensor<4xf32>) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<3> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x4xf32>
    %2:5 = stablehlo.while(%iterArg = %arg0, %iterArg_2 = %c_1, %iterArg_3 = %arg1, %iterArg_4 = %0, %iterArg_5 = %0) : tensor<3x4x4xf32>, tensor<i32>, tensor<4xf32>, tensor<3x4xf32>, tensor<3x4xf32>
    cond {
      %7 = stablehlo.compare LT, %iterArg_2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %7 : tensor<i1>
    } do {
      %w0 = stablehlo.dynamic_slice %iterArg, %iterArg_2, %c_1, %c_1, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32> loc(#body)
      %w = stablehlo.reshape %w0 : (tensor<1x4x4xf32>) -> tensor<4x4xf32> loc(#body)
      %d = stablehlo.dot_general %w, %iterArg_3, contracting_dims = [1] x [0] : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<4xf32> loc(#dot)
      %a = stablehlo.custom_call @remat.name(%d) {backend_config = "a"} : (tensor<4xf32>) -> tensor<4xf32> loc(#name)
      %s = stablehlo.sine %a : tensor<4xf32> loc(#sin)
      %co = stablehlo.cosine %a : tensor<4xf32> loc(#cos)
      %b1 = stablehlo.broadcast_in_dim %iterArg_3, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32> loc(#body)
      %u1 = stablehlo.dynamic_update_slice %iterArg_4, %b1, %iterArg_2, %c_1 : (tensor<3x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<3x4xf32> loc(#body)
      %b2 = stablehlo.broadcast_in_dim %co, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32> loc(#body)
      %u2 = stablehlo.dynamic_update_slice %iterArg_5, %b2, %iterArg_2, %c_1 : (tensor<3x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<3x4xf32> loc(#body)
      %11 = stablehlo.add %iterArg_2, %c : tensor<i32> loc(#body)
      stablehlo.return %iterArg, %11, %s, %u1, %u2 : tensor<3x4x4xf32>, tensor<i32>, tensor<4xf32>, tensor<3x4xf32>, tensor<3x4xf32>
    } loc(#fwd)
    %3 = stablehlo.reduce(%2#2 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32> loc(#sum)
    %4 = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<4xf32> loc(#tsum)
    %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x4x4xf32> loc(#tsum)
    %6:6 = stablehlo.while(%iterArg = %2#3, %iterArg_2 = %arg0, %iterArg_3 = %2#4, %iterArg_4 = %c_1, %iterArg_5 = %4, %iterArg_6 = %5) : tensor<3x4xf32>, tensor<3x4x4xf32>, tensor<3x4xf32>, tensor<i32>, tensor<4xf32>, tensor<3x4x4xf32>
    cond {
      %7 = stablehlo.compare LT, %iterArg_4, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %7 : tensor<i1>
    } do {
      %7 = stablehlo.subtract %c_0, %iterArg_4 : tensor<i32> loc(#tbody)
      %8 = stablehlo.subtract %7, %c : tensor<i32> loc(#tbody)
      %r0 = stablehlo.dynamic_slice %iterArg, %8, %c_1, sizes = [1, 4] : (tensor<3x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32> loc(#tbody)
      %r = stablehlo.reshape %r0 : (tensor<1x4xf32>) -> tensor<4xf32> loc(#tbody)
      %q0 = stablehlo.dynamic_slice %iterArg_2, %8, %c_1, %c_1, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32> loc(#tbody)
      %q = stablehlo.reshape %q0 : (tensor<1x4x4xf32>) -> tensor<4x4xf32> loc(#tbody)
      %p0 = stablehlo.dynamic_slice %iterArg_3, %8, %c_1, sizes = [1, 4] : (tensor<3x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32> loc(#tbody)
      %p = stablehlo.reshape %p0 : (tensor<1x4xf32>) -> tensor<4xf32> loc(#tbody)
      %m = stablehlo.multiply %iterArg_5, %p : tensor<4xf32> loc(#tbody)
      %g1 = stablehlo.dot_general %m, %q, contracting_dims = [0] x [0] : (tensor<4xf32>, tensor<4x4xf32>) -> tensor<4xf32> loc(#tbody)
      %g2 = stablehlo.dot_general %m, %r, contracting_dims = [] x [] : (tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32> loc(#tbody)
      %g3 = stablehlo.broadcast_in_dim %g2, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32> loc(#tbody)
      %13 = stablehlo.dynamic_update_slice %iterArg_6, %g3, %8, %c_1, %c_1 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32> loc(#tbody)
      %14 = stablehlo.add %iterArg_4, %c : tensor<i32> loc(#tbody)
      stablehlo.return %iterArg, %iterArg_2, %iterArg_3, %14, %g1, %13 : tensor<3x4xf32>, tensor<3x4x4xf32>, tensor<3x4xf32>, tensor<i32>, tensor<4xf32>, tensor<3x4x4xf32>
    } loc(#bwd)
    return %3, %6#5, %6#4 : tensor<f32>, tensor<3x4x4xf32>, tensor<4xf32>
  }
}
#f9 = loc("f"("f.py":9:19))
#b7 = loc("body"("f.py":7:19))
#fwd = loc("jit(f)/jvp(remat[1])/while"(#f9))
#body = loc("jit(f)/jvp(remat[1])/while/body/add"(#f9))
#dot = loc("jit(f)/jvp(remat[1])/while/body/dot_general"(#b7))
#name = loc("jit(f)/jvp(remat[1])/while/body/name"(#b7))
#sin = loc("jit(f)/jvp(remat[1])/while/body/sin"(#b7))
#cos = loc("jit(f)/jvp(remat[1])/while/body/cos"(#b7))
#sum = loc("jit(f)/jvp(remat[1])/reduce_sum"(#f9))
#tsum = loc("jit(f)/transpose(jvp(remat[1]))/broadcast_in_dim"(#f9))
#bwd = loc("jit(f)/transpose(jvp(remat[1]))/while"(#f9))
#tbody = loc("jit(f)/transpose(jvp(remat[1]))/while/body/mul"(#f9))
