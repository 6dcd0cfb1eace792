// fold-dot-transposes: a matrix product the forward reads through a transpose (a vmapped
// W @ x) is computed with its operands swapped, in the transposed order; the backward's
// reads of it through an optimization barrier and the tie's multiplication by a broadcast
// scalar into the same transpose read the new product, and both transposes go.
// RUN: remat-opt %s --split-input-file --fold-dot-transposes | filecheck %s
// RUN: remat-opt %s --split-input-file --fold-dot-transposes='across-halves=true' | filecheck %s --check-prefix=ACROSS

// The product, rounded (insert-reduce-precision), read by the forward's transpose and by a
// recomputation behind a barrier and a tie.
// CHECK-LABEL: module @saved
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1] : (tensor<16x4xf32>, tensor<8x4xf32>) -> tensor<16x8xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m23 : tensor<16x8xf32>
// CHECK-NEXT: %[[F:.*]] = stablehlo.tanh %[[R]] : tensor<16x8xf32>
// CHECK: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[R]], %arg2 : tensor<16x8xf32>, tensor<16x8xf32>
// CHECK: %[[S:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<16x8xf32>
// CHECK-NEXT: %[[T:.*]] = stablehlo.multiply %[[B]]#0, %[[S]] : tensor<16x8xf32>
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[T]] : tensor<16x8xf32>
// CHECK-NOT: stablehlo.transpose
// CHECK: return
module @saved {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>, %arg2: tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.reduce_precision %0, format = e8m23 : tensor<8x16xf32>
  %2 = stablehlo.transpose %1, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %3 = stablehlo.tanh %2 : tensor<16x8xf32>
  %4:2 = stablehlo.optimization_barrier %1, %arg2 : tensor<8x16xf32>, tensor<16x8xf32>
  %5 = stablehlo.slice %4#1 [0:1, 0:1] : (tensor<16x8xf32>) -> tensor<1x1xf32>
  %6 = stablehlo.reshape %5 : (tensor<1x1xf32>) -> tensor<f32>
  %7 = stablehlo.sqrt %6 : tensor<f32>
  %8 = stablehlo.broadcast_in_dim %7, dims = [] : (tensor<f32>) -> tensor<8x16xf32>
  %9 = stablehlo.multiply %4#0, %8 : tensor<8x16xf32>
  %10 = stablehlo.transpose %9, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %11 = stablehlo.cosine %10 : tensor<16x8xf32>
  return %3, %11 : tensor<16x8xf32>, tensor<16x8xf32>
}
}

// -----

// With batch dimensions: they stay first, the free dimensions of the two operands swap.
// CHECK-LABEL: module @batched
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg1, %arg0, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x16x4xf32>, tensor<2x8x4xf32>) -> tensor<2x16x8xf32>
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[P]], %arg2 : tensor<2x16x8xf32>, tensor<f32>
// CHECK-NEXT: return %[[P]], %[[B]]#0
module @batched {
func.func @main(%arg0: tensor<2x8x4xf32>, %arg1: tensor<2x16x4xf32>, %arg2: tensor<f32>) -> (tensor<2x16x8xf32>, tensor<2x16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x8x4xf32>, tensor<2x16x4xf32>) -> tensor<2x8x16xf32>
  %1 = stablehlo.transpose %0, dims = [0, 2, 1] : (tensor<2x8x16xf32>) -> tensor<2x16x8xf32>
  %2:2 = stablehlo.optimization_barrier %0, %arg2 : tensor<2x8x16xf32>, tensor<f32>
  %3 = stablehlo.transpose %2#0, dims = [0, 2, 1] : (tensor<2x8x16xf32>) -> tensor<2x16x8xf32>
  return %1, %3 : tensor<2x16x8xf32>, tensor<2x16x8xf32>
}
}

// -----

// Left as they are: a product the function also returns (a split forward's residual:
// folding would move the transpose into the forward, not remove it), a transpose that is
// not the operand swap (the batch dimension moved), and a product the transpose alone
// reads (XLA folds that one itself).
// CHECK-LABEL: module @kept
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1]
// CHECK-NEXT: stablehlo.transpose %[[P]], dims = [1, 0]
// CHECK: %[[Q:.*]] = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0]
// CHECK-NEXT: stablehlo.transpose %[[Q]], dims = [1, 0, 2]
// CHECK: %[[R:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1]
// CHECK-NEXT: stablehlo.transpose %[[R]], dims = [1, 0]
module @kept {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>, %arg2: tensor<2x8x4xf32>, %arg3: tensor<2x16x4xf32>) -> (tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x2x16xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2 = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x8x4xf32>, tensor<2x16x4xf32>) -> tensor<2x8x16xf32>
  %3 = stablehlo.transpose %2, dims = [1, 0, 2] : (tensor<2x8x16xf32>) -> tensor<8x2x16xf32>
  %4 = stablehlo.optimization_barrier %2 : tensor<2x8x16xf32>
  %5 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %6 = stablehlo.transpose %5, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return %1, %0, %3, %6 : tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x2x16xf32>, tensor<16x8xf32>
}
}

// -----

// A barrier that takes the product twice is made again once.
// CHECK-LABEL: module @twice
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg1, %arg0
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[P]], %[[P]] : tensor<16x8xf32>, tensor<16x8xf32>
// CHECK-NEXT: %[[S:.*]] = stablehlo.add %[[B]]#0, %[[B]]#1
// CHECK-NEXT: return %[[P]], %[[S]]
module @twice {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2:2 = stablehlo.optimization_barrier %0, %0 : tensor<8x16xf32>, tensor<8x16xf32>
  %3 = stablehlo.transpose %2#0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %4 = stablehlo.transpose %2#1, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %5 = stablehlo.add %3, %4 : tensor<16x8xf32>
  return %1, %5 : tensor<16x8xf32>, tensor<16x8xf32>
}
}

// -----

// The precision of each operand goes with it.
// CHECK-LABEL: module @precision
// CHECK: stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1], precision = [HIGHEST, DEFAULT]
module @precision {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1], precision = [DEFAULT, HIGHEST] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2 = stablehlo.optimization_barrier %0 : tensor<8x16xf32>
  %3 = stablehlo.transpose %2, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return %1, %3 : tensor<16x8xf32>, tensor<16x8xf32>
}
}

// -----

// A product with a sharding, which names its dimensions in order, is left as written.
// CHECK-LABEL: module @sharded
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: stablehlo.transpose %[[P]]
module @sharded {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2 = stablehlo.optimization_barrier %0 : tensor<8x16xf32>
  %3 = stablehlo.transpose %2, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return %1, %3 : tensor<16x8xf32>, tensor<16x8xf32>
}
}

// -----

// Split form: the forward returns the rounded product as a residual, which the backward
// reads through a barrier and the tie into the same transpose. Left as it is by default
// (the residual keeps JAX's shape); with across-halves=true the forward returns the
// product swapped, the backward's argument takes that type and its transpose goes. The
// second product, which the backward slices, is left as it is either way.
// CHECK-LABEL: module @halves
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1]
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]]
// CHECK-NEXT: stablehlo.transpose %[[R]], dims = [1, 0]
// CHECK: func.func @main_bwd(%arg0: tensor<8x16xf32>
// CHECK: stablehlo.transpose
// ACROSS-LABEL: module @halves
// ACROSS: func.func @main_fwd(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32> {remat.residual = "f32[16,8] transpose of f32[8,16] output of dot_general"}, tensor<8x16xf32> {remat.residual = "f32[8,16] output of dot_general (the second)"})
// ACROSS: %[[P:.*]] = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1] : (tensor<16x4xf32>, tensor<8x4xf32>) -> tensor<16x8xf32>
// ACROSS-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m23 : tensor<16x8xf32>
// ACROSS-NEXT: %[[F:.*]] = stablehlo.tanh %[[R]] : tensor<16x8xf32>
// ACROSS-NEXT: %[[Q:.*]] = stablehlo.dot_general %arg0, %arg1
// ACROSS-NEXT: %[[G:.*]] = stablehlo.transpose %[[Q]], dims = [1, 0]
// ACROSS: return %{{.*}}, %[[R]], %[[Q]]
// ACROSS: func.func @main_bwd(%arg0: tensor<16x8xf32>, %arg1: tensor<8x16xf32>, %arg2: tensor<16x8xf32>)
// ACROSS-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %arg0, %arg2 : tensor<16x8xf32>, tensor<16x8xf32>
// ACROSS: %[[S:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<16x8xf32>
// ACROSS-NEXT: %[[T:.*]] = stablehlo.multiply %[[B]]#0, %[[S]] : tensor<16x8xf32>
// ACROSS-NEXT: %[[C:.*]] = stablehlo.cosine %[[T]] : tensor<16x8xf32>
// ACROSS-NOT: stablehlo.transpose
// ACROSS: return %[[C]]
module @halves {
func.func @main_fwd(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<8x16xf32> {remat.residual = "f32[8,16] output of dot_general"}, tensor<8x16xf32> {remat.residual = "f32[8,16] output of dot_general (the second)"}) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.reduce_precision %0, format = e8m23 : tensor<8x16xf32>
  %2 = stablehlo.transpose %1, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %3 = stablehlo.tanh %2 : tensor<16x8xf32>
  %4 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %5 = stablehlo.transpose %4, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %6 = stablehlo.add %3, %5 : tensor<16x8xf32>
  return %6, %1, %4 : tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x16xf32>
}
func.func @main_bwd(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>, %arg2: tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<8x1xf32>) {
  %0:2 = stablehlo.optimization_barrier %arg0, %arg2 : tensor<8x16xf32>, tensor<16x8xf32>
  %1 = stablehlo.slice %0#1 [0:1, 0:1] : (tensor<16x8xf32>) -> tensor<1x1xf32>
  %2 = stablehlo.reshape %1 : (tensor<1x1xf32>) -> tensor<f32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [] : (tensor<f32>) -> tensor<8x16xf32>
  %4 = stablehlo.multiply %0#0, %3 : tensor<8x16xf32>
  %5 = stablehlo.transpose %4, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %6 = stablehlo.cosine %5 : tensor<16x8xf32>
  %7 = stablehlo.slice %arg1 [0:8, 0:1] : (tensor<8x16xf32>) -> tensor<8x1xf32>
  return %6, %7 : tensor<16x8xf32>, tensor<8x1xf32>
}
}

// -----

// Left as written with across-halves=true: the forward also reads the product in its own
// order (the exponential), so its transposes stay, and so does the backward's.
// ACROSS-LABEL: module @halves_kept
// ACROSS: func.func @main_fwd(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x16xf32> {remat.residual = "f32[8,16] output of dot_general"})
// ACROSS-NEXT: %[[P:.*]] = stablehlo.dot_general %arg0, %arg1
// ACROSS-NEXT: stablehlo.transpose %[[P]], dims = [1, 0]
// ACROSS-NEXT: stablehlo.exponential %[[P]]
// ACROSS: func.func @main_bwd(%arg0: tensor<8x16xf32>) -> tensor<16x8xf32>
// ACROSS-NEXT: stablehlo.transpose %arg0, dims = [1, 0]
module @halves_kept {
func.func @main_fwd(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x16xf32> {remat.residual = "f32[8,16] output of dot_general"}) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2 = stablehlo.exponential %0 : tensor<8x16xf32>
  return %1, %2, %0 : tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x16xf32>
}
func.func @main_bwd(%arg0: tensor<8x16xf32>) -> tensor<16x8xf32> {
  %0 = stablehlo.transpose %arg0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return %0 : tensor<16x8xf32>
}
}
