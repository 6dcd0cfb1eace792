// Per-branch remat through lax.cond forward/backward case pairs
// (remat_passes/case_rewrite.py). The input is
// export_vjp(f, W f32[4,4], x f32[2,4], p f32[]) of
//   f = sum(cond(p > 0, three named sin(x @ W) layers h0..h2, x * 2, x))
// (tests/python/test_cond.py three_dots). Every RUN line processes the case;
// the residual counts are what jax.checkpoint saves for the same policy.
//
// RUN: remat-opt %s --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=NOTHING
// RUN: remat-opt %s --remat-partial-eval='policy=save_only_these_names(h1)' | filecheck %s --check-prefix=NAMES
// RUN: remat-opt %s --print-saved-residuals --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=RESNOTHING
// RUN: remat-opt %s --print-saved-residuals --remat-partial-eval='policy=dots_saveable' | filecheck %s --check-prefix=RESDOTS
// RUN: remat-opt %s --print-saved-residuals --remat-partial-eval='policy=save_only_these_names(h1)' | filecheck %s --check-prefix=RESNAMES
// RUN: remat-opt %s --print-saved-residuals --remat-partial-eval='policy=auto(0)' | filecheck %s --check-prefix=RESAUTO0
// RUN: remat-opt %s --print-saved-residuals --remat-partial-eval='policy=auto(96)' | filecheck %s --check-prefix=RESAUTO96
// (A JAX module without locations: the saved-residuals reports end with the remark
// that says the backward is found by the cotangent marks alone.)

// nothing_saveable: the forward case returns the primal output alone; one
// recompute case on the recomputed index (JAX's staged cond) computes every
// residual of the taken branch (zeros in the other); the backward case reads it.
// NOTHING-LABEL: module @cond
// NOTHING: %[[F:.*]] = "stablehlo.case"(%[[I:.*]]) ({
// NOTHING: stablehlo.return %{{[^ ]+}} : tensor<2x4xf32>
// NOTHING: stablehlo.return %{{[^ ]+}} : tensor<2x4xf32>
// NOTHING-NEXT: }) {remat.case = 0 : i64} : (tensor<i32>) -> tensor<2x4xf32>
// NOTHING: %[[RI:.*]] = stablehlo.convert %{{[^ ]+}} {remat.recompute
// NOTHING-NEXT: %[[R:.*]]:5 = "stablehlo.case"(%[[RI]]) ({
// NOTHING-NOT: stablehlo.sine
// NOTHING: }, {
// NOTHING-NEXT: stablehlo.dot_general %arg1, %arg0, {{.*}} {remat.recompute
// NOTHING: stablehlo.sine {{.*}} {remat.recompute
// NOTHING: }) {remat.recompute = {{[0-9]+}} : i64} : (tensor<i32>) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>)
// NOTHING: "stablehlo.case"(%[[RI]]) ({
// NOTHING-NOT: stablehlo.sine
// NOTHING: stablehlo.multiply %{{[^ ]+}}, %[[R]]#4
// NOTHING-NOT: stablehlo.sine
// NOTHING: return

// save_only_these_names(h1): the forward case keeps h1 in a residual slot (zeros
// from the other branch); the recompute case starts the third layer from it.
// NAMES-LABEL: module @cond
// NAMES: %[[F:.*]]:2 = "stablehlo.case"
// NAMES: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<2x4xf32>
// NAMES-NEXT: stablehlo.return %{{[^ ]+}}, %[[ZERO]]
// NAMES: %[[H1:.*]] = stablehlo.custom_call @remat.name(%{{[^ ]+}}) {backend_config = "h1"}
// NAMES: stablehlo.return %{{[^ ]+}}, %[[H1]] : tensor<2x4xf32>, tensor<2x4xf32>
// NAMES: "stablehlo.case"
// NAMES: stablehlo.dot_general %[[F]]#1, %arg0, {{.*}} {remat.recompute

// RESNOTHING: // saved residuals of @main: 3 values, 100 bytes
// RESNOTHING-NEXT: f32[4,4] from the argument arg0
// RESNOTHING-NEXT: f32[2,4] from the argument arg1
// RESNOTHING-NEXT: f32[] from the argument arg2
// RESNOTHING-NEXT: // remark: @main: no op carries JAX's name stack{{.*}}
// RESNOTHING-NOT: {{.}}

// RESDOTS: // saved residuals of @main: 6 values, 196 bytes
// RESDOTS-COUNT-3: f32[2,4] output of case from line {{[0-9]+}}{{$}}
// RESDOTS-NEXT: // remark: @main: no op carries JAX's name stack{{.*}}
// RESDOTS-NOT: {{.}}

// auto decides the branches' ops in a chain of choices (planner/case_model.py): at a
// budget of 0 it recomputes all of them and keeps what nothing_saveable keeps; at 96 B
// (what dots_saveable keeps beyond the arguments) it saves the dots, as dots_saveable.
// RESAUTO0: // saved residuals of @main: 3 values, 100 bytes
// RESAUTO0: // remark: auto(budget=0): {{.*}} plan keeps 0 B of activations
// RESAUTO0: // remark: auto recomputes what dots_saveable recomputes in the branches of the cond at line {{[0-9]+}}
// RESAUTO0-NEXT: // remark: auto recomputes the rest in the branches of the cond at line {{[0-9]+}}

// RESAUTO96: // saved residuals of @main: 6 values, 196 bytes
// RESAUTO96-COUNT-3: f32[2,4] output of case from line {{[0-9]+}}{{$}}
// RESAUTO96: // remark: auto recomputes what dots_saveable recomputes in the branches of the cond at line {{[0-9]+}}
// RESAUTO96-NOT: the rest in the branches

// RESNAMES: // saved residuals of @main: 4 values, 132 bytes
// RESNAMES: f32[] from the argument arg2
// RESNAMES-NEXT: f32[2,4] output of case from line {{[0-9]+}}{{$}}
// RESNAMES-NEXT: // remark: @main: no op carries JAX's name stack{{.*}}
// RESNAMES-NOT: {{.}}

module @cond attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x4xf32>, %arg1: tensor<2x4xf32>, %arg2: tensor<f32>, %arg3: tensor<f32> {remat.cotangent}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<4x4xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<2x4xf32> {jax.result_info = "result[1][1]", remat.gradient}, tensor<f32> {jax.result_info = "result[1][2]", remat.gradient}) {
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.compare GT, %arg2, %cst_0, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %1 = stablehlo.convert %0 : (tensor<i1>) -> tensor<i32>
    %2:8 = "stablehlo.case"(%1) ({
      %6 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
      %7 = stablehlo.multiply %arg1, %6 : tensor<2x4xf32>
      %8 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
      %9 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
      %10 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
      %11 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
      %12 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
      %13 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
      %14 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
      stablehlo.return %7, %8, %9, %10, %11, %12, %13, %14 : tensor<2x4xf32>, tensor<4x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
    }, {
      %6 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %7 = stablehlo.sine %6 : tensor<2x4xf32>
      %8 = stablehlo.cosine %6 : tensor<2x4xf32>
      %9 = stablehlo.custom_call @remat.name(%7) {backend_config = "h0"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %10 = stablehlo.dot_general %9, %arg0, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %11 = stablehlo.sine %10 : tensor<2x4xf32>
      %12 = stablehlo.cosine %10 : tensor<2x4xf32>
      %13 = stablehlo.custom_call @remat.name(%11) {backend_config = "h1"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      %14 = stablehlo.dot_general %13, %arg0, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %15 = stablehlo.sine %14 : tensor<2x4xf32>
      %16 = stablehlo.cosine %14 : tensor<2x4xf32>
      %17 = stablehlo.custom_call @remat.name(%15) {backend_config = "h2"} : (tensor<2x4xf32>) -> tensor<2x4xf32>
      stablehlo.return %17, %arg0, %arg1, %8, %9, %12, %13, %16 : tensor<2x4xf32>, tensor<4x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
    }) : (tensor<i32>) -> (tensor<2x4xf32>, tensor<4x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>)
    %3 = stablehlo.reduce(%2#0 init: %cst_0) applies stablehlo.add across dimensions = [0, 1] : (tensor<2x4xf32>, tensor<f32>) -> tensor<f32>
    %4 = stablehlo.broadcast_in_dim %arg3, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
    %5:2 = "stablehlo.case"(%1) ({
      %6 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
      %7 = stablehlo.multiply %4, %6 : tensor<2x4xf32>
      %8 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
      stablehlo.return %8, %7 : tensor<4x4xf32>, tensor<2x4xf32>
    }, {
      %6 = stablehlo.multiply %4, %2#7 : tensor<2x4xf32>
      %7 = stablehlo.dot_general %6, %2#6, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %8 = stablehlo.transpose %7, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %9 = stablehlo.dot_general %6, %2#1, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %10 = stablehlo.multiply %9, %2#5 : tensor<2x4xf32>
      %11 = stablehlo.dot_general %10, %2#4, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %12 = stablehlo.transpose %11, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %13 = stablehlo.add %8, %12 : tensor<4x4xf32>
      %14 = stablehlo.dot_general %10, %2#1, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %15 = stablehlo.multiply %14, %2#3 : tensor<2x4xf32>
      %16 = stablehlo.dot_general %15, %2#2, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %17 = stablehlo.transpose %16, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %18 = stablehlo.add %13, %17 : tensor<4x4xf32>
      %19 = stablehlo.dot_general %15, %2#1, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      stablehlo.return %18, %19 : tensor<4x4xf32>, tensor<2x4xf32>
    }) : (tensor<i32>) -> (tensor<4x4xf32>, tensor<2x4xf32>)
    return %3, %5#0, %5#1, %cst_0 : tensor<f32>, tensor<4x4xf32>, tensor<2x4xf32>, tensor<f32>
  }
}

