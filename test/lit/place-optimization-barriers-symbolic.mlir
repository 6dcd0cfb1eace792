// Shape computations of a symbolic-shape module never go through a barrier.
// The input is export_vjp(f, W f32[4,4], x f32[b,4]) with f = sum(tanh(sin(x @ W) @ W))
// and b = jax.export.symbolic_shape("b"): the backward rebuilds [b, 4] shapes from
// get_dimension_size for dynamic_broadcast_in_dim. A shape operand behind an
// optimization_barrier cannot be refined when the module is compiled, so the
// recomputed dimension size reads the argument directly and only data values
// (f32 tensors) enter barriers.
//
// RUN: remat-opt %s --remat='policy=nothing_saveable' | filecheck %s
// RUN: remat-opt %s --print-saved-residuals --inline --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=RES
// RUN: remat-opt %s --inline | remat-opt --print-saved-residuals --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=UNNAMED
// (A JAX module without locations: the saved-residuals reports end with the remark
// that says the backward is found by the cotangent marks alone.)

// CHECK-LABEL: module @symbolic
// CHECK: %[[B:.*]] = stablehlo.get_dimension_size %arg1, dim = 0
// CHECK-NOT: optimization_barrier {{.*}}tensor<{{[0-9]*x?}}i32>
// CHECK: stablehlo.get_dimension_size %arg1, dim = 0 : (tensor<?x4xf32>) -> tensor<i32>
// CHECK-NOT: optimization_barrier {{.*}}tensor<{{[0-9]*x?}}i32>
// CHECK: stablehlo.optimization_barrier %arg1, %arg0, %{{[^ ]+}} : tensor<?x4xf32>, tensor<4x4xf32>, tensor<?x4xf32>
// CHECK-NOT: optimization_barrier {{.*}}tensor<{{[0-9]*x?}}i32>
// CHECK: return

// A symbolic dimension prints by its name (read from the call to the exported body,
// before inline erases it), with the bytes per unit of it.
// RES: // saved residuals of @main: 2 values, 64 bytes + 16 bytes per unit of b
// RES-NEXT: f32[4,4] from the argument arg0
// RES-NEXT: f32[b,4] from the argument arg1 (16 bytes per unit of b, not counted in the total)
// RES-NEXT: // remark: @main: no op carries JAX's name stack{{.*}}
// RES-NOT: {{.}}

// Inlined in an earlier run, the names are gone: `?`.
// UNNAMED: // saved residuals of @main: 2 values, 64 bytes + 16 bytes per unit of unnamed dynamic dimensions
// UNNAMED-NEXT: f32[4,4] from the argument arg0
// UNNAMED-NEXT: f32[?,4] from the argument arg1 (16 bytes per unit of its dynamic dimensions, not counted in the total)
// UNNAMED-NEXT: // remark: @main: no op carries JAX's name stack{{.*}}
// UNNAMED-NOT: {{.}}

module @symbolic attributes {jax.uses_shape_polymorphism = true, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x4xf32>, %arg1: tensor<?x4xf32>, %arg2: tensor<f32> {remat.cotangent}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<4x4xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<?x4xf32> {jax.result_info = "result[1][1]", remat.gradient}) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %0 = stablehlo.get_dimension_size %arg1, dim = 0 : (tensor<?x4xf32>) -> tensor<i32>
    %1 = stablehlo.compare GE, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.custom_call @shape_assertion(%1, %0) {api_version = 2 : i32, error_message = "Input shapes do not match the polymorphic shapes specification. Expected value >= 1 for dimension variable 'b'. Using the following polymorphic shapes specifications: args[1].shape = (b, 4). Obtained dimension variables: 'b' = {0} from specification 'b' for dimension args[1].shape[0] (= {0}), . Please see https://docs.jax.dev/en/latest/export/shape_poly.html#shape-assertion-errors for more details.", has_side_effect = true} : (tensor<i1>, tensor<i32>) -> ()
    %2:3 = call @_wrapped_jax_export_main(%0, %arg0, %arg1, %arg2) : (tensor<i32>, tensor<4x4xf32>, tensor<?x4xf32>, tensor<f32>) -> (tensor<f32>, tensor<4x4xf32>, tensor<?x4xf32>)
    return %2#0, %2#1, %2#2 : tensor<f32>, tensor<4x4xf32>, tensor<?x4xf32>
  }
  func.func private @_wrapped_jax_export_main(%arg0: tensor<i32> {jax.global_constant = "b"}, %arg1: tensor<4x4xf32>, %arg2: tensor<?x4xf32>, %arg3: tensor<f32>) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<4x4xf32> {jax.result_info = "result[1][0]"}, tensor<?x4xf32> {jax.result_info = "result[1][1]"}) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %c = stablehlo.constant dense<4> : tensor<1xi32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %0 = stablehlo.dot_general %arg2, %arg1, contracting_dims = [1] x [0] : (tensor<?x4xf32>, tensor<4x4xf32>) -> tensor<?x4xf32>
    %1 = stablehlo.sine %0 : tensor<?x4xf32>
    %2 = stablehlo.cosine %0 : tensor<?x4xf32>
    %3 = stablehlo.dot_general %1, %arg1, contracting_dims = [1] x [0] : (tensor<?x4xf32>, tensor<4x4xf32>) -> tensor<?x4xf32>
    %4 = stablehlo.tanh %3 : tensor<?x4xf32>
    %5 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %6 = stablehlo.concatenate %5, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %7 = stablehlo.dynamic_broadcast_in_dim %cst_0, %6, dims = [] : (tensor<f32>, tensor<2xi32>) -> tensor<?x4xf32>
    %8 = stablehlo.subtract %7, %4 : tensor<?x4xf32>
    %9 = stablehlo.reduce(%4 init: %cst) applies stablehlo.add across dimensions = [0, 1] : (tensor<?x4xf32>, tensor<f32>) -> tensor<f32>
    %10 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %11 = stablehlo.concatenate %10, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %12 = stablehlo.dynamic_broadcast_in_dim %arg3, %11, dims = [] : (tensor<f32>, tensor<2xi32>) -> tensor<?x4xf32>
    %13 = stablehlo.multiply %12, %8 : tensor<?x4xf32>
    %14 = stablehlo.multiply %13, %4 : tensor<?x4xf32>
    %15 = stablehlo.add %13, %14 : tensor<?x4xf32>
    %16 = stablehlo.dot_general %15, %1, contracting_dims = [0] x [0] : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<4x4xf32>
    %17 = stablehlo.transpose %16, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %18 = stablehlo.dot_general %15, %arg1, contracting_dims = [1] x [1] : (tensor<?x4xf32>, tensor<4x4xf32>) -> tensor<?x4xf32>
    %19 = stablehlo.multiply %18, %2 : tensor<?x4xf32>
    %20 = stablehlo.dot_general %19, %arg2, contracting_dims = [0] x [0] : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<4x4xf32>
    %21 = stablehlo.transpose %20, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
    %22 = stablehlo.add %17, %21 : tensor<4x4xf32>
    %23 = stablehlo.dot_general %19, %arg1, contracting_dims = [1] x [1] : (tensor<?x4xf32>, tensor<4x4xf32>) -> tensor<?x4xf32>
    return %9, %22, %23 : tensor<f32>, tensor<4x4xf32>, tensor<?x4xf32>
  }
}

